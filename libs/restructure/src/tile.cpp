#include "tile.hpp"

#include <emmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/interpreter.hpp"

namespace plexus::restructure::internal {
namespace generic {
#include "tile_impl.inc"
}  // namespace generic

// The AVX2 build of the same kernels (tile_avx2.cpp).
namespace avx2 {
const float* LoadTile(DataType dtype, const uint8_t* p, int64_t stride, size_t n, float* scratch);
void StoreTile(DataType dtype, uint8_t* p, int64_t stride, size_t n, const float* v);
void ApplyTile(Op op, const float* a, const float* b, float scalar, size_t n, float* out);
void MaxTile(const float* v, size_t n, float* m);
void Max2Tile(const float* m, const float* v, size_t n, float* out);
void Max4Tile(const float* a, const float* b, const float* c, const float* d, size_t n, float* out);
void GatherTile(const float* src, const int32_t* idx, size_t n, float* out);
void CompactRuns(const float* src, int64_t run, int64_t period, int64_t runs, float* out);
void TransposeStrip4(const uint8_t* src, int64_t sq, uint8_t* dst, int64_t dp, int64_t ni,
                     int64_t nj);
bool RunChain(DataType in, const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out,
              uint8_t* dst, size_t n);
void CopyTile(float* dst, const float* src, size_t n);
}  // namespace avx2

namespace {
// The kernels' own run-time choice (CPU support, and not disabled for tests).
bool UseAvx2() { return kernels::Avx2Active(); }
}  // namespace

float Log10(float x) { return generic::Log10One(x); }

void StreamCopy(uint8_t* dst, const void* src, size_t bytes) {
  const auto* s = static_cast<const uint8_t*>(src);
  size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  head = std::min(head, bytes);
  std::memcpy(dst, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(dst + i, s + i, bytes - i);
}

void StreamFence() { _mm_sfence(); }

const float* LoadTile(DataType dtype, const uint8_t* p, int64_t stride, size_t n, float* scratch) {
  return UseAvx2() ? avx2::LoadTile(dtype, p, stride, n, scratch)
                   : generic::LoadTile(dtype, p, stride, n, scratch);
}

void StoreTile(DataType dtype, uint8_t* p, int64_t stride, size_t n, const float* v) {
  if (UseAvx2()) return avx2::StoreTile(dtype, p, stride, n, v);
  generic::StoreTile(dtype, p, stride, n, v);
}

void ApplyTile(Op op, const float* a, const float* b, float scalar, size_t n, float* out) {
  if (UseAvx2()) return avx2::ApplyTile(op, a, b, scalar, n, out);
  generic::ApplyTile(op, a, b, scalar, n, out);
}

void MaxTile(const float* v, size_t n, float* m) {
  if (UseAvx2()) return avx2::MaxTile(v, n, m);
  generic::MaxTile(v, n, m);
}

void Max2Tile(const float* m, const float* v, size_t n, float* out) {
  if (UseAvx2()) return avx2::Max2Tile(m, v, n, out);
  generic::Max2Tile(m, v, n, out);
}

void Max4Tile(const float* a, const float* b, const float* c, const float* d, size_t n,
              float* out) {
  if (UseAvx2()) return avx2::Max4Tile(a, b, c, d, n, out);
  generic::Max4Tile(a, b, c, d, n, out);
}

void GatherTile(const float* src, const int32_t* idx, size_t n, float* out) {
  if (UseAvx2()) return avx2::GatherTile(src, idx, n, out);
  generic::GatherTile(src, idx, n, out);
}

void CompactRuns(const float* src, int64_t run, int64_t period, int64_t runs, float* out) {
  if (UseAvx2()) return avx2::CompactRuns(src, run, period, runs, out);
  generic::CompactRuns(src, run, period, runs, out);
}

void RoundTile(DataType dtype, float* v, size_t n) {
  if (dtype == DataType::kF32) return;
  uint8_t bytes[kTile * 4];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    StoreTile(dtype, bytes, 1, m, v + i);
    LoadTile(dtype, bytes, 1, m, v + i);
  }
}

void TransposeStrip4(const uint8_t* src, int64_t sq, uint8_t* dst, int64_t dp, int64_t ni,
                     int64_t nj) {
  if (UseAvx2()) return avx2::TransposeStrip4(src, sq, dst, dp, ni, nj);
  generic::TransposeStrip4(src, sq, dst, dp, ni, nj);
}

void CopyTile(float* dst, const float* src, size_t n) {
  if (UseAvx2()) return avx2::CopyTile(dst, src, n);
  generic::CopyTile(dst, src, n);
}

bool RunChain(DataType in, const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out,
              uint8_t* dst, size_t n) {
  return UseAvx2() && avx2::RunChain(in, src, ops, n_ops, out, dst, n);
}

}  // namespace plexus::restructure::internal
