#include "tile.hpp"

#include <emmintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/interpreter.hpp"

namespace plexus::restructure::internal {
namespace {

template <typename T>
void LoadInts(const uint8_t* p, int64_t stride, size_t n, float* out) {
  if (stride == 1) {
    const T* in = reinterpret_cast<const T*>(p);
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, in + i, sizeof v);
      out[i] = static_cast<float>(v);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + static_cast<int64_t>(i) * stride * static_cast<int64_t>(sizeof(T)),
                sizeof v);
    out[i] = static_cast<float>(v);
  }
}

// Round to nearest even as std::nearbyint does in the default environment, without a call:
// below 2^23 adding and subtracting 2^23 leaves the rounded integer; from 2^23 up every float is
// one. The sign is put back so that -0.3 gives -0, as nearbyint.
inline float RoundEven(float v) {
  constexpr float kTwo23 = 8388608.0f;
  const float a = std::fabs(v);
  const float r = a < kTwo23 ? (a + kTwo23) - kTwo23 : a;
  return std::copysign(r, v);
}

// The interpreter's RoundSaturate: nearest even, saturated to T, NaN -> 0.
template <typename T>
inline T RoundSaturate(float v) {
  constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
  const float r = RoundEven(v);
  if (r != r) return 0;
  if (r <= lo) return std::numeric_limits<T>::min();
  if (r >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

template <typename T>
void StoreInts(uint8_t* p, int64_t stride, size_t n, const float* v) {
  const int64_t step = stride * static_cast<int64_t>(sizeof(T));
  for (size_t i = 0; i < n; ++i) {
    const T x = RoundSaturate<T>(v[i]);
    std::memcpy(p + static_cast<int64_t>(i) * step, &x, sizeof x);
  }
}

// ln(x) of a normal, finite, positive x (Cephes' logf: x = 2^e m with m in [sqrt(1/2), sqrt(2)),
// ln(m) by a degree-9 polynomial in m - 1, e ln 2 added in two parts).
inline float LogPositive(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  int e = static_cast<int>((bits >> 23) & 0xff) - 126;
  const uint32_t mant = (bits & 0x007fffffu) | 0x3f000000u;  // [0.5, 1)
  float m;
  std::memcpy(&m, &mant, 4);
  const bool low = m < 0.707106781186547524f;
  e -= low ? 1 : 0;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  const float fe = static_cast<float>(e);
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  float r = m + y;
  r += 0.693359375f * fe;
  return r;
}

constexpr float kLog10E = 0.434294481903251827651f;

inline bool Ordinary(float x) {
  // Normal, finite and positive: what the polynomial handles; everything else goes to std::log10.
  return x >= std::numeric_limits<float>::min() && x <= std::numeric_limits<float>::max();
}

}  // namespace

float Log10(float x) { return Ordinary(x) ? LogPositive(x) * kLog10E : std::log10(x); }

namespace {

// LogPositive on four lanes (SSE2, the x86-64 baseline): the same operations in the same order,
// so every lane's result has the scalar function's bits.
inline __m128 LogPositive4(__m128 x) {
  const __m128i bits = _mm_castps_si128(x);
  __m128i e = _mm_sub_epi32(_mm_and_si128(_mm_srli_epi32(bits, 23), _mm_set1_epi32(0xff)),
                            _mm_set1_epi32(126));
  __m128 m = _mm_castsi128_ps(
      _mm_or_si128(_mm_and_si128(bits, _mm_set1_epi32(0x007fffff)), _mm_set1_epi32(0x3f000000)));
  const __m128 low = _mm_cmplt_ps(m, _mm_set1_ps(0.707106781186547524f));
  e = _mm_add_epi32(e, _mm_castps_si128(low));  // low lanes are all ones: e - 1
  const __m128 one = _mm_set1_ps(1.0f);
  const __m128 twice = _mm_sub_ps(_mm_add_ps(m, m), one);
  const __m128 once = _mm_sub_ps(m, one);
  m = _mm_or_ps(_mm_and_ps(low, twice), _mm_andnot_ps(low, once));
  const __m128 z = _mm_mul_ps(m, m);
  auto step = [&](__m128 y, float c) { return _mm_add_ps(_mm_mul_ps(y, m), _mm_set1_ps(c)); };
  __m128 y = _mm_set1_ps(7.0376836292e-2f);
  y = step(y, -1.1514610310e-1f);
  y = step(y, 1.1676998740e-1f);
  y = step(y, -1.2420140846e-1f);
  y = step(y, 1.4249322787e-1f);
  y = step(y, -1.6668057665e-1f);
  y = step(y, 2.0000714765e-1f);
  y = step(y, -2.4999993993e-1f);
  y = step(y, 3.3333331174e-1f);
  y = _mm_mul_ps(_mm_mul_ps(y, m), z);
  const __m128 fe = _mm_cvtepi32_ps(e);
  y = _mm_add_ps(y, _mm_mul_ps(_mm_set1_ps(-2.12194440e-4f), fe));
  y = _mm_add_ps(y, _mm_mul_ps(_mm_set1_ps(-0.5f), z));
  __m128 r = _mm_add_ps(m, y);
  r = _mm_add_ps(r, _mm_mul_ps(_mm_set1_ps(0.693359375f), fe));
  return r;
}

void Log10Tile(const float* a, size_t n, float* out) {
  size_t i = 0;
  const __m128 lo = _mm_set1_ps(std::numeric_limits<float>::min());
  const __m128 hi = _mm_set1_ps(std::numeric_limits<float>::max());
  const __m128 one = _mm_set1_ps(1.0f), log10e = _mm_set1_ps(kLog10E);
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_loadu_ps(a + i);
    const __m128 ordinary = _mm_and_ps(_mm_cmpge_ps(x, lo), _mm_cmple_ps(x, hi));
    const __m128 safe = _mm_or_ps(_mm_and_ps(ordinary, x), _mm_andnot_ps(ordinary, one));
    _mm_storeu_ps(out + i, _mm_mul_ps(LogPositive4(safe), log10e));
    if (const int special = _mm_movemask_ps(ordinary) ^ 0xf; special != 0) {
      for (int k = 0; k < 4; ++k) {
        if (special & (1 << k)) out[i + k] = std::log10(a[i + k]);
      }
    }
  }
  for (; i < n; ++i) out[i] = Log10(a[i]);
}

}  // namespace

