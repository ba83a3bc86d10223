#include "device_params.hpp"

#include <optional>

#include "passes.hpp"

#include <algorithm>
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

namespace {

bool Fusable(const Step& st, const Program& p) {
  switch (st.op) {
    case Op::kAdd:
    case Op::kMul:
    case Op::kDiv:
    case Op::kPow:
    case Op::kLog10:
      return true;
    case Op::kCast:  // a cast to the same type is a bit copy: alone
      return p.buffers[st.dst.buffer].dtype != p.buffers[st.src1.buffer].dtype;
    default:
      return false;
  }
}

}  // namespace

namespace {

// Whether `steps` (re-expressed on one nest, in program order) can run as one kernel: a buffer
// written by a step is read later in the run only through the access it was written by (the
// value is then forwarded), and written again only through it; a step writes no buffer an
// earlier step read through another access. Fills forward1/forward2 (indices into `steps`).
bool Forwardable(const std::vector<Step>& steps, std::vector<int32_t>* forward1,
                 std::vector<int32_t>* forward2) {
  forward1->assign(steps.size(), -1);
  forward2->assign(steps.size(), -1);
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& st = steps[k];
    auto source = [&](const Access& a, int32_t* from) {
      for (size_t j = k; j-- > 0;) {
        if (steps[j].dst.buffer != a.buffer) continue;
        if (!(steps[j].dst == a)) return false;
        *from = static_cast<int32_t>(j);
        return true;
      }
      return true;
    };
    if (!source(st.src1, &(*forward1)[k])) return false;
    if (st.src2_kind == Operand2::kBuffer && !source(st.src2, &(*forward2)[k])) return false;
    for (size_t j = 0; j < k; ++j) {
      const Step& e = steps[j];
      if (e.dst.buffer == st.dst.buffer && !(e.dst == st.dst)) return false;
      if (e.src1.buffer == st.dst.buffer && !(e.src1 == st.dst)) return false;
      if (e.src2_kind == Operand2::kBuffer && e.src2.buffer == st.dst.buffer &&
          !(e.src2 == st.dst)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

std::vector<DeviceLaunch> PlanDevice(const Program& p) {
  std::vector<DeviceLaunch> launches;
  const int n = static_cast<int>(p.steps.size());
  for (int i = 0; i < n;) {
    DeviceLaunch l;
    l.steps.push_back(i);
    if (Fusable(p.steps[i], p)) {
      Shape shape = p.steps[i].iters;
      std::vector<Step> run = {p.steps[i]};
      std::vector<int32_t> f1, f2;
      for (int k = i + 1; k < n && static_cast<int>(run.size()) < kDeviceFusedSteps; ++k) {
        if (!Fusable(p.steps[k], p)) break;
        const std::optional<Shape> common = CommonShape(shape, p.steps[k].iters);
        if (!common || static_cast<int>(common->size()) > kDeviceLevels) break;
        std::vector<Step> next;
        for (const Step& s : run) next.push_back(ReexpressStep(s, *common));
        next.push_back(ReexpressStep(p.steps[k], *common));
        if (!Forwardable(next, &f1, &f2)) break;
        shape = *common;
        run = std::move(next);
        l.steps.push_back(k);
      }
      if (run.size() > 1) {
        Forwardable(run, &l.forward1, &l.forward2);
        const int last = l.steps.back();
        for (const Step& st : run) {
          // Stored unless a scratch buffer that no step after the run reads.
          const int b = st.dst.buffer;
          bool read_later = p.buffers[b].role != Role::kScratch;
          for (int k = last + 1; k < n && !read_later; ++k) {
            const Step& later = p.steps[k];
            read_later = later.src1.buffer == b ||
                         (later.src2_kind == Operand2::kBuffer && later.src2.buffer == b);
          }
          l.store.push_back(read_later);
        }
        l.fused = std::move(run);
      }
    }
    i = l.steps.back() + 1;
    launches.push_back(std::move(l));
  }
  return launches;
}

DeviceFusedParams FusedParams(const DeviceLaunch& l, const std::vector<Bound>& bufs) {
  DeviceFusedParams f{};
  f.count = static_cast<int32_t>(l.steps.size());
  for (size_t j = 0; j < l.steps.size(); ++j) {
    const Step& st = l.fused[j];
    f.steps[j] = StepParams(st, bufs);
    f.dst[j] = bufs[st.dst.buffer].write;
    f.src1[j] = bufs[st.src1.buffer].read;
    f.src2[j] = st.src2_kind == Operand2::kBuffer ? bufs[st.src2.buffer].read : nullptr;
    f.forward1[j] = l.forward1[j];
    f.forward2[j] = l.forward2[j];
    f.store[j] = l.store[j];
  }
  return f;
}

}  // namespace plexus::restructure::internal
