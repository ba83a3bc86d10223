// Device kernels (nvcc, embedded as a fatbin; launched by src/device_kernels.cpp through the
// driver): the division that finishes an average of device buffers. extern "C" so that the
// launcher finds each by a plain name.
#include <cstddef>
#include <cstdint>

#include "plexus/kernels/convert_bits.hpp"

namespace {

template <typename T>
__device__ void Divide(T* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = data[i] / static_cast<T>(divisor);
}

// The host divides a NaN into itself, and the reductions before leave only the canonical quiet
// NaN; the GPU's division returns its own NaN (all ones): the host's bits instead.
__device__ float HostNaN(float v) { return v != v ? __int_as_float(0x7fc00000) : v; }
__device__ double HostNaN(double v) {
  return v != v ? __longlong_as_double(0x7ff8000000000000LL) : v;
}

}  // namespace

extern "C" {

__global__ void plexus_divide_f32(float* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = HostNaN(data[i] / static_cast<float>(divisor));
}
__global__ void plexus_divide_f64(double* data, size_t n, int divisor) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = HostNaN(data[i] / static_cast<double>(divisor));
}
__global__ void plexus_divide_i32(int32_t* data, size_t n, int divisor) {
  Divide(data, n, divisor);
}
__global__ void plexus_divide_i64(int64_t* data, size_t n, int divisor) {
  Divide(data, n, divisor);
}
__global__ void plexus_divide_u8(uint8_t* data, size_t n, int divisor) { Divide(data, n, divisor); }
__global__ void plexus_divide_i8(int8_t* data, size_t n, int divisor) { Divide(data, n, divisor); }

// f16 and bf16 through the host's conversions (plexus/kernels/convert_bits.hpp).
__global__ void plexus_divide_f16(uint16_t* data, size_t n, int divisor) {
  namespace bits = plexus::kernels::bits;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    data[i] = bits::FloatToHalf(HostNaN(bits::HalfToFloat(data[i]) / static_cast<float>(divisor)));
  }
}

__global__ void plexus_divide_bf16(uint16_t* data, size_t n, int divisor) {
  namespace bits = plexus::kernels::bits;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    data[i] = bits::FloatToBf16(HostNaN(bits::Bf16ToFloat(data[i]) / static_cast<float>(divisor)));
  }
}

}  // extern "C"
