// plexus-bench-collectives: allreduce, broadcast, allgather, reduce-scatter and alltoall (f32,
// sum) of plexus::collectives between local processes, in the nccl-tests output format,
// optionally side by side with Gloo and Open MPI measured in the same invocation.
//
//   plexus-bench-collectives [--np 2[,4]] [--transport tcp[,shm]] [--compare] [--sizes
//   8,64K,256K,1M,4M,16M,64M]
//       [--ops allreduce|LIST|all] [--iters N] [--warmup N] [--runs R] [--json]
//       [--algorithm auto|ring|hd|tree] ...
//
// The program launches its own ranks: it starts N copies of itself (with the PLEXUS_* variables
// of plexus-run), the Gloo peer program N times the same way, and the Open MPI peer program
// under mpirun. Rank 0 of each launch reports one JSON line per size; this process gathers
// them, takes the median over --runs launches and prints the table (or JSON lines).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "collectives_grid.hpp"
#include "collectives_report.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/types.hpp"
#include "reconfig_bench.hpp"

namespace {

namespace pb = plexus::bench;
namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace pt_tooling = plexus::tooling;
constexpr const char* kProgram = pb::kCollectivesProgram;

// ---- Plexus worker (one rank) -------------------------------------------------------------

[[noreturn]] void WorkerDie(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s worker: %s: %s\n", kProgram, what.c_str(),
               std::string(status.ToString()).c_str());
  std::exit(1);
}

class PlexusCollectives : public pb::CollectiveUnderTest {
 public:
  PlexusCollectives(std::unique_ptr<pc::Communicator> comm, pc::Algorithm algorithm)
      : comm_(std::move(comm)) {
    call_.algorithm = algorithm;
  }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }
  bool Supports(pb::Op) const override { return true; }

  void Prepare(pb::OpBuffers& buffers) override { buffers_ = &buffers; }
  void Run() override {
    float* send = buffers_->send();
    float* recv = buffers_->recv();
    const size_t count = buffers_->shape().count;
    constexpr pc::DataType kF32 = pc::DataType::kF32;
    absl::Status s;
    switch (buffers_->op()) {
      case pb::Op::kAllreduce:
        s = comm_->AllReduce(send, recv, count, kF32, pc::ReduceOp::kSum, call_);
        break;
      case pb::Op::kReduce:
        s = comm_->Reduce(send, recv, count, kF32, pc::ReduceOp::kSum, /*root=*/0, call_);
        break;
      case pb::Op::kBroadcast:  // in place, as MPI_Bcast
        s = comm_->Broadcast(recv, recv, count, kF32, /*root=*/0, call_);
        break;
      case pb::Op::kAllgather:
        s = comm_->AllGather(send, recv, count, kF32, call_);
        break;
      case pb::Op::kReduceScatter:
        s = comm_->ReduceScatter(send, recv, count, kF32, pc::ReduceOp::kSum, call_);
        break;
      case pb::Op::kAlltoall:
        s = comm_->AllToAll(send, recv, count, kF32, call_);
        break;
    }
    if (!s.ok()) WorkerDie(fmt::format("{} of {} floats", pb::OpName(buffers_->op()), count), s);
  }
  void Barrier() override {
    const absl::Status s = comm_->Barrier();
    if (!s.ok()) WorkerDie("Barrier", s);
  }
  double Max(double value) override { return Reduce(value, pc::ReduceOp::kMax); }
  double Sum(double value) override { return Reduce(value, pc::ReduceOp::kSum); }

 private:
  double Reduce(double value, pc::ReduceOp op) {
    double result = 0;
    const absl::Status s = comm_->AllReduce(&value, &result, 1, pc::DataType::kF64, op);
    if (!s.ok()) WorkerDie("AllReduce of the figures", s);
    return result;
  }

  std::unique_ptr<pc::Communicator> comm_;
  pc::CallOptions call_;
  pb::OpBuffers* buffers_ = nullptr;
};

// The rendezvous must outlive the communicator (rank 0's serves the store it uses).
pt::Rendezvous WorkerRendezvous() {
  auto rendezvous = pt::Rendezvous::FromEnv(absl::Minutes(2));
  if (!rendezvous.ok()) WorkerDie("rendezvous", rendezvous.status());
  return *std::move(rendezvous);
}

