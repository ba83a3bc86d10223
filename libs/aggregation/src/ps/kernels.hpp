// Aggregation and optimizer kernels: AVX2 (with F16C) chosen at run time, scalar fallback with
// bit-identical results (the same operations in the same order, no FMA), so that servers on
// different CPUs agree on every element. Reuses the collectives' kernels and conversions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plexus/aggregation/optimizer.hpp"
#include "plexus/collectives/types.hpp"

namespace plexus::aggregation::internal {

using collectives::DataType;

// Whether `dtype` may carry gradients and values: f32, bf16 or f16.
bool IsWireType(DataType dtype);

// dst = f32(src) when `first`, else dst += f32(src), for n elements of src's `dtype` (a wire
// type). dst and src must not overlap.
void Accumulate(float* dst, const void* src, DataType dtype, size_t n, bool first);

// out = dtype(in) (round to nearest even) and back.
void ConvertFromF32(void* out, DataType dtype, const float* in, size_t n);
void ConvertToF32(float* out, const void* in, DataType dtype, size_t n);

// The scalars of one optimizer step (Adam's bias correction depends on the step, from 1).
struct StepScalars {
  float lr = 0, momentum = 0, weight_decay = 0, rescale = 1;
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, epsilon = 0;
  float adam_lr = 0;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
};
StepScalars PrepareStep(const UpdateRule& config, uint64_t step);

// One optimizer step over n elements: updates w (and m, v as the kind needs: null otherwise)
// from the summed gradient g, and writes the new weights to `out` as `out_dtype` (null: none).
// `non_temporal` streams the stores to `out` past the cache (where `out` is aligned to the vector
// width); w, m and v, read in the same loop, are always stored through the cache.
void ApplyOptimizer(OptimizerKind kind, const StepScalars& s, float* w, const float* g, float* m,
                    float* v, void* out, DataType out_dtype, size_t n, bool non_temporal);

// Whether a kernel writing `bytes` uses non-temporal stores under `policy`.
bool UseNonTemporal(StorePolicy policy, size_t bytes);

// STREAM's "add" (c = a + b) with the same loads and stores as Accumulate's f32 path: the
// memory-bandwidth yardstick the benchmark compares the kernels with.
void StreamAdd(float* c, const float* a, const float* b, size_t n, bool non_temporal);

// A STREAM-style yardstick with an optimizer's memory streams and trivial arithmetic: each of the
// `arrays` (1..3) arrays in `rmw` gets x[i] += g[i], and out[i] = rmw[0][i] afterwards, stored as
// the optimizer stores `out`. With 2 arrays it reads and writes what Nesterov does (w, m, g in;
// w, m, out out), with 3 what Adam does (plus v).
void StreamUpdate(float* const* rmw, int arrays, const float* g, float* out, size_t n,
                  bool non_temporal);

// Whether the AVX2 kernels run (the collectives' switch: CPU support, and not disabled).
bool KernelsUseAvx2();

// The AVX2 parts (kernels_avx2.cpp, compiled with -mavx2 -mf16c): each handles a prefix and
// returns how many elements it did; the caller finishes the tail with the scalar code.
size_t AccumulateHalfAvx2(float* dst, const uint8_t* src, DataType dtype, size_t n, bool first);
size_t ApplyOptimizerAvx2(OptimizerKind kind, const StepScalars& s, float* w, const float* g,
                          float* m, float* v, uint8_t* out, DataType out_dtype, size_t n,
                          bool non_temporal);
size_t StreamAddAvx2(float* c, const float* a, const float* b, size_t n, bool non_temporal);
size_t StreamUpdateAvx2(float* const* rmw, int arrays, const float* g, float* out, size_t n,
                        bool non_temporal);

}  // namespace plexus::aggregation::internal
