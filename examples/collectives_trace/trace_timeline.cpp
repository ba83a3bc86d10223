// A traced imitation of data-parallel training steps, to see on a timeline where ranks wait for
// each other: every step each rank "computes" (sleeps 10 ms; rank 1 30 ms), then
// allreduces its gradients in two buckets (asynchronously, the second issued while the first
// runs), allgathers a small vector of metrics, and every fourth step broadcasts parameters from
// rank 0. The communicator writes its trace (Chrome trace-event format) at destruction.
//
//   build/tools/plexus-run -n 4 build/examples/trace_timeline /tmp/steps
//   tools/plot/plexus-plot timeline /tmp/steps.*.json -o steps.png
//
// The first argument is the trace path prefix (<prefix>.<rank>.json); without it,
// PLEXUS_COLL_TRACE decides (and without that nothing is written).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/trace.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "trace_timeline: %s: %s\n", what, std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int kSteps = 8;
  constexpr size_t kBucket = size_t{1} << 18;  // floats per gradient bucket (1 MiB)
  pc::CommunicatorOptions options;
  options.device.backend = pt::Backend::kShm;
  options.trace.enabled = true;
  if (argc > 1) options.trace.path_prefix = argv[1];
  auto rendezvous = pt::Rendezvous::FromEnv();
  if (!rendezvous.ok()) return Fail("rendezvous", rendezvous.status());
  auto created = pc::Communicator::Create(*rendezvous, options);
  if (!created.ok()) return Fail("create", created.status());
  pc::Communicator& comm = **created;
  const int rank = comm.rank();
  std::vector<float> grad_a(kBucket, 1.0f), grad_b(kBucket, 1.0f), params(kBucket / 4, 0.5f);
  std::vector<float> metric(4, static_cast<float>(rank)), metrics(4 * comm.size());
  for (int step = 0; step < kSteps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rank == 1 ? 30 : 10));
    auto a = comm.AllReduceAsync(grad_a.data(), grad_a.data(), kBucket, pc::DataType::kF32,
                                 pc::ReduceOp::kAvg);
    auto b = comm.AllReduceAsync(grad_b.data(), grad_b.data(), kBucket, pc::DataType::kF32,
                                 pc::ReduceOp::kAvg);
    if (absl::Status s = a->Wait(); !s.ok()) return Fail("allreduce", s);
    if (absl::Status s = b->Wait(); !s.ok()) return Fail("allreduce", s);
    if (absl::Status s = comm.AllGather(metric.data(), metrics.data(), 4, pc::DataType::kF32);
        !s.ok()) {
      return Fail("allgather", s);
    }
    if (step % 4 == 3) {
      if (absl::Status s =
              comm.Broadcast(params.data(), params.data(), params.size(), pc::DataType::kF32, 0);
          !s.ok()) {
        return Fail("broadcast", s);
      }
    }
  }
  const pc::CollectiveTrace trace = comm.Trace();
  std::printf(
      "rank %d: %zu calls traced (%llu dropped)%s%s\n", rank, trace.events.size(),
      static_cast<unsigned long long>(trace.dropped),
      comm.options().trace.path_prefix.empty() ? "" : ", to be written at exit to ",
      comm.options().trace.path_prefix.empty()
          ? ""
          : (comm.options().trace.path_prefix + "." + std::to_string(rank) + ".json").c_str());
  return 0;
}