std::unique_ptr<pc::Communicator> MakeWorkerCommunicator(const pb::WorkerOptions& options,
                                                         pt::Rendezvous& rendezvous) {
  auto backend = pt::ParseBackend(options.transport);
  if (!backend.ok()) WorkerDie("--transport", backend.status());
  pc::CommunicatorOptions comm_options;
  comm_options.device.backend = *backend;
  comm_options.transport_policy = pc::TransportPolicy::kUniform;  // measure the backend named
  if (*backend == pt::Backend::kTcp) comm_options.device.local_address = "127.0.0.1";
  comm_options.channels = options.channels;
  comm_options.chunk_bytes = options.chunk_bytes;
  if (options.sockets > 0) comm_options.device.tcp.sockets_per_connection = options.sockets;
  if (!options.loopback_cc.empty()) {
    comm_options.device.tcp.loopback_congestion_control =
        options.loopback_cc == "system" ? std::string() : options.loopback_cc;
  }
  if (options.progress == "thread") comm_options.device.progress = pt::ProgressMode::kThread;
  if (options.progress == "caller") comm_options.device.progress = pt::ProgressMode::kCaller;
  comm_options.trace.enabled = options.trace;
  auto comm = pc::Communicator::Create(rendezvous, comm_options);
  if (!comm.ok()) WorkerDie("Communicator::Create", comm.status());
  return *std::move(comm);
}

int WorkerMain(int argc, char** argv) {
  const pb::WorkerOptions options = pb::ParseWorkerOptions(argc, argv, kProgram);
  auto algorithm =
      pc::ParseAlgorithm(options.algorithm.empty() ? std::string("auto") : options.algorithm);
  if (!algorithm.ok()) WorkerDie("--algorithm", algorithm.status());
  pt::Rendezvous rendezvous = WorkerRendezvous();
  PlexusCollectives impl(MakeWorkerCommunicator(options, rendezvous), *algorithm);
  pb::MeasureOps(impl, options, [](pb::Op) { return std::string("plexus"); });
  return 0;
}

// --reconfig: what a live reconfiguration adds to the allreduce it lands on.
int ReconfigWorkerMain(int argc, char** argv) {
  const pb::WorkerOptions options = pb::ParseWorkerOptions(argc, argv, kProgram);
  pt::Rendezvous rendezvous = WorkerRendezvous();
  pb::MeasureReconfiguration(*MakeWorkerCommunicator(options, rendezvous), options);
  return 0;
}
// --reconfig: one launch per transport, process count and run; every point as a JSON line.
int RunReconfig(const pb::GridOptions& o) {
  bool all_ok = true;
  for (int run = 0; run < o.runs; ++run) {
    for (const std::string& transport : o.transports) {
      for (int n : o.nprocs) {
        pb::Job job{"plexus",
                    transport,
                    n,
                    true,
                    {pb::Op::kAllreduce},
                    {pb::SelfPath(), "--reconfig-worker"},
                    n,
                    ""};
        const std::vector<std::string> args = pb::WorkerArgs(o, transport, job.ops);
        job.argv.insert(job.argv.end(), args.begin(), args.end());
        if (o.channels > 0) {
          job.argv.insert(job.argv.end(), {"--channels", std::to_string(o.channels)});
        }
        if (!o.progress.empty()) job.argv.insert(job.argv.end(), {"--progress", o.progress});
        job.argv.insert(job.argv.end(), {"--reconfig-change", o.reconfig_change});
        pb::LaunchResult r = pb::Launch(job, o.timeout_s, o.bind_core);
        if (!r.ok || r.points.size() != o.size_list.size()) {
          std::fprintf(stderr, "# reconfig run %d over %s, %d processes failed: %s\n", run + 1,
                       transport.c_str(), n, r.ok ? "missing sizes" : r.error.c_str());
          all_ok = false;
        }
        for (nlohmann::json& j : r.points) {
          j["run"] = run;
          all_ok = all_ok && j.value("wrong", uint64_t{1}) == 0;
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return WorkerMain(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "--reconfig-worker") {
    return ReconfigWorkerMain(argc - 1, argv + 1);
  }
  pb::GridOptions options;
  if (auto code = pb::ParseGridOptions(argc, argv, options)) return *code;
  const pb::GridOptions& o = options;
  signal(SIGPIPE, SIG_IGN);
  if (o.reconfig) return RunReconfig(o);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const std::string load_at_start = pb::LoadAverage();

  std::vector<pb::Job> jobs = pb::PlanJobs(o);
  pb::Samples samples;
  pb::Failures failures;
  for (const pb::Job& job : jobs) {
    if (!job.unavailable.empty()) {
      std::fprintf(stderr, "# peer unavailable: %s (%s, %d processes): %s\n", job.impl.c_str(),
                   job.transport.c_str(), job.nprocs, job.unavailable.c_str());
    }
  }
  const bool launched = pb::RunGrid(o, jobs, &samples, &failures);
  const bool right = pb::PrintReport(o, jobs, samples, failures, cpus, load_at_start);
  return launched && right ? 0 : 1;
}
