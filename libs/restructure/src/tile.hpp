// The fast executor's kernels: a tile of up to kTile elements converted to and from f32 in bulk,
// the element-wise ops over tiles, the max-pool update, and log10 by polynomial.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plexus/restructure/program.hpp"

namespace plexus::restructure::internal {

inline constexpr size_t kTile = 1024;

// The f32 values of n elements of `dtype` at p, p + stride, ... (stride in elements): `p` itself
// when it holds contiguous f32 (no copy), else `scratch` (room for n floats) filled with them.
const float* LoadTile(DataType dtype, const uint8_t* p, int64_t stride, size_t n, float* scratch);
// Stores v[0, n) as `dtype` at p, p + stride, ... (the interpreter's StoreElement, in bulk).
void StoreTile(DataType dtype, uint8_t* p, int64_t stride, size_t n, const float* v);
// out[i] = op(a[i], b ? b[i] : scalar) for an element-wise op (kCopy and kCast pass a through).
void ApplyTile(Op op, const float* a, const float* b, float scalar, size_t n, float* out);
// m[i] = max(m[i], v[i]) with the interpreter's rule: a NaN in m stays, a NaN in v replaces, and
// of equal values the one in m (first in iteration order) stays.
void MaxTile(const float* v, size_t n, float* m);
// out[i] = MaxTile's m[i] after one v[i] (m, v and out may not overlap, but out may equal m).
void Max2Tile(const float* m, const float* v, size_t n, float* out);
// A strip of a transpose of 4-byte elements: dst[i * dp + j] = src[i + j * sq] (strides in
// elements) for i < ni, j < nj, register block by register block with the destination's ni rows
// advancing together. A strip as wide as a cache line of src reads every line of it once.
void TransposeStrip4(const uint8_t* src, int64_t sq, uint8_t* dst, int64_t dp, int64_t ni,
                     int64_t nj);
// log10 within kLog10MaxUlp of std::log10, special values exactly as it.
float Log10(float x);
// memcpy with non-temporal stores (past the cache) for the 16-byte aligned part of `dst`; they
// are ordered with other stores only after StreamFence.
void StreamCopy(uint8_t* dst, const void* src, size_t bytes);
void StreamFence();

}  // namespace plexus::restructure::internal
