// plexus-bench-cast: an f32 allreduce that travels as bf16 with the cast fused into the ring's
// steps (CallOptions::wire_dtype), against doing the cast in separate passes (f32 -> bf16
// buffer, a plain bf16 allreduce, which accumulates in bf16, bf16 -> f32) and against the plain
// f32 allreduce. Per transport, size and variant: the median time of --runs runs (each the mean
// of several calls, the slowest rank's) and the largest error against an f64 reference, as a
// fraction of sum_r |x_r| (the scale of the documented bound). JSON lines with --json.
//
//   plexus-bench-cast --transport shm,tcp --np 2 --sizes 1M,4M,16M,64M --runs 5 --json
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "driver.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/env.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pb = plexus::bench;
namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace tooling = plexus::tooling;

namespace {

constexpr char kProgram[] = "plexus-bench-cast";
constexpr char kBench[] = "collectives_cast";

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s worker: %s: %s\n", kProgram, what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// Rank r's operand: values of mixed magnitude and sign, so that the sums round.
float Input(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u + static_cast<uint32_t>(rank) * 40503u);
  return (static_cast<float>(h % 20011) - 10005.0f) / 997.0f;
}

struct Worker {
  std::unique_ptr<pc::Communicator> comm;
  int runs = 5;

  double Max(double v) {
    double out = 0;
    if (absl::Status s = comm->AllReduce(&v, &out, 1, pc::DataType::kF64, pc::ReduceOp::kMax);
        !s.ok()) {
      Die("AllReduce of the figures", s);
    }
    return out;
  }
  void Barrier() {
    if (absl::Status s = comm->Barrier(); !s.ok()) Die("Barrier", s);
  }
};

int WorkerMain(int argc, char** argv) {
  const pb::DriverOptions args = pb::ParseWorkerArgs(argc, argv);
  const std::string& transport = args.transports;
  const std::string& sizes_text = args.sizes;
  const int runs = args.runs;
  auto backend = pt::ParseBackend(transport);
  if (!backend.ok()) Die("--transport", backend.status());
  auto rendezvous = pt::Rendezvous::FromEnv(absl::Minutes(2));
  if (!rendezvous.ok()) Die("rendezvous", rendezvous.status());
  pc::CommunicatorOptions options;
  options.device.backend = *backend;
  options.transport_policy = pc::TransportPolicy::kUniform;  // measure the backend named
  if (*backend == pt::Backend::kTcp) options.device.local_address = "127.0.0.1";
  auto comm = pc::Communicator::Create(*rendezvous, options);
  if (!comm.ok()) Die("Communicator::Create", comm.status());
  Worker w{std::move(*comm), runs};
  const int rank = w.comm->rank(), n = w.comm->size();

  const std::vector<std::string> size_list = absl::StrSplit(sizes_text, ',', absl::SkipEmpty());
  for (const std::string& size_text : size_list) {
    auto bytes = plexus::base::ParseBytes(size_text, "--sizes");
    if (!bytes.ok()) Die("--sizes", bytes.status());
    const size_t count = *bytes / 4;
    std::vector<float> in(count), out(count);
    std::vector<uint16_t> in16(count), out16(count);
    for (size_t i = 0; i < count; ++i) in[i] = Input(rank, i);
    pc::CallOptions ring;
    ring.algorithm = pc::Algorithm::kRing;
    pc::CallOptions fused = ring;
    fused.wire_dtype = pc::DataType::kBF16;
    struct Variant {
      const char* name;
      std::function<void()> run;
    };
    const Variant variants[] = {
        {"f32",
         [&] {
           if (absl::Status s = w.comm->AllReduce(in.data(), out.data(), count, pc::DataType::kF32,
                                                  pc::ReduceOp::kSum, ring);
               !s.ok()) {
             Die("f32 allreduce", s);
           }
         }},
        {"fused_bf16_wire",
         [&] {
           if (absl::Status s = w.comm->AllReduce(in.data(), out.data(), count, pc::DataType::kF32,
                                                  pc::ReduceOp::kSum, fused);
               !s.ok()) {
             Die("fused allreduce", s);
           }
         }},
        {"cast_pass_bf16",
         [&] {
           // The same AVX2 conversion kernels, as separate passes over the whole buffer.
           plexus::kernels::PackWire(pc::DataType::kBF16, in16.data(), in.data(), count, nullptr);
           if (absl::Status s = w.comm->AllReduce(in16.data(), out16.data(), count,
                                                  pc::DataType::kBF16, pc::ReduceOp::kSum, ring);
               !s.ok()) {
             Die("bf16 allreduce", s);
           }
           plexus::kernels::UnpackWire(pc::DataType::kBF16, out.data(), out16.data(), count);
         }},
    };
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / *bytes, 2, 50));
    for (const Variant& v : variants) {
      v.run();  // warm-up (and the result checked below)
      // Error against an f64 reference, as a fraction of sum_r |x_r|.
      double worst = 0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, scale = 0;
        for (int r = 0; r < n; ++r) {
          exact += Input(r, i);
          scale += std::fabs(Input(r, i));
        }
        if (scale > 0) worst = std::max(worst, std::fabs(out[i] - exact) / scale);
      }
      worst = w.Max(worst);
      std::vector<double> times;
      for (int run = 0; run < w.runs; ++run) {
        w.Barrier();
        const absl::Time start = absl::Now();
        for (int k = 0; k < iters; ++k) v.run();
        times.push_back(w.Max(absl::ToDoubleMilliseconds(absl::Now() - start) / iters));
      }
      std::sort(times.begin(), times.end());
      if (rank == 0) {
        const double median = times[times.size() / 2];
        tooling::Figure f;
        f.figure = "allreduce_time";
        f.value = median;
        f.unit = "ms";
        f.extra = {{"variant", v.name},
                   {"transport", transport},
                   {"np", n},
                   {"size", *bytes},
                   {"runs", w.runs},
                   {"iters", iters},
                   {"min", times.front()},
                   {"max", times.back()},
                   {"busbw_gbs", static_cast<double>(*bytes) * 2 * (n - 1) / n / median / 1e6},
                   {"max_err_rel_abs_sum", worst}};
        std::printf("%s\n", tooling::FigureJson(kBench, f).dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return WorkerMain(argc - 1, argv + 1);
  tooling::Tool tool(kProgram,
                     "Fused-cast allreduce (f32 data, bf16 on the wire) against a separate cast "
                     "pass plus a bf16 allreduce, and the plain f32 allreduce.");
  pb::DriverOptions options;
  options.sizes = "1M,4M,16M,64M";
  pb::AddDriverFlags(tool, &options, 2);
  if (auto code = tool.Parse(argc, argv)) return *code;

  tooling::FigureWriter writer(kBench, options.json);
  if (absl::Status s = pb::RunWorkersPerTransport(options, kProgram, writer); !s.ok()) {
    return tool.Fail(s);
  }
  if (!options.json) writer.PrintTable();
  return 0;
}
