// CUDA dispatcher: one thread per expert runs the same rule as the CPU path (dispatch_core.hpp),
// writing dense flows. Kept free of absl so that nvcc compiles it quickly.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../dispatch_core.hpp"

namespace plexus::moe::internal {
namespace {

struct DenseEmit {
  int64_t* block;  // this expert's [src][dst] block
  int num_ranks;
  __host__ __device__ void operator()(int src, int dst, int64_t count) {
    block[static_cast<int64_t>(src) * num_ranks + dst] += count;
  }
};

__global__ void DispatchKernel(int num_experts, int num_ranks, const int64_t* tokens,
                               const int* replicas, int64_t* capacity, int64_t* local,
                               int64_t* dense, int* holders, int64_t* residual, int64_t* share,
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

}  // namespace

// Returns "" on success, else what failed.
std::string RunDispatchKernel(int num_experts, int num_ranks, const int64_t* host_tokens,
                              const int* host_replicas, int64_t* host_dense) {
  const size_t cells = static_cast<size_t>(num_experts) * num_ranks;
  const size_t dense_cells = cells * num_ranks;
  int64_t *tokens = nullptr, *capacity = nullptr, *local = nullptr, *dense = nullptr;
  int64_t *residual = nullptr, *share = nullptr, *remainder = nullptr;
  int *replicas = nullptr, *holders = nullptr, *order = nullptr;
  std::string error;
  auto ok = [&](cudaError_t err, const char* what) {
    if (err != cudaSuccess && error.empty()) {
      error = std::string(what) + ": " + cudaGetErrorString(err);
    }
    return error.empty();
  };
  const size_t i64 = cells * sizeof(int64_t);
  const size_t i32 = cells * sizeof(int);
  if (ok(cudaMalloc(&tokens, i64), "cudaMalloc") && ok(cudaMalloc(&replicas, i32), "cudaMalloc") &&
      ok(cudaMalloc(&capacity, i64), "cudaMalloc") && ok(cudaMalloc(&local, i64), "cudaMalloc") &&
      ok(cudaMalloc(&residual, i64), "cudaMalloc") && ok(cudaMalloc(&share, i64), "cudaMalloc") &&
      ok(cudaMalloc(&remainder, i64), "cudaMalloc") &&
      ok(cudaMalloc(&holders, i32), "cudaMalloc") && ok(cudaMalloc(&order, i32), "cudaMalloc") &&
      ok(cudaMalloc(&dense, dense_cells * sizeof(int64_t)), "cudaMalloc") &&
      ok(cudaMemcpy(tokens, host_tokens, i64, cudaMemcpyHostToDevice), "cudaMemcpy tokens") &&
      ok(cudaMemcpy(replicas, host_replicas, i32, cudaMemcpyHostToDevice), "cudaMemcpy replicas") &&
      ok(cudaMemset(dense, 0, dense_cells * sizeof(int64_t)), "cudaMemset")) {
    const int threads = 128;
    const int blocks = (num_experts + threads - 1) / threads;
    DispatchKernel<<<blocks, threads>>>(num_experts, num_ranks, tokens, replicas, capacity, local,
                                        dense, holders, residual, share, remainder, order);
    if (ok(cudaGetLastError(), "kernel launch") &&
        ok(cudaDeviceSynchronize(), "kernel execution")) {
      ok(cudaMemcpy(host_dense, dense, dense_cells * sizeof(int64_t), cudaMemcpyDeviceToHost),
         "cudaMemcpy flows");
    }
  }
  cudaFree(tokens);
  cudaFree(replicas);
  cudaFree(capacity);
  cudaFree(local);
  cudaFree(residual);
  cudaFree(share);
  cudaFree(remainder);
  cudaFree(holders);
  cudaFree(order);
  cudaFree(dense);
  return error;
}

}  // namespace plexus::moe::internal
