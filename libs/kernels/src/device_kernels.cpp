// The launchers of src/cuda/divide.cu's, src/cuda/reduce.cu's and src/cuda/gather.cu's kernels,
// through base::cuda (no CUDA library linked).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/base/cuda.hpp"
#include "plexus/base/status.hpp"
#include "plexus/config.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::kernels {

#if PLEXUS_HAVE_CUDA
namespace internal {
extern const unsigned char kDivideFatbin[];  // generated from src/cuda/divide.cu
extern const unsigned char kReduceFatbin[];  // generated from src/cuda/reduce.cu
extern const unsigned char kGatherFatbin[];  // generated from src/cuda/gather.cu
}  // namespace internal

namespace {
// A grid-stride loop's grid: enough blocks to fill any current GPU, fewer for small vectors.
unsigned GridFor(size_t n, unsigned threads) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 8192));
}

// The kernels' pointer arrays, passed by value (cuLaunchKernel copies them): src/cuda/pointers.cuh.
struct Pointers {
  struct {
    const void* in[kMaxDeviceReduceInputs];
  } in{};
  struct {
    void* out[kMaxDeviceReduceInputs];
  } out{};
  uintptr_t bits = 0;  // every address or-ed together: their common alignment
};

// The pointers of k inputs and m outputs, 1 to kMaxDeviceReduceInputs of each (the caller checks).
Pointers PointersFor(void* const* outs, int m, const void* const* inputs, int k) {
  Pointers p;
  for (int j = 0; j < k; ++j) {
    p.in.in[j] = inputs[j];
    p.bits |= reinterpret_cast<uintptr_t>(inputs[j]);
  }
  for (int j = 0; j < m; ++j) {
    p.out.out[j] = outs[j];
    p.bits |= reinterpret_cast<uintptr_t>(outs[j]);
  }
  return p;
}

// The largest of 16, 8, 4, 2 and 1 that divides v.
size_t WordFor(uintptr_t v) {
  size_t w = 16;
  while (w > 1 && v % w != 0) w /= 2;
  return w;
}
}  // namespace

absl::Status DivideOnDevice(DataType dtype, void* data, size_t n, int divisor) {
  if (n == 0) return absl::OkStatus();
  const unsigned threads = 256;
  const size_t blocks = (n + threads - 1) / threads;
  if (blocks > 0x7fffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("DivideOnDevice: ", n, " elements exceed one grid"));
  }
  const std::string kernel = "plexus_divide_" + std::string(DataTypeName(dtype));
  void* args[] = {&data, &n, &divisor};
  return base::cuda::Launch({internal::kDivideFatbin, "plexus::kernels division"}, kernel.c_str(),
                            static_cast<unsigned>(blocks), threads, args);
}

absl::Status ReduceOnDevice(DataType dtype, ReduceOp op, void* const* outs, int m,
                            const void* const* inputs, int k, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (k < 1 || k > kMaxDeviceReduceInputs || m < 1 || m > kMaxDeviceReduceInputs) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceOnDevice: ", k, " inputs and ", m,
                                                   " outputs; 1 to ", kMaxDeviceReduceInputs,
                                                   " of each are supported"));
  }
  Pointers p = PointersFor(outs, m, inputs, k);
  // With every pointer 16-byte aligned each thread reduces 16 bytes per step (the kernel's
  // vector path), so the grid covers n / lanes threads.
  int aligned16 = WordFor(p.bits) == 16 ? 1 : 0;
  const size_t lanes = aligned16 != 0 ? 16 / DataTypeSize(dtype) : 1;
  const std::string kernel = absl::StrCat(
      "plexus_reduce_", std::string(ReduceOpName(op == ReduceOp::kAvg ? ReduceOp::kSum : op)), "_",
      std::string(DataTypeName(dtype)));
  const unsigned threads = 256;
  void* args[] = {&p.out, &m, &p.in, &k, &n, &aligned16};
  return base::cuda::Launch({internal::kReduceFatbin, "plexus::kernels reduction"}, kernel.c_str(),
                            GridFor((n + lanes - 1) / lanes, threads), threads, args);
}

absl::Status GatherOnDevice(void* const* outs, int m, const void* const* inputs, int k,
                            size_t block) {
  if (m < 1 || k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GatherOnDevice: ", k, " inputs and ", m, " outputs; at least 1 of each"));
  }
  if (block == 0) return absl::OkStatus();
  // The kernel takes kMaxDeviceReduceInputs pointers of each kind: more go in batches, each
  // input still read once per batch of outputs.
  constexpr int kBatch = kMaxDeviceReduceInputs;
  std::vector<void*> at;
  for (int o = 0; o < m; o += kBatch) {
    for (int i = 0; i < k; i += kBatch) {
      int mb = std::min(kBatch, m - o), kb = std::min(kBatch, k - i);
      at.assign(outs + o, outs + o + mb);
      for (void*& a : at) a = static_cast<uint8_t*>(a) + static_cast<size_t>(i) * block;
      Pointers p = PointersFor(at.data(), mb, inputs + i, kb);
      // The widest word that every pointer and the block are aligned to.
      const size_t word = WordFor(p.bits | block);
      size_t words = block / word;
      const unsigned threads = 256;
      // Thread blocks per input: together about the cap of a one-input grid.
      const unsigned per_input =
          std::max(1u, std::min(GridFor(words, threads), 8192u / static_cast<unsigned>(kb)));
      void* args[] = {&p.out, &mb, &p.in, &kb, &words};
      const std::string kernel = absl::StrCat("plexus_gather_", word);
      PLEXUS_RETURN_IF_ERROR(
          base::cuda::Launch({internal::kGatherFatbin, "plexus::kernels gather"}, kernel.c_str(),
                             per_input * static_cast<unsigned>(kb), threads, args));
    }
  }
  return absl::OkStatus();
}
#else
absl::Status DivideOnDevice(DataType, void*, size_t, int) {
  std::string why;
  base::cuda::Available(&why);
  return absl::FailedPreconditionError(absl::StrCat("DivideOnDevice: ", why));
}

absl::Status ReduceOnDevice(DataType, ReduceOp, void* const*, int, const void* const*, int,
                            size_t) {
  std::string why;
  base::cuda::Available(&why);
  return absl::FailedPreconditionError(absl::StrCat("ReduceOnDevice: ", why));
}

absl::Status GatherOnDevice(void* const*, int, const void* const*, int, size_t) {
  std::string why;
  base::cuda::Available(&why);
  return absl::FailedPreconditionError(absl::StrCat("GatherOnDevice: ", why));
}
#endif

}  // namespace plexus::kernels
