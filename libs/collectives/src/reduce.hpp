// Element-wise reduction kernels: AVX2 (with F16C) chosen at run time, scalar fallback. Both give
// bit-identical results, so a job mixing CPUs still agrees on every element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plexus/collectives/types.hpp"

namespace plexus::collectives::internal {

// dst[i] = dst[i] op src[i] (src_first: src[i] op dst[i]) for n elements; kAvg reduces as kSum
// (DivideInPlace finishes it). f16/bf16 are computed in f32 and rounded to nearest even.
// Pointers need no alignment; dst and src must not overlap.
void ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, bool src_first);

// data[i] /= divisor (integer division for integer types): the last step of kAvg.
void DivideInPlace(DataType dtype, void* data, size_t n, int divisor);

// Whether ReduceInto uses the AVX2 kernels (CPU support, and not disabled).
bool Avx2Active();
// Tests: force the scalar kernels (false) or allow AVX2 again (true). Returns the previous value.
bool SetAvx2Allowed(bool allowed);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);

// The AVX2 kernels (reduce_avx2.cpp, compiled with -mavx2 -mf16c): process a prefix of the
// elements and return how many they handled (the caller finishes the tail). Call only when the
// CPU supports AVX2 and F16C.
size_t ReduceAvx2(DataType dtype, ReduceOp op, uint8_t* dst, const uint8_t* src, size_t n,
                  bool src_first);

}  // namespace plexus::collectives::internal
