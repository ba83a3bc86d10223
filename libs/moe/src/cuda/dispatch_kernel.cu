// CUDA dispatcher (nvcc, embedded as a fatbin; launched by src/dispatch_cuda.cpp through the
// driver): one thread per expert runs the same rule as the CPU path (dispatch_core.hpp), writing
// dense flows. Kept free of absl so that nvcc compiles it quickly.
#include <cstdint>

#include "../dispatch_core.hpp"

namespace {

using plexus::moe::internal::DispatchOneExpert;
using plexus::moe::internal::DispatchScratch;

struct DenseEmit {
  int64_t* block;  // this expert's [src][dst] block
  int num_ranks;
  __host__ __device__ void operator()(int src, int dst, int64_t count) {
    block[static_cast<int64_t>(src) * num_ranks + dst] += count;
  }
};

}  // namespace

extern "C" __global__ void plexus_moe_dispatch(int num_experts, int num_ranks,
                                               const int64_t* tokens, const int* replicas,
                                               int64_t* capacity, int64_t* local, int64_t* dense,
                                               int* holders, int64_t* residual, int64_t* share,
                                               int64_t* remainder, int* order) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= num_experts) return;
  const int64_t row = static_cast<int64_t>(e) * num_ranks;
  const DispatchScratch scratch{holders + row, residual + row, share + row, remainder + row,
                                order + row};
  int64_t* block = dense + row * num_ranks;
  DenseEmit emit{block, num_ranks};
  DispatchOneExpert(num_ranks, tokens + row, replicas + row, capacity + row, local + row, scratch,
                    emit);
  for (int j = 0; j < num_ranks; ++j) {
    block[static_cast<int64_t>(j) * num_ranks + j] = local[row + j];
  }
}
