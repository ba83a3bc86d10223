// Device kernels (nvcc, embedded as a fatbin; launched by src/device_kernels.cpp through the
// driver): out[j][i] = in[0][i] op in[1][i] op ... op in[k-1][i] for every output j, the inputs
// folded in order, so that every rank computing the same slice gets the same bits. f16/bf16 are
// computed in f32 and rounded after each step, as the host kernels round after each pairwise
// reduction. Outputs may be inputs (each element is read by the thread that writes it, before it
// writes). NaN results are the canonical quiet NaN, as on the host. extern "C" names:
// plexus_reduce_<op>_<dtype>(outs, m, inputs, k, n, aligned16); aligned16 (every pointer 16-byte
// aligned) takes 16 bytes per thread and step.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "plexus/kernels/convert_bits.hpp"
#include "pointers.cuh"

namespace {

// The host kernels' semantics (src/reduce.cpp): integers wrap around (computed unsigned), min
// and max are a < b ? a : b and a > b ? a : b, and every NaN result is the canonical quiet NaN.
template <typename T>
__device__ T Canonical(T r) {
  if constexpr (std::is_same_v<T, float>) {
    if (r != r) return __int_as_float(0x7fc00000);  // std::numeric_limits<float>::quiet_NaN()
  } else if constexpr (std::is_same_v<T, double>) {
    if (r != r) return __longlong_as_double(0x7ff8000000000000LL);
  }
  return r;
}

struct Sum {
  template <typename T>
  __device__ static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return Canonical(a + b);
    }
  }
};
struct Prod {
  template <typename T>
  __device__ static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return Canonical(a * b);
    }
  }
};
struct Min {
  template <typename T>
  __device__ static T Apply(T a, T b) {
    return Canonical(a < b ? a : b);
  }
};
struct Max {
  template <typename T>
  __device__ static T Apply(T a, T b) {
    return Canonical(a > b ? a : b);
  }
};

// Plain types: computed in the type itself.
template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  __device__ static Compute Load(const void* p, size_t i) { return static_cast<const T*>(p)[i]; }
  __device__ static Compute Round(Compute v) { return v; }
  __device__ static void Store(void* p, size_t i, Compute v) { static_cast<T*>(p)[i] = v; }
};

// f16 and bf16 through the host's own conversions (plexus/kernels/convert_bits.hpp): the same
// rounding and the same NaN bits as the host kernels.
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float Load(const void* p, size_t i) {
    return plexus::kernels::bits::HalfToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  __device__ static float Round(float v) {
    return plexus::kernels::bits::HalfToFloat(plexus::kernels::bits::FloatToHalf(v));
  }
  __device__ static void Store(void* p, size_t i, float v) {
    static_cast<uint16_t*>(p)[i] = plexus::kernels::bits::FloatToHalf(v);
  }
};

struct BFloat {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float Load(const void* p, size_t i) {
    return plexus::kernels::bits::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  __device__ static float Round(float v) {
    return plexus::kernels::bits::Bf16ToFloat(plexus::kernels::bits::FloatToBf16(v));
  }
  __device__ static void Store(void* p, size_t i, float v) {
    static_cast<uint16_t*>(p)[i] = plexus::kernels::bits::FloatToBf16(v);
  }
};

// The loops over inputs and outputs are unrolled to their maximum so that every pointer is read
// from the kernel's parameters at a constant index: an index known only at run time makes each
// thread copy both arrays (256 bytes) to its local memory first, which costs more than the
// reduction itself for large grids.
template <typename Op, typename E>
__device__ void ReduceElements(const Outputs& outs, int m, const Inputs& inputs, int k, size_t from,
                               size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = from + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    typename E::Compute acc = E::Load(inputs.in[0], i);
#pragma unroll
    for (int j = 1; j < kMaxInputs; ++j) {
      if (j < k) acc = E::Round(Op::Apply(acc, E::Load(inputs.in[j], i)));
    }
#pragma unroll
    for (int j = 0; j < kMaxInputs; ++j) {
      if (j < m) E::Store(outs.out[j], i, acc);
    }
  }
}

// 16 bytes of every input and output per step (all pointers 16-byte aligned): a warp's loads
// and stores are whole 512-byte transactions and each thread has several elements in flight,
// which memory-bound sizes need to reach the GPU's bandwidth. The same folds, element by element,
// as ReduceElements; the elements after the last whole vector go through it.
template <typename Op, typename E>
__device__ void ReduceVectors(const Outputs& outs, int m, const Inputs& inputs, int k, size_t n) {
  using S = typename E::Storage;
  constexpr int kLanes = 16 / sizeof(S);
  union Vector {
    uint4 bits;
    S lanes[kLanes];
  };
  const size_t vectors = n / kLanes;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += stride) {
    Vector in;
    in.bits = static_cast<const uint4*>(inputs.in[0])[v];
    typename E::Compute acc[kLanes];
#pragma unroll
    for (int l = 0; l < kLanes; ++l) acc[l] = E::Load(in.lanes, l);
#pragma unroll
    for (int j = 1; j < kMaxInputs; ++j) {
      if (j < k) {
        in.bits = static_cast<const uint4*>(inputs.in[j])[v];
#pragma unroll
        for (int l = 0; l < kLanes; ++l) acc[l] = E::Round(Op::Apply(acc[l], E::Load(in.lanes, l)));
      }
    }
    Vector out;
#pragma unroll
    for (int l = 0; l < kLanes; ++l) E::Store(out.lanes, l, acc[l]);
#pragma unroll
    for (int j = 0; j < kMaxInputs; ++j) {
      if (j < m) static_cast<uint4*>(outs.out[j])[v] = out.bits;
    }
  }
  ReduceElements<Op, E>(outs, m, inputs, k, vectors * kLanes, n);
}

}  // namespace

#define PLEXUS_REDUCE_KERNEL(op_name, Op, type_name, E)                     \
  extern "C" __global__ void plexus_reduce_##op_name##_##type_name(         \
      Outputs outs, int m, Inputs inputs, int k, size_t n, int aligned16) { \
    if (aligned16) {                                                        \
      ReduceVectors<Op, E>(outs, m, inputs, k, n);                          \
    } else {                                                                \
      ReduceElements<Op, E>(outs, m, inputs, k, 0, n);                      \
    }                                                                       \
  }

#define PLEXUS_REDUCE_KERNELS(op_name, Op)               \
  PLEXUS_REDUCE_KERNEL(op_name, Op, f32, Plain<float>)   \
  PLEXUS_REDUCE_KERNEL(op_name, Op, f64, Plain<double>)  \
  PLEXUS_REDUCE_KERNEL(op_name, Op, f16, Half)           \
  PLEXUS_REDUCE_KERNEL(op_name, Op, bf16, BFloat)        \
  PLEXUS_REDUCE_KERNEL(op_name, Op, i32, Plain<int32_t>) \
  PLEXUS_REDUCE_KERNEL(op_name, Op, i64, Plain<int64_t>) \
  PLEXUS_REDUCE_KERNEL(op_name, Op, u8, Plain<uint8_t>)  \
  PLEXUS_REDUCE_KERNEL(op_name, Op, i8, Plain<int8_t>)

PLEXUS_REDUCE_KERNELS(sum, Sum)
PLEXUS_REDUCE_KERNELS(prod, Prod)
PLEXUS_REDUCE_KERNELS(min, Min)
PLEXUS_REDUCE_KERNELS(max, Max)
