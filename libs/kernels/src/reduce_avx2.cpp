// AVX2 + F16C reduction kernels. This file is compiled with -mavx2 -mf16c and only called after
// a run-time CPU check (reduce.cpp); it instantiates no templates shared with other files, so no
// AVX2 code can leak into the portable paths through the linker.
#include <immintrin.h>

#include "plexus/kernels/reduce.hpp"
#include "plexus/kernels/simd_avx2.hpp"

namespace plexus::kernels {
namespace {

// x = first operand, y = second: each macro computes op(x, y) with the semantics the scalar
// fallback mirrors (min(x, y) = x < y ? x : y, ...). d is read from `local` (which may be dst).
#define PLEXUS_F32_LOOP(EXPR)                                                    \
  for (; i + 8 <= n; i += 8) {                                                   \
    const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(local) + i); \
    const __m256 s = _mm256_loadu_ps(reinterpret_cast<const float*>(src) + i);   \
    const __m256 x = src_first ? s : d;                                          \
    const __m256 y = src_first ? d : s;                                          \
    _mm256_storeu_ps(reinterpret_cast<float*>(dst) + i, CanonicalPs(EXPR));      \
  }

#define PLEXUS_F64_LOOP(EXPR)                                                      \
  for (; i + 4 <= n; i += 4) {                                                     \
    const __m256d d = _mm256_loadu_pd(reinterpret_cast<const double*>(local) + i); \
    const __m256d s = _mm256_loadu_pd(reinterpret_cast<const double*>(src) + i);   \
    const __m256d x = src_first ? s : d;                                           \
    const __m256d y = src_first ? d : s;                                           \
    _mm256_storeu_pd(reinterpret_cast<double*>(dst) + i, CanonicalPd(EXPR));       \
  }

#define PLEXUS_INT_LOOP(WIDTH, EXPR)                                                           \
  for (; i + (32 / WIDTH) <= n; i += 32 / WIDTH) {                                             \
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(local + i * WIDTH)); \
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * WIDTH));   \
    const __m256i x = src_first ? s : d;                                                       \
    const __m256i y = src_first ? d : s;                                                       \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * WIDTH), EXPR);                    \
  }

// NaN results become the canonical quiet NaN (as the scalar kernels do): which NaN operand an
// instruction returns depends on operand order, which the compiler may swap.
__m256 CanonicalPs(__m256 r) {
  return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                          _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
}
__m256d CanonicalPd(__m256d r) {
  return _mm256_blendv_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FF8000000000000LL)),
                          _mm256_cmp_pd(r, r, _CMP_UNORD_Q));
}

__m256 ApplyPs(ReduceOp op, __m256 x, __m256 y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return CanonicalPs(_mm256_add_ps(x, y));
    case ReduceOp::kProd:
      return CanonicalPs(_mm256_mul_ps(x, y));
    case ReduceOp::kMin:
      return CanonicalPs(_mm256_min_ps(x, y));
    case ReduceOp::kMax:
      return CanonicalPs(_mm256_max_ps(x, y));
  }
  return x;
}

// Eight wire elements (bf16 or f16) at p as f32, and back (round to nearest even). The wire
// type and the operation are template parameters of the loops below: a branch per vector in the
// loop body halved their throughput.
template <bool kBf16>
__m256 FromWireBits(__m128i h) {
  if constexpr (kBf16) {
    return WidenBf16(h);
  } else {
    return _mm256_cvtph_ps(h);
  }
}
template <bool kBf16>
__m256 LoadWire(const uint8_t* p) {
  return FromWireBits<kBf16>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <bool kBf16>
__m128i ToWireBits(__m256 v) {
  if constexpr (kBf16) {
    return StoreBf16Bits(v);
  } else {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}
template <ReduceOp kOp>
__m256 ApplyPsFixed(__m256 x, __m256 y) {
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    return CanonicalPs(_mm256_add_ps(x, y));
  } else if constexpr (kOp == ReduceOp::kProd) {
    return CanonicalPs(_mm256_mul_ps(x, y));
  } else if constexpr (kOp == ReduceOp::kMin) {
    return CanonicalPs(_mm256_min_ps(x, y));
  } else {
    return CanonicalPs(_mm256_max_ps(x, y));
  }
}

template <bool kBf16, bool kKeep>
size_t PackLoop(uint8_t* out, const float* in, size_t n, float* keep) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = ToWireBits<kBf16>(_mm256_loadu_ps(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    if constexpr (kKeep) _mm256_storeu_ps(keep + i, FromWireBits<kBf16>(h));
  }
  return i;
}

template <bool kBf16>
size_t UnpackLoop(float* out, const uint8_t* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadWire<kBf16>(in + 2 * i));
  return i;
}

template <bool kBf16, ReduceOp kOp, bool kSrcFirst>
size_t ReduceWireLoop(float* dst, const float* local, const uint8_t* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(local + i);
    const __m256 b = LoadWire<kBf16>(in + 2 * i);
    _mm256_storeu_ps(dst + i, kSrcFirst ? ApplyPsFixed<kOp>(b, a) : ApplyPsFixed<kOp>(a, b));
  }
  return i;
}

template <bool kBf16, ReduceOp kOp>
size_t ReduceWireOp(float* dst, const float* local, const uint8_t* in, size_t n, bool src_first) {
  return src_first ? ReduceWireLoop<kBf16, kOp, true>(dst, local, in, n)
                   : ReduceWireLoop<kBf16, kOp, false>(dst, local, in, n);
}

