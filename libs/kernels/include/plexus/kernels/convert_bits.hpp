// The scalar f16 and bf16 conversions as inline functions that compile for the host and, under
// nvcc, for the device, so that every executor (CPU kernels, the restructuring engine's CUDA
// kernels) rounds with the same code. Round to nearest even; f32 -> f16 turns values beyond 65504
// into infinities and NaNs into quiet NaNs keeping their top payload bits, as F16C does; f32 ->
// bf16 keeps NaNs quiet. Host code calls them through reduce.hpp's HalfToFloat & co.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PLEXUS_HOST_DEVICE __host__ __device__
#else
#define PLEXUS_HOST_DEVICE
#endif

namespace plexus::kernels::bits {

PLEXUS_HOST_DEVICE inline float AsFloat(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

PLEXUS_HOST_DEVICE inline uint32_t AsBits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

PLEXUS_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise.
    int e = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FF) << 13);
  }
  return AsFloat(bits);
}

PLEXUS_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = AsBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) {
    if (ax == 0x7F800000) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((ax >> 13) & 0x3FF));  // quiet NaN, as F16C
  }
  if (ax >= 0x477FF000) return sign | 0x7C00;  // rounds to infinity
  if (ax < 0x38800000) {                       // subnormal or zero half
    if (ax <= 0x33000000) return sign;
    const int e = static_cast<int>(ax >> 23);
    const uint32_t m = (ax & 0x7FFFFF) | 0x800000;
    const int shift = 126 - e;
    uint32_t k = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1))) ++k;
    return static_cast<uint16_t>(sign | k);
  }
  uint32_t h = (ax >> 13) - (112u << 10);
  const uint32_t rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

PLEXUS_HOST_DEVICE inline float Bf16ToFloat(uint16_t h) {
  return AsFloat(static_cast<uint32_t>(h) << 16);
}

PLEXUS_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  uint32_t x = AsBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace plexus::kernels::bits
