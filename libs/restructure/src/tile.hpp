// The fast executor's kernels: a tile of up to kTile elements converted to and from f32 in bulk,
// the element-wise ops over tiles, the max-pool update, and log10 by polynomial.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "plexus/restructure/program.hpp"

namespace plexus::restructure::internal {

inline constexpr size_t kTile = 1024;

// The f32 values of n elements of `dtype` at p, p + stride, ... (stride in elements): `p` itself
// when it holds contiguous f32 (no copy), else `scratch` (room for n floats) filled with them.
const float* LoadTile(DataType dtype, const uint8_t* p, int64_t stride, size_t n, float* scratch);
// Stores v[0, n) as `dtype` at p, p + stride, ... (the interpreter's StoreElement, in bulk).
void StoreTile(DataType dtype, uint8_t* p, int64_t stride, size_t n, const float* v);
// v[0, n) stored as `dtype` and loaded back, in place: what a store of an intermediate and a
// later load of it do to its values (nothing for f32).
void RoundTile(DataType dtype, float* v, size_t n);
// out[i] = op(a[i], b ? b[i] : scalar) for an element-wise op (kCopy and kCast pass a through);
// out may equal a.
void ApplyTile(Op op, const float* a, const float* b, float scalar, size_t n, float* out);
// m[i] = max(m[i], v[i]) with the interpreter's rule: a NaN in m stays, a NaN in v replaces, and
// of equal values the one in m (first in iteration order) stays.
void MaxTile(const float* v, size_t n, float* m);
// out[i] = MaxTile's m[i] after one v[i] (m, v and out may not overlap, but out may equal m).
void Max2Tile(const float* m, const float* v, size_t n, float* out);
// out[i] = the max-pool update of a[i] by b[i], c[i] and d[i] in turn (a 2 x 2 window in one
// pass); out may equal a.
void Max4Tile(const float* a, const float* b, const float* c, const float* d, size_t n, float* out);
// out[j * run + i] = src[j * period + i] for i < run, j < runs (period >= run; out does not
// overlap src): the values at a window's start for every channel, every window.
void CompactRuns(const float* src, int64_t run, int64_t period, int64_t runs, float* out);
// out[k] = src[idx[k]] for k < n (out does not overlap src).
void GatherTile(const float* src, const int32_t* idx, size_t n, float* out);
// Copies n floats' bits with vector loads and stores. The C library's copy of a tile-sized block
// is a string copy that overlaps with nothing around it, to or from memory: every tile copy in
// the passes goes through this instead.
void CopyTile(float* dst, const float* src, size_t n);
// A strip of a transpose of 4-byte elements: dst[i * dp + j] = src[i + j * sq] (strides in
// elements) for i < ni, j < nj, register block by register block with the destination's ni rows
// advancing together. A strip as wide as a cache line of src reads every line of it once.
void TransposeStrip4(const uint8_t* src, int64_t sq, uint8_t* dst, int64_t dp, int64_t ni,
                     int64_t nj);
// Whether dividing by `s` is multiplying by *r exactly: s a power of two whose reciprocal is a
// normal float too (x / s and x * r are then the same real number, rounded once, for every x).
inline bool ExactReciprocal(float s, float* r) {
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  const uint32_t exponent = (bits >> 23) & 0xff;
  if ((bits & 0x7fffff) != 0 || exponent < 1 || exponent > 253) return false;
  *r = 1.0f / s;
  return true;
}

// One op of a chain kept in registers: `op` with the scalar operand, or with operand[i] for
// element i of the run where `operand` is set (f32 memory; kCopy and kCast pass the value
// through; kPow only with the scalar 2), then, unless `round` is kF32, the value stored to
// `round` and loaded back (f16 or bf16), as a store and load of an intermediate would.
struct ChainOp {
  Op op = Op::kCopy;
  float scalar = 0;
  DataType round = DataType::kF32;
  const float* operand = nullptr;
};
inline constexpr size_t kMaxChainOps = 32;
// n contiguous elements of `in` at src, through ops[0, n_ops) in order, stored contiguously as
// `out` at dst. The same bits as LoadTile, ApplyTile and StoreTile in turn, without the tiles:
// values stay in registers, 32 elements at a time, so memory is never idle while a tile
// computes. False, with nothing done, where the CPU lacks AVX2 and F16C or a type or op is not
// handled (integer outputs and roundings; kPow with another exponent or an operand; kMaxPool).
bool RunChain(DataType in, const uint8_t* src, const ChainOp* ops, size_t n_ops, DataType out,
              uint8_t* dst, size_t n);
// log10 within kLog10MaxUlp of std::log10, special values exactly as it.
float Log10(float x);
// memcpy with non-temporal stores (past the cache) for the 16-byte aligned part of `dst`; they
// are ordered with other stores only after StreamFence.
void StreamCopy(uint8_t* dst, const void* src, size_t bytes);
void StreamFence();

}  // namespace plexus::restructure::internal
