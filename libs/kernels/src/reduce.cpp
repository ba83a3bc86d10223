#include "plexus/kernels/reduce.hpp"

#include <atomic>
#include <cstring>
#include <limits>

#include "plexus/base/byte_order.hpp"

namespace plexus::kernels {
namespace {

std::atomic<bool> avx2_allowed{true};

bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

using base::LoadHostOrder;
using base::StoreHostOrder;

// The scalar mirror of the vector instructions: minps(a, b) = a < b ? a : b, and so on.
template <typename T>
T ApplyRaw(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kMax:
      return a > b ? a : b;
  }
  return a;
}

// Which NaN an instruction returns depends on its operand order, which the compiler may swap
// for commutative operations: every NaN result becomes the canonical quiet NaN instead, in the
// vector kernels too, so that results never depend on code generation.
template <typename T>
T Apply(ReduceOp op, T a, T b) {
  const T r = ApplyRaw(op, a, b);
  return r != r ? std::numeric_limits<T>::quiet_NaN() : r;
}

// Integers wrap around (computed unsigned), as the vector instructions do.
template <typename T, typename U>
T ApplyInt(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case ReduceOp::kProd:
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kMax:
      return a > b ? a : b;
  }
  return a;
}

template <typename T, typename F>
void Loop(uint8_t* dst, const uint8_t* local, const uint8_t* src, size_t n, bool src_first, F f) {
  for (size_t i = 0; i < n; ++i) {
    const T a = LoadHostOrder<T>(local + i * sizeof(T));
    const T b = LoadHostOrder<T>(src + i * sizeof(T));
    StoreHostOrder<T>(dst + i * sizeof(T), src_first ? f(b, a) : f(a, b));
  }
}

void ReduceScalar(DataType dtype, ReduceOp op, uint8_t* dst, const uint8_t* local,
                  const uint8_t* src, size_t n, bool src_first) {
  switch (dtype) {
    case DataType::kF32:
      Loop<float>(dst, local, src, n, src_first,
                  [op](float a, float b) { return Apply(op, a, b); });
      break;
    case DataType::kF64:
      Loop<double>(dst, local, src, n, src_first,
                   [op](double a, double b) { return Apply(op, a, b); });
      break;
    case DataType::kF16:
      Loop<uint16_t>(dst, local, src, n, src_first, [op](uint16_t a, uint16_t b) {
        return FloatToHalf(Apply(op, HalfToFloat(a), HalfToFloat(b)));
      });
      break;
    case DataType::kBF16:
      Loop<uint16_t>(dst, local, src, n, src_first, [op](uint16_t a, uint16_t b) {
        return FloatToBf16(Apply(op, Bf16ToFloat(a), Bf16ToFloat(b)));
      });
      break;
    case DataType::kI32:
      Loop<int32_t>(dst, local, src, n, src_first,
                    [op](int32_t a, int32_t b) { return ApplyInt<int32_t, uint32_t>(op, a, b); });
      break;
    case DataType::kI64:
      Loop<int64_t>(dst, local, src, n, src_first,
                    [op](int64_t a, int64_t b) { return ApplyInt<int64_t, uint64_t>(op, a, b); });
      break;
    case DataType::kU8:
      Loop<uint8_t>(dst, local, src, n, src_first,
                    [op](uint8_t a, uint8_t b) { return ApplyInt<uint8_t, uint32_t>(op, a, b); });
      break;
    case DataType::kI8:
      Loop<int8_t>(dst, local, src, n, src_first,
                   [op](int8_t a, int8_t b) { return ApplyInt<int8_t, uint32_t>(op, a, b); });
      break;
  }
}

template <typename T, typename F>
void Map(uint8_t* data, size_t n, F f) {
  for (size_t i = 0; i < n; ++i)
    StoreHostOrder<T>(data + i * sizeof(T), f(LoadHostOrder<T>(data + i * sizeof(T))));
}

}  // namespace

bool Avx2Active() { return avx2_allowed.load(std::memory_order_relaxed) && CpuHasAvx2(); }

bool SetAvx2Allowed(bool allowed) { return avx2_allowed.exchange(allowed); }

