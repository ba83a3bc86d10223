// AVX2 + F16C kernels of kernels.hpp. Compiled with -mavx2 -mf16c -ffp-contract=off and only
// called after the collectives' run-time CPU check; instantiates nothing shared with portable
// files. Each loop mirrors kernels.cpp's scalar code operation by operation.
#include <immintrin.h>

#include <cstdint>

#include "kernels.hpp"
#include "plexus/kernels/simd_avx2.hpp"  // the kernels' bf16 <-> f32 lanes

namespace plexus::aggregation::internal {
namespace {

using plexus::kernels::LoadBf16;
using plexus::kernels::StoreBf16Bits;

bool Aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// A prefetch of the line `elements` floats after p; the address is computed as an integer since it
// may lie past the end of the array (a prefetch never faults).
void PrefetchAhead(const float* p, size_t elements) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + elements * 4),
               _MM_HINT_T0);
}

__m256 LoadWire(const uint8_t* p, DataType dtype, size_t i) {
  switch (dtype) {
    case DataType::kBF16:
      return LoadBf16(p + 2 * i);
    case DataType::kF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    default:
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
  }
}

void StoreF32(float* p, __m256 v, bool nt) {
  if (nt) {
    _mm256_stream_ps(p, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

void StoreWire(uint8_t* p, DataType dtype, size_t i, __m256 v, bool nt) {
  __m128i h;
  switch (dtype) {
    case DataType::kBF16:
      h = StoreBf16Bits(v);
      break;
    case DataType::kF16:
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      break;
    default:
      StoreF32(reinterpret_cast<float*>(p) + i, v, nt);
      return;
  }
  auto* dst = reinterpret_cast<__m128i*>(p + 2 * i);
  if (nt) {
    _mm_stream_si128(dst, h);
  } else {
    _mm_storeu_si128(dst, h);
  }
}

// `nt` streams only the stores to `out`: w, m and v were loaded a moment before, so their lines
// are in L1 and a streaming store would have to evict them again (a fraction of the cached
// stores' speed; docs/measurements/aggregation.md); `out` is written and never read, where a
// streaming store saves the read for ownership of every line.
template <OptimizerKind kKind>
size_t OptimizerLoop(const StepScalars& s, float* w, const float* g, float* m, float* v,
                     uint8_t* out, DataType out_dtype, size_t n, bool nt) {
  const __m256 rescale = _mm256_set1_ps(s.rescale);
  const __m256 wd = _mm256_set1_ps(s.weight_decay);
  const __m256 lr = _mm256_set1_ps(s.lr);
  const __m256 mu = _mm256_set1_ps(s.momentum);
  const __m256 b1 = _mm256_set1_ps(s.beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2);
  const __m256 omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.epsilon);
  const __m256 adam_lr = _mm256_set1_ps(s.adam_lr);
  // One vector of 8 elements.
  auto step8 = [&](size_t i) __attribute__((always_inline)) {
    __m256 wi = _mm256_loadu_ps(w + i);
    const __m256 gp =
        _mm256_add_ps(_mm256_mul_ps(rescale, _mm256_loadu_ps(g + i)), _mm256_mul_ps(wd, wi));
    if constexpr (kKind == OptimizerKind::kSgd) {
      wi = _mm256_sub_ps(wi, _mm256_mul_ps(lr, gp));
    } else if constexpr (kKind == OptimizerKind::kMomentum) {
      const __m256 mi = _mm256_add_ps(_mm256_mul_ps(mu, _mm256_loadu_ps(m + i)), gp);
      StoreF32(m + i, mi, false);
      wi = _mm256_sub_ps(wi, _mm256_mul_ps(lr, mi));
    } else if constexpr (kKind == OptimizerKind::kNesterov) {
      const __m256 mi = _mm256_add_ps(_mm256_mul_ps(mu, _mm256_loadu_ps(m + i)), gp);
      StoreF32(m + i, mi, false);
      const __m256 u = _mm256_add_ps(gp, _mm256_mul_ps(mu, mi));
      wi = _mm256_sub_ps(wi, _mm256_mul_ps(lr, u));
    } else {
      const __m256 mi =
          _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gp));
      const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                      _mm256_mul_ps(omb2, _mm256_mul_ps(gp, gp)));
      StoreF32(m + i, mi, false);
      StoreF32(v + i, vi, false);
      const __m256 step = _mm256_div_ps(mi, _mm256_add_ps(_mm256_sqrt_ps(vi), eps));
      wi = _mm256_sub_ps(wi, _mm256_mul_ps(adam_lr, step));
    }
    StoreF32(w + i, wi, false);
    if (out != nullptr) StoreWire(out, out_dtype, i, wi, nt);
  };
  // Two vectors per iteration and a software prefetch of every input stream kPrefetch elements
  // ahead: Adam's square root and division make a long chain per vector, and with 4 + 4 streams
  // the loads of the next lines must be under way while it runs (a gain for Adam, neutral for
  // the others; docs/measurements/aggregation.md). Prefetches never fault, so running past the
  // end of the arrays is harmless (PrefetchAhead).
  constexpr size_t kPrefetch = 256;  // 1 KiB: 16 lines per stream
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(w + i, kPrefetch);
    PrefetchAhead(g + i, kPrefetch);
    if constexpr (kKind != OptimizerKind::kSgd) PrefetchAhead(m + i, kPrefetch);
    if constexpr (kKind == OptimizerKind::kAdam) PrefetchAhead(v + i, kPrefetch);
    step8(i);
    step8(i + 8);
  }
  for (; i + 8 <= n; i += 8) step8(i);
  return i;
}

}  // namespace

