// bf16 <-> f32 conversions of eight lanes, shared by every AVX2 kernel (the collectives' reduce
// and the aggregation library's optimizers). Include ONLY from files compiled with -mavx2 -mf16c
// (their callers check the CPU at run time); internal linkage keeps these copies out of the
// portable files at link time.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace plexus::kernels {
namespace {

// Eight bf16 values (their bits) as f32: exact.
inline __m256 WidenBf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Eight bf16 values at p (unaligned) as f32.
inline __m256 LoadBf16(const uint8_t* p) {
  return WidenBf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Round to nearest even; NaNs keep their top bits and become quiet (as FloatToBf16).
inline __m128i StoreBf16Bits(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // packus works per 128-bit lane: gather the low halves of both lanes.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

}  // namespace
}  // namespace plexus::kernels