void ReduceOutOf(DataType dtype, ReduceOp op, void* dst_v, const void* local_v, const void* src_v,
                 size_t n, bool src_first) {
  auto* dst = static_cast<uint8_t*>(dst_v);
  const auto* local = static_cast<const uint8_t*>(local_v);
  const auto* src = static_cast<const uint8_t*>(src_v);
  size_t done = 0;
  if (Avx2Active()) done = ReduceAvx2(dtype, op, dst, local, src, n, src_first);
  const size_t at = done * DataTypeSize(dtype);
  ReduceScalar(dtype, op, dst + at, local + at, src + at, n - done, src_first);
}

void ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, size_t n, bool src_first) {
  ReduceOutOf(dtype, op, dst, dst, src, n, src_first);
}

namespace {

uint16_t ToWire(DataType wire, float f) {
  return wire == DataType::kBF16 ? FloatToBf16(f) : FloatToHalf(f);
}
float FromWire(DataType wire, uint16_t h) {
  return wire == DataType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
}

}  // namespace

void PackWire(DataType wire, void* out_v, const float* in_v, size_t n, float* keep_v) {
  auto* out = static_cast<uint8_t*>(out_v);
  const auto* in = reinterpret_cast<const uint8_t*>(in_v);
  auto* keep = reinterpret_cast<uint8_t*>(keep_v);
  size_t i = Avx2Active() ? PackWireAvx2(wire, out, in_v, n, keep_v) : 0;
  for (; i < n; ++i) {
    const uint16_t h = ToWire(wire, LoadHostOrder<float>(in + 4 * i));
    StoreHostOrder<uint16_t>(out + 2 * i, h);
    if (keep != nullptr) StoreHostOrder<float>(keep + 4 * i, FromWire(wire, h));
  }
}

void UnpackWire(DataType wire, float* out_v, const void* in_v, size_t n) {
  auto* out = reinterpret_cast<uint8_t*>(out_v);
  const auto* in = static_cast<const uint8_t*>(in_v);
  size_t i = Avx2Active() ? UnpackWireAvx2(wire, out_v, in, n) : 0;
  for (; i < n; ++i)
    StoreHostOrder<float>(out + 4 * i, FromWire(wire, LoadHostOrder<uint16_t>(in + 2 * i)));
}

void ReduceWire(DataType wire, ReduceOp op, float* dst_v, const float* local_v, const void* in_v,
                size_t n, bool src_first) {
  auto* dst = reinterpret_cast<uint8_t*>(dst_v);
  const auto* local = reinterpret_cast<const uint8_t*>(local_v);
  const auto* in = static_cast<const uint8_t*>(in_v);
  size_t i = Avx2Active() ? ReduceWireAvx2(wire, op, dst_v, local_v, in, n, src_first) : 0;
  for (; i < n; ++i) {
    const float a = LoadHostOrder<float>(local + 4 * i);
    const float b = FromWire(wire, LoadHostOrder<uint16_t>(in + 2 * i));
    StoreHostOrder<float>(dst + 4 * i, src_first ? Apply(op, b, a) : Apply(op, a, b));
  }
}

void DivideInPlace(DataType dtype, void* data_v, size_t n, int divisor) {
  auto* data = static_cast<uint8_t*>(data_v);
  switch (dtype) {
    case DataType::kF32: {
      const float d = static_cast<float>(divisor);
      Map<float>(data, n, [d](float v) { return v / d; });
      break;
    }
    case DataType::kF64: {
      const double d = divisor;
      Map<double>(data, n, [d](double v) { return v / d; });
      break;
    }
    case DataType::kF16: {
      const float d = static_cast<float>(divisor);
      Map<uint16_t>(data, n, [d](uint16_t v) { return FloatToHalf(HalfToFloat(v) / d); });
      break;
    }
    case DataType::kBF16: {
      const float d = static_cast<float>(divisor);
      Map<uint16_t>(data, n, [d](uint16_t v) { return FloatToBf16(Bf16ToFloat(v) / d); });
      break;
    }
    case DataType::kI32:
      Map<int32_t>(data, n, [divisor](int32_t v) { return static_cast<int32_t>(v / divisor); });
      break;
    case DataType::kI64:
      Map<int64_t>(data, n, [divisor](int64_t v) { return v / divisor; });
      break;
    case DataType::kU8:
      Map<uint8_t>(data, n, [divisor](uint8_t v) { return static_cast<uint8_t>(v / divisor); });
      break;
    case DataType::kI8:
      Map<int8_t>(data, n, [divisor](int8_t v) { return static_cast<int8_t>(v / divisor); });
      break;
  }
}

}  // namespace plexus::kernels
