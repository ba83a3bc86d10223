#include "plexus/restructure/interpreter.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bind.hpp"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::restructure {
namespace {

using base::LoadHostOrder;
using base::StoreHostOrder;

// Round to nearest even (the default floating-point environment), saturate, NaN -> 0.
template <typename T>
T RoundSaturate(float v) {
  if (std::isnan(v)) return 0;
  const float r = std::nearbyint(v);
  if (r <= static_cast<float>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (r >= static_cast<float>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

float Apply(Op op, float a, float b) {
  switch (op) {
    case Op::kAdd:
      return a + b;
    case Op::kMul:
      return a * b;
    case Op::kDiv:
      return a / b;
    case Op::kPow:
      return std::pow(a, b);
    case Op::kLog10:
      return std::log10(a);
    case Op::kCopy:
    case Op::kCast:
    case Op::kMaxPool:
      return a;
  }
  return a;
}

using Index = std::array<int64_t, kMaxLevels>;

// Calls f() for every point of levels [from, to) of the nest in row-major order, with idx
// holding the point (levels outside [from, to) keep their values). Once if from == to.
template <typename F>
void Walk(const std::vector<int64_t>& iters, size_t from, size_t to, Index& idx, F&& f) {
  for (size_t l = from; l < to; ++l) idx[l] = 0;
  for (;;) {
    f();
    size_t l = to;
    for (;;) {
      if (l == from) return;
      --l;
      if (++idx[l] < iters[l]) break;
      idx[l] = 0;
    }
  }
}

int64_t Offset(const Access& a, const Index& idx) {
  int64_t o = a.base;
  for (size_t l = 0; l < a.strides.size(); ++l) o += idx[l] * a.strides[l];
  return o;
}

void RunStep(const Step& st, const std::vector<internal::Bound>& bufs) {
  const internal::Bound& d = bufs[st.dst.buffer];
  const internal::Bound& s1 = bufs[st.src1.buffer];
  const internal::Bound* s2 = st.src2_kind == Operand2::kBuffer ? &bufs[st.src2.buffer] : nullptr;
  const size_t levels = st.iters.size();
  Index idx{};
  if (st.op == Op::kMaxPool) {
    const size_t outer = levels - static_cast<size_t>(st.window_levels);
    Walk(st.iters, 0, outer, idx, [&] {
      bool first = true;
      float m = 0;
      Walk(st.iters, outer, levels, idx, [&] {
        const float v = LoadElement(s1.dtype, s1.read + Offset(st.src1, idx) * s1.size);
        if (first || (!std::isnan(m) && (std::isnan(v) || v > m))) m = v;
        first = false;
      });
      StoreElement(d.dtype, d.write + Offset(st.dst, idx) * d.size, m);
    });
    return;
  }
  const bool bits = (st.op == Op::kCopy || st.op == Op::kCast) && d.dtype == s1.dtype;
  Walk(st.iters, 0, levels, idx, [&] {
    uint8_t* out = d.write + Offset(st.dst, idx) * d.size;
    const uint8_t* in = s1.read + Offset(st.src1, idx) * s1.size;
    if (bits) {
      std::memmove(out, in, d.size);  // in place when the accesses are identical
      return;
    }
    const float a = LoadElement(s1.dtype, in);
    const float b = s2 != nullptr
                        ? LoadElement(s2->dtype, s2->read + Offset(st.src2, idx) * s2->size)
                        : st.scalar;
    StoreElement(d.dtype, out, Apply(st.op, a, b));
  });
}

}  // namespace

float LoadElement(DataType dtype, const uint8_t* p) {
  switch (dtype) {
    case DataType::kF32:
      return LoadHostOrder<float>(p);
    case DataType::kF16:
      return kernels::HalfToFloat(LoadHostOrder<uint16_t>(p));
    case DataType::kBF16:
      return kernels::Bf16ToFloat(LoadHostOrder<uint16_t>(p));
    case DataType::kI32:
      return static_cast<float>(LoadHostOrder<int32_t>(p));
    case DataType::kI8:
      return static_cast<float>(LoadHostOrder<int8_t>(p));
    case DataType::kU8:
      return static_cast<float>(LoadHostOrder<uint8_t>(p));
    case DataType::kF64:
    case DataType::kI64:
      break;  // refused by Validate
  }
  return 0;
}

void StoreElement(DataType dtype, uint8_t* p, float v) {
  switch (dtype) {
    case DataType::kF32:
      StoreHostOrder<float>(p, v);
      break;
    case DataType::kF16:
      StoreHostOrder<uint16_t>(p, kernels::FloatToHalf(v));
      break;
    case DataType::kBF16:
      StoreHostOrder<uint16_t>(p, kernels::FloatToBf16(v));
      break;
    case DataType::kI32:
      StoreHostOrder<int32_t>(p, RoundSaturate<int32_t>(v));
      break;
    case DataType::kI8:
      StoreHostOrder<int8_t>(p, RoundSaturate<int8_t>(v));
      break;
    case DataType::kU8:
      StoreHostOrder<uint8_t>(p, RoundSaturate<uint8_t>(v));
      break;
    case DataType::kF64:
    case DataType::kI64:
      break;  // refused by Validate
  }
}

absl::Status Interpret(const Program& program, absl::Span<const ConstBytes> inputs,
                       absl::Span<const MutableBytes> outputs) {
  PLEXUS_RETURN_IF_ERROR(Validate(program));
  internal::BoundBuffers bound;
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(program, inputs, outputs, &bound));
  for (const Step& st : program.steps) RunStep(st, bound.bufs);
  return absl::OkStatus();
}

}  // namespace plexus::restructure
