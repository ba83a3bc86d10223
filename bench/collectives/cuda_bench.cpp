// plexus-bench-cuda: allreduce of CUDA device buffers against the same allreduce of host buffers,
// per transport, process count and size, so that the cost of device memory (the staging through
// pinned host memory, the copies and the synchronisation) is a measured ratio. Each rank process
// uses GPU (rank % device count). Per point: the median of --runs runs (each the mean of several
// calls, the slowest rank's), the bus bandwidth, and the number of wrong elements of a checked
// call (device results are copied back and compared with the exact sum). JSON lines with --json.
//
//   plexus-bench-cuda --transport shm,tcp --np 2 --sizes 64K,1M,16M,64M --runs 5 --json
//
// The peer for device buffers is torch.distributed's Gloo backend on CUDA tensors:
// bench/collectives/cuda_torch_peer.py prints the same figures (needs a torch with CUDA). Built
// only in CUDA builds (bench/collectives/CMakeLists.txt).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_common.hpp"
#include "driver.hpp"
#include "plexus/base/env.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/memory.hpp"
#include "plexus/transport/rendezvous.hpp"

#include <cuda_runtime_api.h>

namespace pb = plexus::bench;
namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace tooling = plexus::tooling;

namespace {

constexpr char kProgram[] = "plexus-bench-cuda";
constexpr char kBench[] = "collectives_cuda";

[[noreturn]] void Die(const std::string& what, const std::string& why) {
  std::fprintf(stderr, "%s worker: %s: %s\n", kProgram, what.c_str(), why.c_str());
  std::exit(1);
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(what, cudaGetErrorString(e));
}

// One rank's buffers of one size: the input and output on the device and on the host, and the
// host copy of the input pattern (bench_common's, exact in f32 for any rank count).
struct Buffers {
  size_t count = 0;
  std::vector<float> host_in, host_out;
  float* device_in = nullptr;
  float* device_out = nullptr;
  Buffers(size_t n, int rank) : count(n), host_in(n), host_out(n) {
    pb::FillInput(host_in.data(), n, rank);
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&device_in), n * sizeof(float)), "cudaMalloc");
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&device_out), n * sizeof(float)), "cudaMalloc");
    CheckCuda(cudaMemcpy(device_in, host_in.data(), n * sizeof(float), cudaMemcpyHostToDevice),
              "cudaMemcpy of the input");
  }
  ~Buffers() {
    cudaFree(device_in);
    cudaFree(device_out);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

int WorkerMain(int argc, char** argv) {
  const pb::DriverOptions args = pb::ParseWorkerArgs(argc, argv);
  const std::string& transport = args.transports;
  const std::string& sizes_text = args.sizes;
  const int runs = args.runs;
  auto backend = pt::ParseBackend(transport);
  if (!backend.ok()) Die("--transport", std::string(backend.status().message()));
  std::string why;
  if (!pt::CudaAvailable(&why)) Die("CUDA", why);
  auto rendezvous = pt::Rendezvous::FromEnv(absl::Minutes(2));
  if (!rendezvous.ok()) Die("rendezvous", std::string(rendezvous.status().message()));
  pc::CommunicatorOptions options;
  options.device.backend = *backend;
  options.transport_policy = pc::TransportPolicy::kUniform;  // measure the backend named
  if (*backend == pt::Backend::kTcp) options.device.local_address = "127.0.0.1";
  auto created = pc::Communicator::Create(*rendezvous, options);
  if (!created.ok()) Die("Communicator::Create", std::string(created.status().message()));
  std::unique_ptr<pc::Communicator> comm = std::move(*created);
  const int rank = comm->rank(), n = comm->size();
  int devices = 0;
  CheckCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  CheckCuda(cudaSetDevice(rank % devices), "cudaSetDevice");

  auto max_over_ranks = [&](double v) {
    double out = 0;
    absl::Status s = comm->AllReduce(&v, &out, 1, pc::DataType::kF64, pc::ReduceOp::kMax);
    if (!s.ok()) Die("AllReduce of the figures", std::string(s.message()));
    return out;
  };
  const std::vector<std::string> size_list = absl::StrSplit(sizes_text, ',', absl::SkipEmpty());
  for (const std::string& size_text : size_list) {
    auto bytes = plexus::base::ParseBytes(size_text, "--sizes");
    if (!bytes.ok()) Die("--sizes", std::string(bytes.status().message()));
    const size_t count = std::max<size_t>(*bytes / sizeof(float), 1);
    Buffers b(count, rank);
    struct Variant {
      const char* memory;
      std::function<absl::Status()> run;
      std::function<size_t()> wrong;  // after one run: elements that differ from the exact sum
    };
    const Variant variants[] = {
        {"host",
         [&] {
           return comm->AllReduce(b.host_in.data(), b.host_out.data(), count, pc::DataType::kF32,
                                  pc::ReduceOp::kSum);
         },
         [&] { return pb::CountWrong(b.host_out.data(), count, n); }},
        {"cuda",
         [&] {
           return comm->AllReduce(b.device_in, b.device_out, count, pc::DataType::kF32,
                                  pc::ReduceOp::kSum);
         },
         [&] {
           std::vector<float> back(count);
           CheckCuda(
               cudaMemcpy(back.data(), b.device_out, count * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy of the result");
           return pb::CountWrong(back.data(), count, n);
         }},
    };
    const int iters = pb::IterationsFor(count * sizeof(float), 0);
    for (const Variant& v : variants) {
      // Warm-up and check: the result of one call, compared element by element.
      if (absl::Status s = v.run(); !s.ok()) Die(v.memory, std::string(s.message()));
      const double wrong = max_over_ranks(static_cast<double>(v.wrong()));
      std::vector<double> times;
      for (int run = 0; run < runs; ++run) {
        if (absl::Status s = comm->Barrier(); !s.ok()) Die("Barrier", std::string(s.message()));
        const absl::Time start = absl::Now();
        for (int k = 0; k < iters; ++k) {
          if (absl::Status s = v.run(); !s.ok()) Die(v.memory, std::string(s.message()));
        }
        times.push_back(max_over_ranks(absl::ToDoubleMicroseconds(absl::Now() - start) / iters));
      }
      std::sort(times.begin(), times.end());
      if (rank == 0) {
        const double median = times[times.size() / 2];
        const size_t size = count * sizeof(float);
        tooling::Figure f;
        f.figure = "allreduce_time";
        f.value = median;
        f.unit = "us";
        f.extra = {{"impl", "plexus"},
                   {"memory", v.memory},
                   {"transport", transport},
                   {"np", n},
                   {"bytes", size},
                   {"runs", runs},
                   {"iters", iters},
                   {"min", times.front()},
                   {"max", times.back()},
                   {"busbw_gbs", static_cast<double>(size) * pb::BusFactor(pb::Op::kAllreduce, n) /
                                     median / 1e3},
                   {"wrong", wrong}};
        std::printf("%s\n", tooling::FigureJson(kBench, f).dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

// Device/host time ratios per (transport, np, bytes), from the collected figures.
void AddRatios(tooling::FigureWriter& writer) {
  const std::vector<tooling::Figure> figures = writer.figures();
  for (const tooling::Figure& cuda : figures) {
    if (cuda.figure != "allreduce_time" || cuda.extra.value("memory", "") != "cuda") continue;
    for (const tooling::Figure& host : figures) {
      if (host.figure != "allreduce_time" || host.extra.value("memory", "") != "host" ||
          host.extra["transport"] != cuda.extra["transport"] ||
          host.extra["np"] != cuda.extra["np"] || host.extra["bytes"] != cuda.extra["bytes"]) {
        continue;
      }
      tooling::Figure r;
      r.figure = "cuda_over_host_time";
      r.value = cuda.value / host.value;
      r.unit = "ratio";
      r.extra = {{"transport", cuda.extra["transport"]},
                 {"np", cuda.extra["np"]},
                 {"bytes", cuda.extra["bytes"]}};
      writer.Add(r);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return WorkerMain(argc - 1, argv + 1);
  tooling::Tool tool(kProgram,
                     "Allreduce of CUDA device buffers against the same allreduce of host "
                     "buffers (f32 sum), per transport, process count and size.");
  pb::DriverOptions options;
  options.sizes = "64K,1M,16M,64M";
  pb::AddDriverFlags(tool, &options, 1);
  if (auto code = tool.Parse(argc, argv)) return *code;
  // Exit 77 (skipped, as the tests do) where there is nothing to measure: `make bench` goes on.
  std::string why;
  if (!pt::CudaAvailable(&why)) {
    std::fprintf(stderr, "%s: skipped: no usable GPU: %s\n", kProgram, why.c_str());
    return 77;
  }

  tooling::FigureWriter writer(kBench, options.json);
  if (absl::Status s = pb::RunWorkersPerTransport(options, kProgram, writer); !s.ok()) {
    return tool.Fail(s);
  }
  AddRatios(writer);
  if (!options.json) writer.PrintTable();
  return 0;
}
