#include "device_params.hpp"

#include <cstdint>

namespace plexus::restructure::internal {
namespace {

int32_t DeviceTypeOf(DataType t) {
  switch (t) {
    case DataType::kF16:
      return kDevF16;
    case DataType::kBF16:
      return kDevBF16;
    case DataType::kI32:
      return kDevI32;
    case DataType::kI8:
      return kDevI8;
    case DataType::kU8:
      return kDevU8;
    default:
      return kDevF32;
  }
}

int32_t DeviceOpOf(const Step& st, DataType dst, DataType src1) {
  switch (st.op) {
    case Op::kCopy:
      return kDevCopyBits;
    case Op::kCast:
      return dst == src1 ? kDevCopyBits : kDevCast;
    case Op::kAdd:
      return kDevAdd;
    case Op::kMul:
      return kDevMul;
    case Op::kDiv:
      return kDevDiv;
    case Op::kPow:
      return kDevPow;
    case Op::kLog10:
      return kDevLog10;
    case Op::kMaxPool:
      return kDevMaxPool;
  }
  return kDevCopyBits;
}

bool Aligned(const void* p, size_t size) { return reinterpret_cast<uintptr_t>(p) % size == 0; }

}  // namespace

DeviceStepParams StepParams(const Step& st, const std::vector<Bound>& bufs) {
  DeviceStepParams s{};
  const int levels = static_cast<int>(st.iters.size());
  for (int l = 0; l < kDeviceLevels; ++l) s.iters[l] = 1;
  for (int l = 0; l < levels; ++l) {
    s.iters[l] = st.iters[l];
    s.dst_stride[l] = st.dst.strides[l];
    s.src1_stride[l] = st.src1.strides[l];
    if (st.src2_kind == Operand2::kBuffer) s.src2_stride[l] = st.src2.strides[l];
  }
  s.dst_base = st.dst.base;
  s.src1_base = st.src1.base;
  s.src2_base = st.src2_kind == Operand2::kBuffer ? st.src2.base : 0;
  s.levels = levels;
  s.outer_levels = st.op == Op::kMaxPool ? levels - st.window_levels : levels;
  s.points = 1;
  for (int l = 0; l < s.outer_levels; ++l) s.points *= st.iters[l];
  const Bound& d = bufs[st.dst.buffer];
  const Bound& a = bufs[st.src1.buffer];
  s.op = DeviceOpOf(st, d.dtype, a.dtype);
  s.dst_type = DeviceTypeOf(d.dtype);
  s.src1_type = DeviceTypeOf(a.dtype);
  s.src2_type = kDevF32;
  s.src2_is_scalar = st.src2_kind == Operand2::kScalar;
  s.scalar = st.scalar;
  bool aligned = Aligned(d.read, d.size) && Aligned(a.read, a.size);
  if (st.src2_kind == Operand2::kBuffer) {
    const Bound& b = bufs[st.src2.buffer];
    s.src2_type = DeviceTypeOf(b.dtype);
    aligned = aligned && Aligned(b.read, b.size);
  }
  s.aligned = aligned;
  return s;
}

}  // namespace plexus::restructure::internal
