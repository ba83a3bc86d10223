// The launchers of src/cuda/divide.cu's, src/cuda/reduce.cu's and src/cuda/gather.cu's kernels,
// through base::cuda (no CUDA library linked).
#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/cuda.hpp"
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

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The kernels' pointer arrays, passed by value (cuLaunchKernel copies them): src/cuda/pointers.cuh.
struct Pointers {
  struct {
    const void* in[kMaxDeviceReduceInputs];
  } in{};
  struct {
    void* out[kMaxDeviceReduceInputs];
  } out{};
};

// The pointers of k inputs and m outputs; InvalidArgument naming `what` beyond the kernels' limit.
absl::StatusOr<Pointers> PointersFor(const char* what, void* const* outs, int m,
                                     const void* const* inputs, int k) {
  if (k < 1 || k > kMaxDeviceReduceInputs || m < 1 || m > kMaxDeviceReduceInputs) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", k, " inputs and ", m,
                                                   " outputs; 1 to ", kMaxDeviceReduceInputs,
                                                   " of each are supported"));
  }
  Pointers p;
  for (int j = 0; j < k; ++j) p.in.in[j] = inputs[j];
  for (int j = 0; j < m; ++j) p.out.out[j] = outs[j];
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
  absl::StatusOr<Pointers> p = PointersFor("ReduceOnDevice", outs, m, inputs, k);
  if (!p.ok()) return p.status();
  // With every pointer 16-byte aligned each thread reduces 16 bytes per step (the kernel's
  // vector path), so the grid covers n / lanes threads.
  int aligned16 = 1;
  for (int j = 0; j < k; ++j) aligned16 &= Aligned16(inputs[j]) ? 1 : 0;
  for (int j = 0; j < m; ++j) aligned16 &= Aligned16(outs[j]) ? 1 : 0;
  const size_t lanes = aligned16 != 0 ? 16 / DataTypeSize(dtype) : 1;
  const std::string kernel = absl::StrCat(
      "plexus_reduce_", std::string(ReduceOpName(op == ReduceOp::kAvg ? ReduceOp::kSum : op)), "_",
      std::string(DataTypeName(dtype)));
  const unsigned threads = 256;
  void* args[] = {&p->out, &m, &p->in, &k, &n, &aligned16};
  return base::cuda::Launch({internal::kReduceFatbin, "plexus::kernels reduction"}, kernel.c_str(),
                            GridFor((n + lanes - 1) / lanes, threads), threads, args);
}

absl::Status GatherOnDevice(void* const* outs, int m, const void* const* inputs, int k,
                            size_t block) {
  if (block == 0) return absl::OkStatus();
  absl::StatusOr<Pointers> p = PointersFor("GatherOnDevice", outs, m, inputs, k);
  if (!p.ok()) return p.status();
  // The widest word that every pointer and the block are aligned to.
  uintptr_t all = block;
  for (int j = 0; j < k; ++j) all |= reinterpret_cast<uintptr_t>(inputs[j]);
  for (int j = 0; j < m; ++j) all |= reinterpret_cast<uintptr_t>(outs[j]);
  const size_t word = WordFor(all);
  size_t words = block / word;
  const unsigned threads = 256;
  // Thread blocks per input: together about the cap of a one-input grid.
  const unsigned per_input =
      std::max(1u, std::min(GridFor(words, threads), 8192u / static_cast<unsigned>(k)));
  void* args[] = {&p->out, &m, &p->in, &k, &words};
  const std::string kernel = absl::StrCat("plexus_gather_", word);
  return base::cuda::Launch({internal::kGatherFatbin, "plexus::kernels gather"}, kernel.c_str(),
                            per_input * static_cast<unsigned>(k), threads, args);
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