size_t AccumulateHalfAvx2(float* dst, const uint8_t* src, DataType dtype, size_t n, bool first) {
  size_t i = 0;
  if (first) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadWire(src, dtype, i));
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), LoadWire(src, dtype, i)));
    }
  }
  return i;
}

size_t ApplyOptimizerAvx2(OptimizerKind kind, const StepScalars& s, float* w, const float* g,
                          float* m, float* v, uint8_t* out, DataType out_dtype, size_t n,
                          bool non_temporal) {
  // Only `out` is streamed (OptimizerLoop); streaming stores need it aligned to its vector width.
  const bool nt =
      non_temporal && out != nullptr && Aligned(out, out_dtype == DataType::kF32 ? 32 : 16);
  size_t i = 0;
  switch (kind) {
    case OptimizerKind::kSgd:
      i = OptimizerLoop<OptimizerKind::kSgd>(s, w, g, m, v, out, out_dtype, n, nt);
      break;
    case OptimizerKind::kMomentum:
      i = OptimizerLoop<OptimizerKind::kMomentum>(s, w, g, m, v, out, out_dtype, n, nt);
      break;
    case OptimizerKind::kNesterov:
      i = OptimizerLoop<OptimizerKind::kNesterov>(s, w, g, m, v, out, out_dtype, n, nt);
      break;
    case OptimizerKind::kAdam:
      i = OptimizerLoop<OptimizerKind::kAdam>(s, w, g, m, v, out, out_dtype, n, nt);
      break;
  }
  if (nt) _mm_sfence();
  return i;
}

size_t StreamAddAvx2(float* c, const float* a, const float* b, size_t n, bool non_temporal) {
  const bool nt = non_temporal && Aligned(c, 32);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    StoreF32(c + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), nt);
  }
  if (nt) _mm_sfence();
  return i;
}

template <int kArrays>
size_t StreamUpdateLoop(float* const* rmw, const float* g, float* out, size_t n, bool nt) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    __m256 first = gi;
    for (int a = 0; a < kArrays; ++a) {
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(rmw[a] + i), gi);
      _mm256_storeu_ps(rmw[a] + i, x);
      if (a == 0) first = x;
    }
    StoreF32(out + i, first, nt);
  }
  return i;
}

size_t StreamUpdateAvx2(float* const* rmw, int arrays, const float* g, float* out, size_t n,
                        bool non_temporal) {
  const bool nt = non_temporal && Aligned(out, 32);
  size_t i = 0;
  switch (arrays) {
    case 1:
      i = StreamUpdateLoop<1>(rmw, g, out, n, nt);
      break;
    case 2:
      i = StreamUpdateLoop<2>(rmw, g, out, n, nt);
      break;
    case 3:
      i = StreamUpdateLoop<3>(rmw, g, out, n, nt);
      break;
    default:
      break;
  }
  if (nt) _mm_sfence();
  return i;
}

}  // namespace plexus::aggregation::internal
