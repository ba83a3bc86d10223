// The restructuring engine's device kernels (nvcc, embedded as a fatbin; launched by
// src/device.cpp through the driver). One generic kernel per step: a thread per point of the
// step's nest (grid-stride), each operand's element found from its own base and strides, the
// op computed in f32 and stored in the destination's type with the same rounding code as the
// CPU executors (plexus/kernels/convert_bits.hpp). Max pooling: a thread per outer point.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "device_params.hpp"
#include "plexus/kernels/convert_bits.hpp"

namespace {

using plexus::restructure::internal::DeviceStepParams;
namespace bits = plexus::kernels::bits;
namespace rs = plexus::restructure::internal;

template <typename T>
__device__ T LoadAs(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const T*>(p);
  T v;
  memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
__device__ void StoreAs(uint8_t* p, T v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<T*>(p) = v;
  } else {
    memcpy(p, &v, sizeof v);
  }
}

__device__ int TypeSize(int32_t t) {
  switch (t) {
    case rs::kDevF32:
    case rs::kDevI32:
      return 4;
    case rs::kDevF16:
    case rs::kDevBF16:
      return 2;
    default:
      return 1;
  }
}

// Loads and converts to f32: i32 rounds to nearest even, the others are exact.
__device__ float Load(int32_t t, const uint8_t* p, bool aligned) {
  switch (t) {
    case rs::kDevF32:
      return LoadAs<float>(p, aligned);
    case rs::kDevF16:
      return bits::HalfToFloat(LoadAs<uint16_t>(p, aligned));
    case rs::kDevBF16:
      return bits::Bf16ToFloat(LoadAs<uint16_t>(p, aligned));
    case rs::kDevI32:
      return __int2float_rn(LoadAs<int32_t>(p, aligned));
    case rs::kDevI8:
      return static_cast<float>(*reinterpret_cast<const int8_t*>(p));
    default:
      return static_cast<float>(*p);
  }
}

// Round to nearest even, saturate, NaN -> 0 (the interpreter's RoundSaturate).
template <typename T>
__device__ T RoundSaturate(float v, float lo, float hi) {
  if (isnan(v)) return 0;
  const float r = rintf(v);
  if (r <= lo) return static_cast<T>(lo);
  if (r >= hi) return static_cast<T>(hi);
  return static_cast<T>(r);
}

__device__ void Store(int32_t t, uint8_t* p, float v, bool aligned) {
  switch (t) {
    case rs::kDevF32:
      StoreAs<float>(p, v, aligned);
      break;
    case rs::kDevF16:
      StoreAs<uint16_t>(p, bits::FloatToHalf(v), aligned);
      break;
    case rs::kDevBF16:
      StoreAs<uint16_t>(p, bits::FloatToBf16(v), aligned);
      break;
    case rs::kDevI32: {
      // The saturation bounds as the host computes them: (float)INT32_MAX is 2^31.
      const float lo = -2147483648.0f, hi = 2147483648.0f;
      int32_t out;
      if (isnan(v)) {
        out = 0;
      } else {
        const float r = rintf(v);
        out = r <= lo ? INT32_MIN : r >= hi ? INT32_MAX : static_cast<int32_t>(r);
      }
      StoreAs<int32_t>(p, out, aligned);
      break;
    }
    case rs::kDevI8:
      *reinterpret_cast<int8_t*>(p) = RoundSaturate<int8_t>(v, -128.0f, 127.0f);
      break;
    default:
      *p = RoundSaturate<uint8_t>(v, 0.0f, 255.0f);
      break;
  }
}

__device__ uint32_t BitsOf(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

__device__ float FloatOf(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

// A NaN result with the bits the host gives it (CUDA's arithmetic gives 0x7FFFFFFF for every
// NaN): x86's rule, the first NaN operand made quiet, else (an invalid operation: 0 * inf, inf -
// inf, 0 / 0) the default NaN 0xFFC00000; glibc's log10f of a negative gives 0x7FC00000.
constexpr uint32_t kDefaultNaN = 0xFFC00000u, kLog10InvalidNaN = 0x7FC00000u;

__device__ float HostNaN(float r, float a, float b, bool binary, uint32_t invalid = kDefaultNaN) {
  if (!isnan(r)) return r;
  if (isnan(a)) return FloatOf(BitsOf(a) | 0x00400000u);
  if (binary && isnan(b)) return FloatOf(BitsOf(b) | 0x00400000u);
  return FloatOf(invalid);
}

// The op in f32, each operation rounded on its own (no contraction into FMA), NaNs as the host's.
__device__ float Apply(int32_t op, float a, float b) {
  switch (op) {
    case rs::kDevAdd:
      return HostNaN(__fadd_rn(a, b), a, b, true);
    case rs::kDevMul:
      return HostNaN(__fmul_rn(a, b), a, b, true);
    case rs::kDevDiv:
      return HostNaN(__fdiv_rn(a, b), a, b, true);
    case rs::kDevPow:
      return HostNaN(b == 2.0f ? __fmul_rn(a, a) : powf(a, b), a, b, b != 2.0f);
    case rs::kDevLog10:
      return HostNaN(log10f(a), a, 0.0f, false, kLog10InvalidNaN);
    default:
      return a;
  }
}

// A value as a later step reads it back after it was stored in `t` (the interpreter's store then
// load): rounded to the type, and back to f32.
__device__ float RoundTrip(int32_t t, float v) {
  switch (t) {
    case rs::kDevF32:
      return v;
    case rs::kDevF16:
      return bits::HalfToFloat(bits::FloatToHalf(v));
    case rs::kDevBF16:
      return bits::Bf16ToFloat(bits::FloatToBf16(v));
    default: {
      uint8_t b[4];
      Store(t, b, v, false);
      return Load(t, b, false);
    }
  }
}

// Element offsets of point `p` of levels [0, levels) (row-major, the last level fastest).
__device__ void Offsets(const DeviceStepParams& s, int levels, int64_t p, int64_t* od, int64_t* o1,
                        int64_t* o2) {
  int64_t d = s.dst_base, a = s.src1_base, b = s.src2_base;
  for (int l = levels - 1; l >= 0; --l) {
    const int64_t n = s.iters[l];
    const int64_t i = p % n;
    p /= n;
    d += i * s.dst_stride[l];
    a += i * s.src1_stride[l];
    b += i * s.src2_stride[l];
  }
  *od = d;
  *o1 = a;
  *o2 = b;
}

}  // namespace

extern "C" {

__global__ void plexus_restructure_step(DeviceStepParams s, uint8_t* dst, const uint8_t* src1,
                                        const uint8_t* src2) {
  const bool aligned = s.aligned != 0;
  const int dsize = TypeSize(s.dst_type), s1size = TypeSize(s.src1_type);
  const int s2size = TypeSize(s.src2_type);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < s.points;
       p += stride) {
    int64_t od, o1, o2;
    Offsets(s, s.outer_levels, p, &od, &o1, &o2);
    uint8_t* out = dst + od * dsize;
    if (s.op == rs::kDevMaxPool) {
      // The window: levels [outer_levels, levels) in row-major order; a NaN anywhere gives NaN,
      // of equal values the first is kept (the interpreter's rule).
      int64_t window = 1;
      for (int l = s.outer_levels; l < s.levels; ++l) window *= s.iters[l];
      float m = 0;
      for (int64_t w = 0; w < window; ++w) {
        int64_t rem = w, off = o1;
        for (int l = s.levels - 1; l >= s.outer_levels; --l) {
          const int64_t n = s.iters[l];
          off += (rem % n) * s.src1_stride[l];
          rem /= n;
        }
        const float v = Load(s.src1_type, src1 + off * s1size, aligned);
        if (w == 0 || (!isnan(m) && (isnan(v) || v > m))) m = v;
      }
      Store(s.dst_type, out, m, aligned);
      continue;
    }
    const uint8_t* in = src1 + o1 * s1size;
    if (s.op == rs::kDevCopyBits) {
      switch (dsize) {
        case 4:
          StoreAs<uint32_t>(out, LoadAs<uint32_t>(in, aligned), aligned);
          break;
        case 2:
          StoreAs<uint16_t>(out, LoadAs<uint16_t>(in, aligned), aligned);
          break;
        default:
          *out = *in;
          break;
      }
      continue;
    }
    const float a = Load(s.src1_type, in, aligned);
    const float b = s.src2_is_scalar  ? s.scalar
                    : src2 != nullptr ? Load(s.src2_type, src2 + o2 * s2size, aligned)
                                      : 0.0f;
    Store(s.dst_type, out, Apply(s.op, a, b), aligned);
  }
}

// A fused group (device_params.hpp): every step at a thread's point, results forwarded in
// registers, stored where the plan says.
__global__ void plexus_restructure_fused(plexus::restructure::internal::DeviceFusedParams f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float v[plexus::restructure::internal::kDeviceFusedSteps];
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       p < f.steps[0].points; p += stride) {
    for (int k = 0; k < f.count; ++k) {
      const DeviceStepParams& s = f.steps[k];
      const bool aligned = s.aligned != 0;
      int64_t od, o1, o2;
      Offsets(s, s.levels, p, &od, &o1, &o2);
      const float a = f.forward1[k] >= 0
                          ? v[f.forward1[k]]
                          : Load(s.src1_type, f.src1[k] + o1 * TypeSize(s.src1_type), aligned);
      float b = 0;
      if (s.src2_is_scalar) {
        b = s.scalar;
      } else if (f.forward2[k] >= 0) {
        b = v[f.forward2[k]];
      } else if (f.src2[k] != nullptr) {
        b = Load(s.src2_type, f.src2[k] + o2 * TypeSize(s.src2_type), aligned);
      }
      const float r = Apply(s.op, a, b);
      if (f.store[k]) Store(s.dst_type, f.dst[k] + od * TypeSize(s.dst_type), r, aligned);
      v[k] = RoundTrip(s.dst_type, r);
    }
  }
}

}  // extern "C"
