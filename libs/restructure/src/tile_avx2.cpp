// The tile kernels compiled with AVX2 and F16C (CMakeLists.txt); tile.cpp calls them when the
// CPU has both.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "plexus/kernels/reduce.hpp"
#include "plexus/kernels/simd_avx2.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "tile.hpp"

namespace plexus::restructure::internal::avx2 {
#include "tile_impl.inc"

namespace {

constexpr size_t kRegs = 4;           // vectors of a chain's values in flight
constexpr size_t kChunk = 8 * kRegs;  // elements per round of the chain
static_assert(kChunk <= 32, "Log10Values keeps one bit per element in a uint32_t");
using Values = __m256[kRegs];  // kept in registers: the loops below unroll

// kernels::DataTypeSize, usable in templates.
constexpr size_t SizeOf(DataType t) {
  return t == DataType::kF32 || t == DataType::kI32    ? 4
         : t == DataType::kF16 || t == DataType::kBF16 ? 2
                                                       : 1;
}

template <DataType T>
__m256 LoadVector(const uint8_t* p) {
  if constexpr (T == DataType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  if constexpr (T == DataType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  if constexpr (T == DataType::kBF16) return kernels::LoadBf16(p);
  if constexpr (T == DataType::kI32) {
    return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Eight bytes widened: exact, as static_cast<float> of each.
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (T == DataType::kU8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

__m128i Wire(DataType t, __m256 v) {
  return t == DataType::kBF16 ? kernels::StoreBf16Bits(v)
                              : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <DataType T>
void StoreVector(uint8_t* p, __m256 v) {
  if constexpr (T == DataType::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Wire(T, v));
  }
}

// Log10Tile on a chunk: the polynomial on every vector (no branch between them, so that their
// dependency chains overlap), then std::log10 for the lanes it does not cover.
[[gnu::always_inline]] inline void Log10Values(Values& v) {
  const __m256 lo = _mm256_set1_ps(std::numeric_limits<float>::min());
  const __m256 hi = _mm256_set1_ps(std::numeric_limits<float>::max());
  Values in;
  uint32_t special = 0;
  for (size_t k = 0; k < kRegs; ++k) {
    in[k] = v[k];
    const __m256 ordinary =
        _mm256_and_ps(_mm256_cmp_ps(v[k], lo, _CMP_GE_OQ), _mm256_cmp_ps(v[k], hi, _CMP_LE_OQ));
    special |= static_cast<uint32_t>(_mm256_movemask_ps(ordinary) ^ 0xff) << (8 * k);
    v[k] = _mm256_blendv_ps(_mm256_set1_ps(1.0f), v[k], ordinary);
  }
  for (__m256& x : v) x = _mm256_mul_ps(LogPositive8(x), _mm256_set1_ps(kLog10E));
  if (special == 0) return;
  alignas(32) float x[kChunk], r[kChunk];
  for (size_t k = 0; k < kRegs; ++k) {
    _mm256_store_ps(x + 8 * k, in[k]);
    _mm256_store_ps(r + 8 * k, v[k]);
  }
  for (size_t i = 0; i < kChunk; ++i) {
    if (special & (uint32_t{1} << i)) r[i] = std::log10(x[i]);
  }
  for (size_t k = 0; k < kRegs; ++k) v[k] = _mm256_load_ps(r + 8 * k);
}

// Inlined into each loop, so that the values stay in registers across the ops.
// Elements [i, i + kChunk) of the run.
[[gnu::always_inline]] inline void ApplyChain(const ChainOp* ops, size_t n_ops, Values& v,
                                              size_t i) {
  for (size_t o = 0; o < n_ops; ++o) {
    Values s;  // the second operand: the scalar, or the operand's elements
    if (ops[o].operand != nullptr) {
      for (size_t k = 0; k < kRegs; ++k) s[k] = _mm256_loadu_ps(ops[o].operand + i + 8 * k);
    } else {
      for (__m256& x : s) x = _mm256_set1_ps(ops[o].scalar);
    }
    switch (ops[o].op) {
      case Op::kAdd:
        for (size_t k = 0; k < kRegs; ++k) v[k] = _mm256_add_ps(v[k], s[k]);
        break;
      case Op::kMul:
        for (size_t k = 0; k < kRegs; ++k) v[k] = _mm256_mul_ps(v[k], s[k]);
        break;
      case Op::kDiv:
        for (size_t k = 0; k < kRegs; ++k) v[k] = _mm256_div_ps(v[k], s[k]);
        break;
      case Op::kPow:  // the exponent 2 only (ChainSupported): x * x, as ApplyTile
        for (__m256& x : v) x = _mm256_mul_ps(x, x);
        break;
      case Op::kLog10:
        Log10Values(v);
        break;
      default:  // kCopy, kCast: the value as it is
        break;
    }
    if (ops[o].round == DataType::kF16) {
      for (__m256& x : v) x = _mm256_cvtph_ps(Wire(DataType::kF16, x));
    } else if (ops[o].round == DataType::kBF16) {
      for (__m256& x : v) x = kernels::WidenBf16(Wire(DataType::kBF16, x));
    }
  }
}

// Elements [i, i + n) of the run, fewer than a chunk, through the tile kernels (the same bits).
void ChainTail(DataType in, const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out,
               uint8_t* dst, size_t i, size_t n) {
  alignas(32) float v[kChunk];
  const float* x = LoadTile(in, src + i * SizeOf(in), 1, n, v);
  if (x != v) CopyTile(v, x, n);
  for (size_t o = 0; o < n_ops; ++o) {
    const float* b = ops[o].operand != nullptr ? ops[o].operand + i : nullptr;
    ApplyTile(ops[o].op, v, b, ops[o].scalar, n, v);
    RoundTile(ops[o].round, v, n);
  }
  StoreTile(out, dst + i * SizeOf(out), 1, n, v);
}

template <DataType In, DataType Out>
void ChainLoop(const uint8_t* src, const ChainOp* ops, size_t n_ops, uint8_t* dst, size_t n) {
  constexpr size_t in_size = SizeOf(In), out_size = SizeOf(Out);
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    Values v;
    for (size_t k = 0; k < kRegs; ++k) v[k] = LoadVector<In>(src + (i + 8 * k) * in_size);
    ApplyChain(ops, n_ops, v, i);
    for (size_t k = 0; k < kRegs; ++k) StoreVector<Out>(dst + (i + 8 * k) * out_size, v[k]);
  }
  if (i < n) ChainTail(In, src, ops, n_ops, Out, dst, i, n - i);
}

template <DataType In>
bool ChainTo(const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out, uint8_t* dst,
             size_t n) {
  switch (out) {
    case DataType::kF32:
      ChainLoop<In, DataType::kF32>(src, ops, n_ops, dst, n);
      return true;
    case DataType::kF16:
      ChainLoop<In, DataType::kF16>(src, ops, n_ops, dst, n);
      return true;
    case DataType::kBF16:
      ChainLoop<In, DataType::kBF16>(src, ops, n_ops, dst, n);
      return true;
    default:
      return false;
  }
}

bool ChainSupported(const ChainOp* ops, size_t n_ops, DataType out) {
  if (out != DataType::kF32 && out != DataType::kF16 && out != DataType::kBF16) return false;
  for (size_t o = 0; o < n_ops; ++o) {
    const ChainOp& c = ops[o];
    if (c.op == Op::kMaxPool || (c.op == Op::kPow && (c.operand != nullptr || c.scalar != 2.0f))) {
      return false;
    }
    if (c.round != DataType::kF32 && c.round != DataType::kF16 && c.round != DataType::kBF16) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool RunChain(DataType in, const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out,
              uint8_t* dst, size_t n) {
  if (!ChainSupported(ops, n_ops, out)) return false;
  switch (in) {
    case DataType::kF32:
      return ChainTo<DataType::kF32>(src, ops, n_ops, out, dst, n);
    case DataType::kF16:
      return ChainTo<DataType::kF16>(src, ops, n_ops, out, dst, n);
    case DataType::kBF16:
      return ChainTo<DataType::kBF16>(src, ops, n_ops, out, dst, n);
    case DataType::kI32:
      return ChainTo<DataType::kI32>(src, ops, n_ops, out, dst, n);
    case DataType::kI8:
      return ChainTo<DataType::kI8>(src, ops, n_ops, out, dst, n);
    case DataType::kU8:
      return ChainTo<DataType::kU8>(src, ops, n_ops, out, dst, n);
    default:
      return false;
  }
}

}  // namespace plexus::restructure::internal::avx2
