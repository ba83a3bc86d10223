// Device buffers (builds with PLEXUS_HAVE_CUDA): device to device between the ranks of one host
// (peer access, the default), or staged through pinned host memory with an average finished by a
// kernel; both give the same bits. Skipped (exit 77) without CUDA or without a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "device_peers.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/config.hpp"
#include "plexus/transport/memory.hpp"
#include "ranks.hpp"
#include "suite.hpp"
#include "support/skip.hpp"

#if PLEXUS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

#if PLEXUS_HAVE_CUDA
namespace {

// One rank's device buffer: filled from and read back into host vectors.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n == 0 ? 1 : n) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  bool Upload(const std::vector<uint8_t>& host) {
    return cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(bytes);
    if (cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) host.clear();
    return host;
  }
};

// Skips (exit 77, with the reason) without a usable GPU; else 3 ranks' options: threads of this
// process over inproc, all on GPU 0.
pc::CommunicatorOptions DeviceOptionsOrSkip(absl::Duration timeout) {
  std::string why;
  if (!pt::CudaAvailable(&why)) plexus::testing::SkipTest(why);
  pc::CommunicatorOptions options;
  options.device.backend = pt::Backend::kInproc;
  options.timeout = timeout;
  return options;
}

}  // namespace
#endif

TEST_CASE("device buffers: allreduce (sum, avg), broadcast and allgather", "[collectives][cuda]") {
#if !PLEXUS_HAVE_CUDA
  plexus::testing::SkipTest("built without CUDA (PLEXUS_WITH_CUDA found no toolkit)");
#else
  constexpr int kRanks = 3;
  const pc::CommunicatorOptions options = DeviceOptionsOrSkip(absl::Seconds(30));
  auto results = pc::testing::RunRanks(kRanks, options, [](int r, pc::Communicator& comm) {
    // Sizes on both the mailbox (small) and the plan path; f32 sum and bf16 avg (the average is
    // finished by a kernel on the device).
    for (size_t count : {size_t{7}, size_t{100000}}) {
      for (pc::DataType dt : {pc::DataType::kF32, pc::DataType::kBF16}) {
        const pc::ReduceOp op = dt == pc::DataType::kF32 ? pc::ReduceOp::kSum : pc::ReduceOp::kAvg;
        const size_t es = pc::DataTypeSize(dt);
        std::vector<uint8_t> host(count * es);
        for (size_t i = 0; i < count; ++i) {
          pc::testing::Set(dt, host.data(), i, static_cast<double>((i % 13) + r));
        }
        DeviceBuffer in(count * es), out(count * es);
        if (in.ptr == nullptr || out.ptr == nullptr || !in.Upload(host)) {
          return std::string("cudaMalloc/cudaMemcpy failed");
        }
        absl::Status s = comm.AllReduce(in.ptr, out.ptr, count, dt, op);
        if (!s.ok()) return std::string(s.message());
        const std::vector<uint8_t> got = out.Download();
        for (size_t i = 0; i < count; ++i) {
          const double sum = 3.0 * (i % 13) + 0 + 1 + 2;
          const double want = op == pc::ReduceOp::kAvg ? sum / kRanks : sum;
          if (std::abs(pc::testing::Get(dt, got.data(), i) - want) > 0.02 * std::abs(want) + 1e-6) {
            return "allreduce element " + std::to_string(i) + " is wrong";
          }
        }
        // Broadcast from rank 1 and allgather, in place on the device.
        if (!in.Upload(host)) return std::string("cudaMemcpy failed");
        s = comm.Broadcast(in.ptr, in.ptr, count, dt, 1);
        if (!s.ok()) return std::string(s.message());
        const std::vector<uint8_t> bcast = in.Download();
        for (size_t i = 0; i < count; ++i) {
          if (pc::testing::Get(dt, bcast.data(), i) != static_cast<double>((i % 13) + 1)) {
            return "broadcast element " + std::to_string(i) + " is wrong";
          }
        }
        DeviceBuffer all(count * es * kRanks);
        if (!in.Upload(host)) return std::string("cudaMemcpy failed");
        s = comm.AllGather(in.ptr, all.ptr, count, dt);
        if (!s.ok()) return std::string(s.message());
        const std::vector<uint8_t> gathered = all.Download();
        for (size_t j = 0; j < count * kRanks; ++j) {
          const double want = static_cast<double>(((j % count) % 13) + j / count);
          if (pc::testing::Get(dt, gathered.data(), j) != want) {
            return "allgather element " + std::to_string(j) + " is wrong";
          }
        }
      }
    }
    return std::string();
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
#endif
}

TEST_CASE("device buffers: large allreduces run as pipelined segments (in and out of place)",
          "[collectives][cuda]") {
#if !PLEXUS_HAVE_CUDA
  plexus::testing::SkipTest("built without CUDA (PLEXUS_WITH_CUDA found no toolkit)");
#else
  constexpr int kRanks = 3;
  pc::CommunicatorOptions options = DeviceOptionsOrSkip(absl::Seconds(60));
  options.algorithms.Set(pc::CollectiveKind::kAllReduce, pc::Algorithm::kRing);
  auto results = pc::testing::RunRanks(kRanks, options, [](int r, pc::Communicator& comm) {
    // 12 MiB + 4 bytes: above the 8 MiB threshold, segments that do not divide it evenly.
    const size_t count = (size_t{3} << 20) + 1;
    for (const bool in_place : {false, true}) {
      for (const pc::ReduceOp op : {pc::ReduceOp::kSum, pc::ReduceOp::kAvg}) {
        std::vector<uint8_t> host(count * 4);
        for (size_t i = 0; i < count; ++i) {
          pc::testing::Set(pc::DataType::kF32, host.data(), i, static_cast<double>(i % 29 + r));
        }
        DeviceBuffer in(count * 4), out(count * 4);
        if (in.ptr == nullptr || out.ptr == nullptr || !in.Upload(host)) {
          return std::string("cudaMalloc/cudaMemcpy failed");
        }
        void* dst = in_place ? in.ptr : out.ptr;
        pc::CallOptions staged;
        staged.device_peer_access = false;  // the staging path (peers would go device to device)
        absl::Status s = comm.AllReduce(in.ptr, dst, count, pc::DataType::kF32, op, staged);
        if (!s.ok()) return std::string(s.message());
        const std::vector<uint8_t> got = in_place ? in.Download() : out.Download();
        if (got.size() != count * 4) return std::string("cudaMemcpy of the result failed");
        for (size_t i = 0; i < count; ++i) {
          const double sum = 3.0 * (i % 29) + 0 + 1 + 2;
          const double want = op == pc::ReduceOp::kAvg ? sum / kRanks : sum;
          if (std::abs(pc::testing::Get(pc::DataType::kF32, got.data(), i) - want) > 1e-5 * want) {
            return "element " + std::to_string(i) + (in_place ? " (in place)" : " (out of place)") +
                   " is wrong";
          }
        }
        if (!in_place && in.Download() != host) return std::string("the input was modified");
      }
    }
    return std::string();
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
#endif
}

TEST_CASE("device buffers by peer access: the same bits as staging, every type and op, odd sizes",
          "[collectives][cuda]") {
#if !PLEXUS_HAVE_CUDA
  plexus::testing::SkipTest("built without CUDA (PLEXUS_WITH_CUDA found no toolkit)");
#else
  constexpr int kRanks = 3;
  const pc::CommunicatorOptions options = DeviceOptionsOrSkip(absl::Seconds(60));
  // Ranks on one GPU: one rank does the device work; then, forced, each rank its own slice (the
  // path of ranks on several GPUs).
  const bool leader = GENERATE(true, false);
  INFO((leader ? "one rank works" : "each rank works on its slice"));
  const bool before_setting = pc::internal::SetOneGpuLeaderForTesting(leader);
  auto results = pc::testing::RunRanks(kRanks, options, [](int r, pc::Communicator& comm) {
    pc::CallOptions peer, staged;
    peer.device_peer_access = true;
    staged.device_peer_access = false;
    // Small integers: every reduction is exact in every type, whatever the order of the folds.
    const pc::DataType types[] = {pc::DataType::kF32,  pc::DataType::kF64, pc::DataType::kF16,
                                  pc::DataType::kBF16, pc::DataType::kI32, pc::DataType::kI64,
                                  pc::DataType::kU8,   pc::DataType::kI8};
    const pc::ReduceOp ops[] = {pc::ReduceOp::kSum, pc::ReduceOp::kProd, pc::ReduceOp::kMin,
                                pc::ReduceOp::kMax, pc::ReduceOp::kAvg};
    int peer_calls = 0;
    const pc::Communicator::DevicePathCounts before = comm.device_path_counts();
    // 4096: every buffer 16-byte aligned (the kernels' vector paths), and one element off it.
    for (size_t count :
         {size_t{1}, size_t{2}, size_t{7}, size_t{1001}, size_t{4096}, size_t{100003}}) {
      for (pc::DataType dt : types) {
        peer_calls += 2 * 5 + 1 + 2;  // allreduces (each op out of and in place), broadcast,
                                      // allgathers
        const size_t es = pc::DataTypeSize(dt);
        std::vector<uint8_t> host(count * es);
        for (size_t i = 0; i < count; ++i) {
          pc::testing::Set(dt, host.data(), i, static_cast<double>((i * 7 + r) % 5 + 1));
        }
        const std::string where =
            " (count " + std::to_string(count) + ", " + std::string(pc::DataTypeName(dt)) + ")";
        DeviceBuffer in(count * es), a(count * es), b(count * es);
        if (in.ptr == nullptr || a.ptr == nullptr || b.ptr == nullptr || !in.Upload(host)) {
          return std::string("cudaMalloc/cudaMemcpy failed");
        }
        for (pc::ReduceOp op : ops) {
          const std::string what = std::string(pc::ReduceOpName(op)) + where;
          absl::Status s = comm.AllReduce(in.ptr, a.ptr, count, dt, op, peer);
          if (!s.ok()) return "peer allreduce " + what + ": " + std::string(s.message());
          s = comm.AllReduce(in.ptr, b.ptr, count, dt, op, staged);
          if (!s.ok()) return "staged allreduce " + what + ": " + std::string(s.message());
          const std::vector<uint8_t> staged_bits = b.Download();
          if (staged_bits.size() != count * es) return std::string("cudaMemcpy failed");
          if (a.Download() != staged_bits) return "allreduce " + what + " differs";
          if (in.Download() != host) return "allreduce " + what + " changed its input";
          // In place, and from the communicator's own thread (no CUDA context current there):
          // the same bits again.
          if (!a.Upload(host)) return std::string("cudaMemcpy failed");
          s = comm.AllReduceAsync(a.ptr, a.ptr, count, dt, op, peer)->Wait();
          if (!s.ok()) return "in-place allreduce " + what + ": " + std::string(s.message());
          if (a.Download() != staged_bits) return "in-place allreduce " + what + " differs";
        }
        // Broadcast from rank 2 (out of place at the root, in place elsewhere).
        if (!a.Upload(host)) return std::string("cudaMemcpy failed");
        absl::Status s = comm.Broadcast(r == 2 ? in.ptr : a.ptr, a.ptr, count, dt, 2, peer);
        if (!s.ok()) return "broadcast" + where + ": " + std::string(s.message());
        std::vector<uint8_t> root(count * es);
        for (size_t i = 0; i < count; ++i) {
          pc::testing::Set(dt, root.data(), i, static_cast<double>((i * 7 + 2) % 5 + 1));
        }
        if (a.Download() != root) return "broadcast" + where + " is wrong";
        // AllGather, out of place and in place.
        DeviceBuffer all(count * es * kRanks), again(count * es * kRanks);
        s = comm.AllGather(in.ptr, all.ptr, count, dt, peer);
        if (!s.ok()) return "allgather" + where + ": " + std::string(s.message());
        std::vector<uint8_t> mine_in_all(count * es * kRanks);
        if (!again.Upload(mine_in_all)) return std::string("cudaMemcpy failed");
        if (cudaMemcpy(static_cast<uint8_t*>(again.ptr) + r * count * es, in.ptr, count * es,
                       cudaMemcpyDeviceToDevice) != cudaSuccess) {
          return std::string("cudaMemcpy failed");
        }
        s = comm.AllGather(static_cast<uint8_t*>(again.ptr) + r * count * es, again.ptr, count, dt,
                           peer);
        if (!s.ok()) return "in-place allgather" + where + ": " + std::string(s.message());
        const std::vector<uint8_t> gathered = all.Download();
        if (gathered.size() != count * es * kRanks) return std::string("cudaMemcpy failed");
        if (again.Download() != gathered) return "in-place allgather" + where + " differs";
        for (size_t j = 0; j < count * kRanks; ++j) {
          const double want = static_cast<double>(((j % count) * 7 + j / count) % 5 + 1);
          if (pc::testing::Get(dt, gathered.data(), j) != want) {
            return "allgather" + where + " element " + std::to_string(j) + " is wrong";
          }
        }
        if (count == 4096) {
          // One element off alignment: an allreduce (sum) and an allgather of count - 1
          // elements, against staging.
          peer_calls += 2;
          const size_t c = count - 1;
          const std::vector<uint8_t> zeros(count * es * kRanks);
          auto at = [es](const DeviceBuffer& b) { return static_cast<uint8_t*>(b.ptr) + es; };
          if (!a.Upload({zeros.begin(), zeros.begin() + count * es}) ||
              !b.Upload({zeros.begin(), zeros.begin() + count * es}) || !all.Upload(zeros) ||
              !again.Upload(zeros)) {
            return std::string("cudaMemcpy failed");
          }
          s = comm.AllReduce(at(in), at(a), c, dt, pc::ReduceOp::kSum, peer);
          if (s.ok()) s = comm.AllReduce(at(in), at(b), c, dt, pc::ReduceOp::kSum, staged);
          if (!s.ok()) return "unaligned allreduce" + where + ": " + std::string(s.message());
          if (a.Download() != b.Download()) return "unaligned allreduce" + where + " differs";
          s = comm.AllGather(at(in), at(all), c, dt, peer);
          if (s.ok()) s = comm.AllGather(at(in), at(again), c, dt, staged);
          if (!s.ok()) return "unaligned allgather" + where + ": " + std::string(s.message());
          if (all.Download() != again.Download()) return "unaligned allgather" + where + " differs";
        }
      }
    }
    // Every call asked to go device to device did (none was staged by the ranks' vote).
    const pc::Communicator::DevicePathCounts after = comm.device_path_counts();
    if (after.staged != before.staged ||
        after.device_to_device - before.device_to_device != static_cast<uint64_t>(peer_calls)) {
      return "device to device " + std::to_string(after.device_to_device) + ", staged " +
             std::to_string(after.staged) + " of " + std::to_string(peer_calls) + " calls";
    }
    return std::string();
  });
  pc::internal::SetOneGpuLeaderForTesting(before_setting);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
#endif
}

TEST_CASE("device buffers by peer access on some ranks only: mismatched, named, in time",
          "[collectives][cuda]") {
#if !PLEXUS_HAVE_CUDA
  plexus::testing::SkipTest("built without CUDA (PLEXUS_WITH_CUDA found no toolkit)");
#else
  constexpr int kRanks = 3;
  const pc::CommunicatorOptions options = DeviceOptionsOrSkip(absl::Seconds(5));
  const absl::Time start = absl::Now();
  auto results = pc::testing::RunRanks(kRanks, options, [](int r, pc::Communicator& comm) {
    DeviceBuffer buf(1024 * 4);
    if (buf.ptr == nullptr) return std::string("cudaMalloc failed");
    pc::CallOptions call;
    call.device_peer_access = r != 0;  // rank 0 stages through the host
    absl::Status s =
        comm.AllReduce(buf.ptr, buf.ptr, 1024, pc::DataType::kF32, pc::ReduceOp::kSum, call);
    return s.ok() ? std::string("ok") : std::string(s.message());
  });
  CHECK(absl::Now() - start < absl::Seconds(30));
  int named = 0;
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r] != "ok");
    if (results[r].find("device buffers by peer access") != std::string::npos) ++named;
  }
  CHECK(named > 0);
#endif
}
