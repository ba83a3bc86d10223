// Element-wise reduction kernels: AVX2 (with F16C) chosen at run time, scalar fallback. Both give
// bit-identical results, so a job mixing CPUs still agrees on every element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "plexus/kernels/types.hpp"

namespace plexus::kernels {

// dst[i] = dst[i] op src[i] (src_first: src[i] op dst[i]) for n elements; kAvg reduces as kSum
// (DivideInPlace finishes it). f16/bf16 are computed in f32 and rounded to nearest even.
// Pointers need no alignment; dst and src must not overlap.
void ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, bool src_first);
// dst[i] = local[i] op src[i] (src_first: src[i] op local[i]): an out-of-place reduction in one
// pass instead of a copy of local into dst and a ReduceInto. local may equal dst; src must not
// overlap dst.
void ReduceOutOf(DataType dtype, ReduceOp op, void* dst, const void* local, const void* src,
                 size_t n, bool src_first);

// data[i] /= divisor (integer division for integer types): the last step of kAvg.
void DivideInPlace(DataType dtype, void* data, size_t n, int divisor);
// The same on CUDA device memory: a kernel queued on the legacy default stream of the current
// context (returns once queued). FailedPrecondition where CUDA cannot be used, with the reason.
absl::Status DivideOnDevice(DataType dtype, void* data, size_t n, int divisor);

// outs[j][i] = inputs[0][i] op inputs[1][i] op ... op inputs[k-1][i] for each of the m outputs, on
// CUDA device memory (device or peer-mapped pointers), folded in that order with the host
// kernels' semantics (kAvg reduces as kSum; f16/bf16 rounded after each step); 1 <= k, m <=
// kMaxDeviceReduceInputs; outputs may be inputs. One pass: each input read once, each output
// written once. A kernel queued on the legacy default stream of the current context (returns once
// queued). FailedPrecondition where CUDA cannot be used, with the reason.
inline constexpr int kMaxDeviceReduceInputs = 16;
absl::Status ReduceOnDevice(DataType dtype, ReduceOp op, void* const* outs, int m,
                            const void* const* inputs, int k, size_t n);
// outs[o] + j * block receives the block bytes of inputs[j], for each of the m outputs and k
// inputs (m, k >= 1), on CUDA device memory: an all-gather into several outputs (k = 1: a
// broadcast), reading each input once per kMaxDeviceReduceInputs outputs. An input may already lie
// at its place in an output (it is not copied onto itself); otherwise inputs and outputs must not
// overlap. Queued like ReduceOnDevice.
absl::Status GatherOnDevice(void* const* outs, int m, const void* const* inputs, int k,
                            size_t block);

// Whether ReduceInto uses the AVX2 kernels (CPU support, and not disabled).
bool Avx2Active();
// Tests: force the scalar kernels (false) or allow AVX2 again (true). Returns the previous value.
bool SetAvx2Allowed(bool allowed);

// Fused casts (an f32 collective that travels as bf16 or f16, CallOptions::wire_dtype). `wire`
// is kBF16 or kF16; f32 -> wire rounds to nearest even (bf16: NaNs stay quiet NaNs; f16: values
// beyond 65504 become infinities, as F16C). Pointers need no alignment.
// out[i] = wire(in[i]); with `keep` (may equal in), also keep[i] = f32(out[i]): the sender of a
// final result keeps exactly the value it sends.
void PackWire(DataType wire, void* out, const float* in, size_t n, float* keep);
// out[i] = f32(in[i]).
void UnpackWire(DataType wire, float* out, const void* in, size_t n);
// dst[i] = local[i] op f32(in[i]) (src_first: f32(in[i]) op local[i]), accumulated in f32 (kAvg
// as kSum). local may equal dst; in must not overlap either.
void ReduceWire(DataType wire, ReduceOp op, float* dst, const float* local, const void* in,
                size_t n, bool src_first);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);

// The AVX2 kernels (reduce_avx2.cpp, compiled with -mavx2 -mf16c): process a prefix of the
// elements and return how many they handled (the caller finishes the tail). Call only when the
// CPU supports AVX2 and F16C. ReduceAvx2 is ReduceOutOf's (local may equal dst).
size_t ReduceAvx2(DataType dtype, ReduceOp op, uint8_t* dst, const uint8_t* local,
                  const uint8_t* src, size_t n, bool src_first);

// The AVX2 + F16C forms of the three above, same contract as ReduceAvx2 (bit-identical to the
// scalar kernels; they return how many leading elements they handled).
size_t PackWireAvx2(DataType wire, uint8_t* out, const float* in, size_t n, float* keep);
size_t UnpackWireAvx2(DataType wire, float* out, const uint8_t* in, size_t n);
size_t ReduceWireAvx2(DataType wire, ReduceOp op, float* dst, const float* local, const uint8_t* in,
                      size_t n, bool src_first);

}  // namespace plexus::kernels