template <bool kBf16>
size_t ReduceWireType(ReduceOp op, float* dst, const float* local, const uint8_t* in, size_t n,
                      bool src_first) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return ReduceWireOp<kBf16, ReduceOp::kSum>(dst, local, in, n, src_first);
    case ReduceOp::kProd:
      return ReduceWireOp<kBf16, ReduceOp::kProd>(dst, local, in, n, src_first);
    case ReduceOp::kMin:
      return ReduceWireOp<kBf16, ReduceOp::kMin>(dst, local, in, n, src_first);
    case ReduceOp::kMax:
      return ReduceWireOp<kBf16, ReduceOp::kMax>(dst, local, in, n, src_first);
  }
  return 0;
}

}  // namespace

size_t ReduceAvx2(DataType dtype, ReduceOp op, uint8_t* dst, const uint8_t* local,
                  const uint8_t* src, size_t n, bool src_first) {
  size_t i = 0;
  switch (dtype) {
    case DataType::kF32:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_F32_LOOP(_mm256_add_ps(x, y));
          break;
        case ReduceOp::kProd:
          PLEXUS_F32_LOOP(_mm256_mul_ps(x, y));
          break;
        case ReduceOp::kMin:
          PLEXUS_F32_LOOP(_mm256_min_ps(x, y));
          break;
        case ReduceOp::kMax:
          PLEXUS_F32_LOOP(_mm256_max_ps(x, y));
          break;
      }
      return i;
    case DataType::kF64:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_F64_LOOP(_mm256_add_pd(x, y));
          break;
        case ReduceOp::kProd:
          PLEXUS_F64_LOOP(_mm256_mul_pd(x, y));
          break;
        case ReduceOp::kMin:
          PLEXUS_F64_LOOP(_mm256_min_pd(x, y));
          break;
        case ReduceOp::kMax:
          PLEXUS_F64_LOOP(_mm256_max_pd(x, y));
          break;
      }
      return i;
    case DataType::kF16:
      for (; i + 8 <= n; i += 8) {
        const __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(local + 2 * i)));
        const __m256 s =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
        const __m256 r = src_first ? ApplyPs(op, s, d) : ApplyPs(op, d, s);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                         _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      return i;
    case DataType::kBF16:
      for (; i + 8 <= n; i += 8) {
        const __m256 d = LoadBf16(local + 2 * i);
        const __m256 s = LoadBf16(src + 2 * i);
        const __m256 r = src_first ? ApplyPs(op, s, d) : ApplyPs(op, d, s);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), StoreBf16Bits(r));
      }
      return i;
    case DataType::kI32:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_INT_LOOP(4, _mm256_add_epi32(x, y));
          break;
        case ReduceOp::kProd:
          PLEXUS_INT_LOOP(4, _mm256_mullo_epi32(x, y));
          break;
        case ReduceOp::kMin:
          PLEXUS_INT_LOOP(4, _mm256_min_epi32(x, y));
          break;
        case ReduceOp::kMax:
          PLEXUS_INT_LOOP(4, _mm256_max_epi32(x, y));
          break;
      }
      return i;
    case DataType::kI64:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_INT_LOOP(8, _mm256_add_epi64(x, y));
          break;
        case ReduceOp::kMin:  // x < y ? x : y
          PLEXUS_INT_LOOP(8, _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(y, x)));
          break;
        case ReduceOp::kMax:
          PLEXUS_INT_LOOP(8, _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(x, y)));
          break;
        case ReduceOp::kProd:  // no 64-bit multiply in AVX2: scalar
          break;
      }
      return i;
    case DataType::kU8:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_INT_LOOP(1, _mm256_add_epi8(x, y));
          break;
        case ReduceOp::kMin:
          PLEXUS_INT_LOOP(1, _mm256_min_epu8(x, y));
          break;
        case ReduceOp::kMax:
          PLEXUS_INT_LOOP(1, _mm256_max_epu8(x, y));
          break;
        case ReduceOp::kProd:
          break;
      }
      return i;
    case DataType::kI8:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          PLEXUS_INT_LOOP(1, _mm256_add_epi8(x, y));
          break;
        case ReduceOp::kMin:
          PLEXUS_INT_LOOP(1, _mm256_min_epi8(x, y));
          break;
        case ReduceOp::kMax:
          PLEXUS_INT_LOOP(1, _mm256_max_epi8(x, y));
          break;
        case ReduceOp::kProd:
          break;
      }
      return i;
  }
  return i;
}

size_t PackWireAvx2(DataType wire, uint8_t* out, const float* in, size_t n, float* keep) {
  if (wire == DataType::kBF16) {
    return keep != nullptr ? PackLoop<true, true>(out, in, n, keep)
                           : PackLoop<true, false>(out, in, n, keep);
  }
  return keep != nullptr ? PackLoop<false, true>(out, in, n, keep)
                         : PackLoop<false, false>(out, in, n, keep);
}

size_t UnpackWireAvx2(DataType wire, float* out, const uint8_t* in, size_t n) {
  return wire == DataType::kBF16 ? UnpackLoop<true>(out, in, n) : UnpackLoop<false>(out, in, n);
}

size_t ReduceWireAvx2(DataType wire, ReduceOp op, float* dst, const float* local, const uint8_t* in,
                      size_t n, bool src_first) {
  return wire == DataType::kBF16 ? ReduceWireType<true>(op, dst, local, in, n, src_first)
                                 : ReduceWireType<false>(op, dst, local, in, n, src_first);
}

}  // namespace plexus::kernels