const float* LoadTile(DataType dtype, const uint8_t* p, int64_t stride, size_t n, float* scratch) {
  switch (dtype) {
    case DataType::kF32:
      if (stride == 1) return reinterpret_cast<const float*>(p);
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(scratch + i, p + static_cast<int64_t>(i) * stride * 4, 4);
      }
      return scratch;
    case DataType::kF16:
    case DataType::kBF16:
      if (stride == 1) {
        kernels::UnpackWire(dtype, scratch, p, n);
      } else {
        for (size_t i = 0; i < n; ++i) {
          scratch[i] = LoadElement(dtype, p + static_cast<int64_t>(i) * stride * 2);
        }
      }
      return scratch;
    case DataType::kI32:
      LoadInts<int32_t>(p, stride, n, scratch);
      return scratch;
    case DataType::kI8:
      LoadInts<int8_t>(p, stride, n, scratch);
      return scratch;
    case DataType::kU8:
      LoadInts<uint8_t>(p, stride, n, scratch);
      return scratch;
    case DataType::kF64:
    case DataType::kI64:
      break;  // refused by Validate
  }
  return scratch;
}

void StoreTile(DataType dtype, uint8_t* p, int64_t stride, size_t n, const float* v) {
  switch (dtype) {
    case DataType::kF32:
      if (stride == 1) {
        if (reinterpret_cast<const uint8_t*>(v) != p) std::memcpy(p, v, n * 4);
        return;
      }
      for (size_t i = 0; i < n; ++i)
        std::memcpy(p + static_cast<int64_t>(i) * stride * 4, v + i, 4);
      return;
    case DataType::kF16:
    case DataType::kBF16:
      if (stride == 1) {
        kernels::PackWire(dtype, p, v, n, nullptr);
        return;
      }
      for (size_t i = 0; i < n; ++i)
        StoreElement(dtype, p + static_cast<int64_t>(i) * stride * 2, v[i]);
      return;
    case DataType::kI32:
      StoreInts<int32_t>(p, stride, n, v);
      return;
    case DataType::kI8:
      StoreInts<int8_t>(p, stride, n, v);
      return;
    case DataType::kU8:
      StoreInts<uint8_t>(p, stride, n, v);
      return;
    case DataType::kF64:
    case DataType::kI64:
      return;  // refused by Validate
  }
}

void ApplyTile(Op op, const float* a, const float* b, float scalar, size_t n, float* out) {
  switch (op) {
    case Op::kCopy:
    case Op::kCast:
    case Op::kMaxPool:
      if (out != a) std::memcpy(out, a, n * 4);
      return;
    case Op::kAdd:
      if (b != nullptr) {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] + scalar;
      }
      return;
    case Op::kMul:
      if (b != nullptr) {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] * scalar;
      }
      return;
    case Op::kDiv:
      if (b != nullptr) {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] / b[i];
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] / scalar;
      }
      return;
    case Op::kPow:
      if (b == nullptr && scalar == 2.0f) {
        for (size_t i = 0; i < n; ++i) out[i] = a[i] * a[i];
      } else if (b == nullptr) {
        for (size_t i = 0; i < n; ++i) out[i] = std::pow(a[i], scalar);
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = std::pow(a[i], b[i]);
      }
      return;
    case Op::kLog10:
      Log10Tile(a, n, out);
      return;
  }
}

void MaxTile(const float* v, size_t n, float* m) {
  for (size_t i = 0; i < n; ++i) {
    const float x = v[i], y = m[i];
    m[i] = (y != y) ? y : ((x != x || x > y) ? x : y);
  }
}

}  // namespace plexus::restructure::internal
