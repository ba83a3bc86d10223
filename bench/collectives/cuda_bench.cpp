// plexus-bench-cuda: allreduce, broadcast and allgather of CUDA device buffers, device to device
// (peer access, the default on one host) and staged through pinned host memory, against the same
// calls on host buffers and against the GPU's own device-to-device copy bandwidth, per transport,
// process count and size. Each rank process uses GPU (rank % device count). Per point: the median
// of --runs runs (each the mean of several calls, the slowest rank's), the bus bandwidth, and the
// number of wrong elements of a checked call (device results are copied back and compared with
// the exact result). JSON lines with --json.
//
//   plexus-bench-cuda --transport shm,tcp --np 2 --sizes 64K,1M,16M,64M --runs 5 --json
//
// The peer for device buffers is torch.distributed's Gloo backend on CUDA tensors:
// bench/collectives/cuda_torch_peer.py prints the same figures (needs a torch with CUDA). Built
// only in CUDA builds (bench/collectives/CMakeLists.txt).
#include <algorithm>
#include <cmath>
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

// One rank's device copies of an operation's buffers (OpBuffers: the host pattern and check).
struct DeviceCopies {
  float* send = nullptr;
  float* recv = nullptr;
  size_t send_bytes = 0, recv_bytes = 0;
  explicit DeviceCopies(const pb::OpShape& shape)
      : send_bytes(shape.send_count * sizeof(float)), recv_bytes(shape.recv_count * sizeof(float)) {
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&send), std::max<size_t>(send_bytes, 4)),
              "cudaMalloc");
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&recv), std::max<size_t>(recv_bytes, 4)),
              "cudaMalloc");
  }
  ~DeviceCopies() {
    cudaFree(send);
    cudaFree(recv);
  }
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;
  void Upload(pb::OpBuffers& b) {
    CheckCuda(cudaMemcpy(send, b.send(), send_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    CheckCuda(cudaMemcpy(recv, b.recv(), recv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void Download(pb::OpBuffers& b) {
    CheckCuda(cudaMemcpy(b.recv(), recv, recv_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
};

// One call of `op` on (send, recv) (broadcast: in place in recv from root 0).
absl::Status RunOp(pc::Communicator& comm, pb::Op op, const pb::OpShape& shape, float* send,
                   float* recv, const pc::CallOptions& call) {
  switch (op) {
    case pb::Op::kAllreduce:
      return comm.AllReduce(send, recv, shape.count, pc::DataType::kF32, pc::ReduceOp::kSum, call);
    case pb::Op::kBroadcast:
      return comm.Broadcast(recv, recv, shape.count, pc::DataType::kF32, 0, call);
    case pb::Op::kAllgather:
      return comm.AllGather(send, recv, shape.count, pc::DataType::kF32, call);
    default:
      return absl::UnimplementedError(std::string(pb::OpName(op)));
  }
}

// The GPU's own device-to-device copy bandwidth for `bytes` (GB/s, bytes copied per second),
// the median of `runs`: the physical reference of the device paths.
double CopyBandwidth(size_t bytes, int runs, int iters) {
  void* a = nullptr;
  void* b = nullptr;
  CheckCuda(cudaMalloc(&a, bytes), "cudaMalloc");
  CheckCuda(cudaMalloc(&b, bytes), "cudaMalloc");
  CheckCuda(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  std::vector<double> gbs;
  for (int run = 0; run < runs; ++run) {
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const absl::Time start = absl::Now();
    for (int k = 0; k < iters; ++k) {
      CheckCuda(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    }
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    gbs.push_back(static_cast<double>(bytes) * iters / absl::ToDoubleSeconds(absl::Now() - start) /
                  1e9);
  }
  cudaFree(a);
  cudaFree(b);
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

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
  pc::CallOptions peer, staged;
  peer.device_peer_access = true;
  staged.device_peer_access = false;
  for (const std::string& size_text : size_list) {
    auto bytes = plexus::base::ParseBytes(size_text, "--sizes");
    if (!bytes.ok()) Die("--sizes", std::string(bytes.status().message()));
    const int iters = pb::IterationsFor(*bytes, 0);
    if (rank == 0) {
      tooling::Figure f;
      f.figure = "d2d_copy_bandwidth";
      f.value = CopyBandwidth(*bytes, runs, iters);
      f.unit = "GB/s";
      f.extra = {{"transport", transport}, {"np", n}, {"bytes", *bytes}, {"runs", runs}};
      std::printf("%s\n", tooling::FigureJson(kBench, f).dump().c_str());
      std::fflush(stdout);
    }
    for (const pb::Op op : {pb::Op::kAllreduce, pb::Op::kBroadcast, pb::Op::kAllgather}) {
      pb::OpBuffers host;
      host.Prepare(op, *bytes, rank, n);
      const pb::OpShape& shape = host.shape();
      DeviceCopies device(shape);
      struct Variant {
        // host; cuda: the default path (device to device over shm and inproc, staged over tcp);
        // cuda_staged: through pinned host memory (CallOptions::device_peer_access = false)
        const char* memory;
        bool on_device;
        pc::CallOptions call;
      };
      const Variant variants[] = {
          {"host", false, {}}, {"cuda", true, peer}, {"cuda_staged", true, staged}};
      for (const Variant& v : variants) {
        // Without mailboxes (tcp) device buffers always stage: "cuda" is that path already.
        if (*backend == pt::Backend::kTcp && std::string(v.memory) == "cuda_staged") continue;
        float* send = v.on_device ? device.send : host.send();
        float* recv = v.on_device ? device.recv : host.recv();
        // Warm-up and check: the result of one call, compared element by element.
        host.Refill();
        if (v.on_device) device.Upload(host);
        const pc::Communicator::DevicePathCounts before = comm->device_path_counts();
        if (absl::Status s = RunOp(*comm, op, shape, send, recv, v.call); !s.ok()) {
          Die(v.memory, std::string(s.message()));
        }
        // Which path the call took on this rank (every rank takes the same): host buffers,
        // device to device, staged after the ranks' vote, or staged without one.
        const pc::Communicator::DevicePathCounts after = comm->device_path_counts();
        const std::string path = !v.on_device ? "host"
                                 : after.device_to_device > before.device_to_device
                                     ? "device_to_device"
                                 : after.staged > before.staged ? "staged_by_vote"
                                                                : "staged";
        if (v.on_device) device.Download(host);
        const double wrong = max_over_ranks(static_cast<double>(host.CountWrong()));
        std::vector<double> times;
        for (int run = 0; run < runs; ++run) {
          if (absl::Status s = comm->Barrier(); !s.ok()) Die("Barrier", std::string(s.message()));
          const absl::Time start = absl::Now();
          for (int k = 0; k < iters; ++k) {
            if (absl::Status s = RunOp(*comm, op, shape, send, recv, v.call); !s.ok()) {
              Die(v.memory, std::string(s.message()));
            }
          }
          times.push_back(max_over_ranks(absl::ToDoubleMicroseconds(absl::Now() - start) / iters));
        }
        std::sort(times.begin(), times.end());
        if (rank == 0) {
          const double median = times[times.size() / 2];
          tooling::Figure f;
          f.figure = std::string(pb::OpName(op)) + "_time";
          f.value = median;
          f.unit = "us";
          f.extra = {
              {"impl", "plexus"},
              {"op", std::string(pb::OpName(op))},
              {"memory", v.memory},
              {"path", path},
              {"transport", transport},
              {"np", n},
              {"bytes", shape.bytes},
              {"runs", runs},
              {"iters", iters},
              {"min", times.front()},
              {"max", times.back()},
              {"busbw_gbs", static_cast<double>(shape.bytes) * pb::BusFactor(op, n) / median / 1e3},
              {"wrong", wrong}};
          std::printf("%s\n", tooling::FigureJson(kBench, f).dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// Per (op, transport, np, bytes): device over host time, device to device over staged time, and
// the device-to-device path's bus bandwidth over the GPU's own copy bandwidth (the target at 64
// MiB: >= 0.25), from the collected figures.
void AddRatios(tooling::FigureWriter& writer) {
  const std::vector<tooling::Figure> figures = writer.figures();
  auto same_point = [](const tooling::Figure& a, const tooling::Figure& b) {
    return a.extra["transport"] == b.extra["transport"] && a.extra["np"] == b.extra["np"] &&
           a.extra["bytes"] == b.extra["bytes"];
  };
  auto find = [&](const tooling::Figure& like, const std::string& figure,
                  const std::string& memory) -> const tooling::Figure* {
    for (const tooling::Figure& f : figures) {
      if (f.figure == figure && f.extra.value("memory", "") == memory && same_point(f, like)) {
        return &f;
      }
    }
    return nullptr;
  };
  for (const tooling::Figure& cuda : figures) {
    if (cuda.extra.value("memory", "") != "cuda") continue;
    const std::string op = cuda.extra.value("op", "");
    auto ratio = [&](const std::string& name, double value) {
      tooling::Figure r;
      r.figure = name;
      r.value = value;
      r.unit = "ratio";
      r.extra = {{"op", op},
                 {"transport", cuda.extra["transport"]},
                 {"np", cuda.extra["np"]},
                 {"bytes", cuda.extra["bytes"]}};
      return r;
    };
    if (const tooling::Figure* host = find(cuda, cuda.figure, "host")) {
      writer.Add(ratio("cuda_over_host_time", cuda.value / host->value));
    }
    if (const tooling::Figure* staged = find(cuda, cuda.figure, "cuda_staged")) {
      writer.Add(ratio("staged_over_peer_time", staged->value / cuda.value));
    }
    for (const tooling::Figure& copy : figures) {
      if (copy.figure != "d2d_copy_bandwidth" || !same_point(copy, cuda)) continue;
      tooling::Figure r =
          ratio("busbw_over_d2d_copy", cuda.extra.value("busbw_gbs", 0.0) / copy.value);
      // 64 MiB, give or take the rounding of a block to whole elements per rank.
      const double bytes = cuda.extra["bytes"].get<double>();
      if (std::abs(bytes - static_cast<double>(size_t{64} << 20)) < 1024) {
        r.target = ">= 0.25";
        r.met = r.value >= 0.25;
      }
      writer.Add(r);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return WorkerMain(argc - 1, argv + 1);
  tooling::Tool tool(kProgram,
                     "AllReduce (f32 sum), Broadcast and AllGather of CUDA device buffers, "
                     "device to device and staged through the host, against the same calls on "
                     "host buffers and the GPU's own copy bandwidth, per transport, process "
                     "count and size.");
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
