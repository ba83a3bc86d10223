// Device kernels (nvcc, embedded as a fatbin; launched by src/device_kernels.cpp through the
// driver): the division that finishes an average of device buffers. extern "C" so that the
// launcher finds each by a plain name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace {

template <typename T>
__device__ void Divide(T* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = data[i] / static_cast<T>(divisor);
}

}  // namespace

extern "C" {

__global__ void plexus_divide_f32(float* data, size_t n, int divisor) { Divide(data, n, divisor); }
__global__ void plexus_divide_f64(double* data, size_t n, int divisor) { Divide(data, n, divisor); }
__global__ void plexus_divide_i32(int32_t* data, size_t n, int divisor) {
  Divide(data, n, divisor);
}
__global__ void plexus_divide_i64(int64_t* data, size_t n, int divisor) {
  Divide(data, n, divisor);
}
__global__ void plexus_divide_u8(uint8_t* data, size_t n, int divisor) { Divide(data, n, divisor); }
__global__ void plexus_divide_i8(int8_t* data, size_t n, int divisor) { Divide(data, n, divisor); }

__global__ void plexus_divide_f16(__half* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = __float2half_rn(__half2float(data[i]) / static_cast<float>(divisor));
}

__global__ void plexus_divide_bf16(__nv_bfloat16* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = __float2bfloat16_rn(__bfloat162float(data[i]) / static_cast<float>(divisor));
}

}  // extern "C"
