// Device kernels (nvcc): the division that finishes an average of device buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace plexus::kernels {
namespace {

template <typename T>
__global__ void DivideKernel(T* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = data[i] / static_cast<T>(divisor);
}

__global__ void DivideHalfKernel(__half* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = __float2half_rn(__half2float(data[i]) / static_cast<float>(divisor));
}

__global__ void DivideBf16Kernel(__nv_bfloat16* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = __float2bfloat16_rn(__bfloat162float(data[i]) / static_cast<float>(divisor));
}

}  // namespace

// dtype is the numeric value of plexus::kernels::DataType (kept free of host headers so that
// nvcc compiles no Abseil code).
cudaError_t LaunchDivide(int dtype, void* data, size_t n, int divisor) {
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  switch (dtype) {
    case 0:  // kF32
      DivideKernel<<<blocks, threads>>>(static_cast<float*>(data), n, divisor);
      break;
    case 1:  // kF64
      DivideKernel<<<blocks, threads>>>(static_cast<double*>(data), n, divisor);
      break;
    case 2:  // kF16
      DivideHalfKernel<<<blocks, threads>>>(static_cast<__half*>(data), n, divisor);
      break;
    case 3:  // kBF16
      DivideBf16Kernel<<<blocks, threads>>>(static_cast<__nv_bfloat16*>(data), n, divisor);
      break;
    case 4:  // kI32
      DivideKernel<<<blocks, threads>>>(static_cast<int32_t*>(data), n, divisor);
      break;
    case 5:  // kI64
      DivideKernel<<<blocks, threads>>>(static_cast<int64_t*>(data), n, divisor);
      break;
    case 6:  // kU8
      DivideKernel<<<blocks, threads>>>(static_cast<uint8_t*>(data), n, divisor);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace plexus::kernels
