#include "plexus/restructure/executor.hpp"

#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bind.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/types.hpp"
#include "tile.hpp"

namespace plexus::restructure {
namespace {

using Shape = std::vector<int64_t>;
using Pass = Executor::Pass;
using internal::Bound;
using internal::kTile;

// A pass fuses at most this many steps (their f32 tiles stay in L1/L2).
constexpr size_t kMaxFusedSteps = 16;

bool IsBitCopy(const Program& p, const Step& s) {
  return s.op == Op::kCopy ||
         (s.op == Op::kCast && p.buffers[s.dst.buffer].dtype == p.buffers[s.src1.buffer].dtype);
}

std::vector<Access*> Operands(Step& s) {
  std::vector<Access*> a = {&s.dst, &s.src1};
  if (s.src2_kind == Operand2::kBuffer) a.push_back(&s.src2);
  return a;
}

// Removes levels of one iteration and merges neighbours that every operand walks as one
// (stride[l] == stride[l + 1] * iters[l + 1]), within [0, levels - window) and the window apart.
void Canonicalize(Step& s) {
  const size_t levels = s.iters.size();
  const size_t window = static_cast<size_t>(s.window_levels);
  auto ops = Operands(s);
  Shape iters;
  std::vector<std::vector<int64_t>> strides(ops.size());
  size_t new_window = 0;
  for (int region = 0; region < 2; ++region) {
    const size_t lo = region == 0 ? 0 : levels - window,
                 hi = region == 0 ? levels - window : levels;
    const size_t start = iters.size();
    for (size_t l = lo; l < hi; ++l) {
      if (s.iters[l] == 1) continue;
      bool merge = iters.size() > start;
      for (size_t k = 0; merge && k < ops.size(); ++k) {
        merge = strides[k].back() == ops[k]->strides[l] * s.iters[l];
      }
      if (merge) {
        iters.back() *= s.iters[l];
        for (size_t k = 0; k < ops.size(); ++k) strides[k].back() = ops[k]->strides[l];
      } else {
        iters.push_back(s.iters[l]);
        for (size_t k = 0; k < ops.size(); ++k) strides[k].push_back(ops[k]->strides[l]);
      }
    }
    if (iters.size() == start && (region == 0 ? levels > window : window > 0)) {
      iters.push_back(1);  // keep one level per non-empty region
      for (size_t k = 0; k < ops.size(); ++k) strides[k].push_back(0);
    }
    if (region == 1) new_window = iters.size() - start;
  }
  s.iters = std::move(iters);
  for (size_t k = 0; k < ops.size(); ++k) ops[k]->strides = std::move(strides[k]);
  s.window_levels = static_cast<int>(new_window);
}

// The sizes of the points below each level boundary (1 and the total included), ascending.
std::vector<int64_t> Boundaries(const Shape& shape) {
  std::vector<int64_t> b = {1};
  for (size_t l = shape.size(); l-- > 0;) b.push_back(b.back() * shape[l]);
  return b;
}

// The coarsest shape that refines both (each level of either is a run of its levels), if any.
std::optional<Shape> CommonRefinement(const Shape& a, const Shape& b) {
  std::vector<int64_t> u = Boundaries(a), ub = Boundaries(b);
  if (u.back() != ub.back()) return std::nullopt;
  u.insert(u.end(), ub.begin(), ub.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  Shape r;
  for (size_t j = u.size() - 1; j > 0; --j) {
    if (u[j] % u[j - 1] != 0) return std::nullopt;
    r.push_back(u[j] / u[j - 1]);
  }
  if (r.empty()) r.push_back(1);
  return r;
}

// `s` (an element-wise step) walking the points of `refined`, a refinement of its shape.
Step Reexpress(Step s, const Shape& refined) {
  const Shape& orig = s.iters;
  std::vector<int64_t> below(orig.size());  // points below each original level
  int64_t acc = 1;
  for (size_t l = orig.size(); l-- > 0;) {
    below[l] = acc;
    acc *= orig[l];
  }
  std::vector<std::vector<int64_t>> strides(3);
  auto ops = Operands(s);
  int64_t rb = 1;
  std::vector<int64_t> refined_below(refined.size());
  for (size_t j = refined.size(); j-- > 0;) {
    refined_below[j] = rb;
    rb *= refined[j];
  }
  for (size_t j = 0; j < refined.size(); ++j) {
    size_t l = 0;
    while (!(below[l] <= refined_below[j] && refined_below[j] < below[l] * orig[l])) ++l;
    for (size_t k = 0; k < ops.size(); ++k) {
      strides[k].push_back(ops[k]->strides[l] * (refined_below[j] / below[l]));
    }
  }
  for (size_t k = 0; k < ops.size(); ++k) ops[k]->strides = std::move(strides[k]);
  s.iters = refined;
  return s;
}

// Merges neighbouring levels that every operand of every step of the pass walks as one.
void MergePassLevels(Pass& pass) {
  for (size_t l = pass.iters.size() - 1; l-- > 0;) {
    bool merge = true;
    for (Step& s : pass.steps) {
      for (Access* a : Operands(s)) {
        merge = merge && a->strides[l] == a->strides[l + 1] * pass.iters[l + 1];
      }
    }
    if (!merge) continue;
    pass.iters[l] *= pass.iters[l + 1];
    pass.iters.erase(pass.iters.begin() + static_cast<ptrdiff_t>(l) + 1);
    for (Step& s : pass.steps) {
      s.iters = pass.iters;
      for (Access* a : Operands(s)) {
        a->strides[l] = a->strides[l + 1];
        a->strides.erase(a->strides.begin() + static_cast<ptrdiff_t>(l) + 1);
      }
    }
  }
}

// Appends element-wise `step` to the fused `pass` when every point can run all of the pass's
// steps in order without seeing another point's writes: the same points (after a common
// refinement), a buffer written in the pass read only where it was written (the value is then
// forwarded), and no write where an earlier step of the pass read or wrote other elements.
bool TryFuse(Pass& pass, const Step& step) {
  if (pass.steps.size() >= kMaxFusedSteps) return false;
  const std::optional<Shape> r = CommonRefinement(pass.iters, step.iters);
  if (!r) return false;
  std::vector<Step> steps;
  for (const Step& s : pass.steps) steps.push_back(Reexpress(s, *r));
  const Step t = Reexpress(step, *r);
  auto forward = [&](const Access& read, int* from) {
    *from = -1;
    for (size_t k = steps.size(); k-- > 0;) {
      if (steps[k].dst.buffer != read.buffer) continue;
      if (!(steps[k].dst == read)) return false;
      *from = static_cast<int>(k);
      return true;
    }
    return true;
  };
  int f1 = -1, f2 = -1;
  if (!forward(t.src1, &f1)) return false;
  if (t.src2_kind == Operand2::kBuffer && !forward(t.src2, &f2)) return false;
  for (const Step& s : steps) {
    if (s.dst.buffer == t.dst.buffer && !(s.dst == t.dst)) return false;
    if (s.src1.buffer == t.dst.buffer && !(s.src1 == t.dst)) return false;
    if (s.src2_kind == Operand2::kBuffer && s.src2.buffer == t.dst.buffer && !(s.src2 == t.dst)) {
      return false;
    }
  }
  steps.push_back(t);
  pass.steps = std::move(steps);
  pass.iters = *r;
  pass.forward1.push_back(f1);
  pass.forward2.push_back(f2);
  return true;
}

bool Reads(const Step& s, int buffer) {
  return s.src1.buffer == buffer || (s.src2_kind == Operand2::kBuffer && s.src2.buffer == buffer);
}

using Index = std::array<int64_t, kMaxLevels>;

// Calls f(idx) for every point of levels [0, levels) but `skip` (row-major; skip's entry 0).
template <typename F>
void WalkExcept(const Shape& iters, size_t levels, size_t skip, F&& f) {
  Index idx{};
  for (;;) {
    f(idx);
    size_t l = levels;
    for (;;) {
      if (l == 0) return;
      --l;
      if (l == skip) continue;
      if (++idx[l] < iters[l]) break;
      idx[l] = 0;
    }
  }
}

int64_t Offset(const Access& a, const Index& idx, size_t levels) {
  int64_t o = a.base;
  for (size_t l = 0; l < levels; ++l) o += idx[l] * a.strides[l];
  return o;
}

using Virtual = Executor::VirtualBuffer;
using Segment = Executor::Segment;

// Scratch buffers the executor need not materialise (Executor::VirtualBuffer), found on the
// canonical steps: written only by one-level contiguous element-wise or copy steps from inputs
// (scalar second operands), each covering a fresh range or extending the chain of one range in
// place, covering the whole buffer, and read only afterwards, by fused or max-pool passes.
std::vector<Virtual> FindVirtual(const Program& p, const std::vector<Step>& steps) {
  std::vector<Virtual> v(p.buffers.size());
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    if (p.buffers[b].role != Role::kScratch) continue;
    const int buf = static_cast<int>(b);
    std::vector<Segment> segs;
    bool ok = true, reading = false;
    for (const Step& s : steps) {
      const bool writes = s.dst.buffer == buf;
      const bool reads = Reads(s, buf);
      if (!writes && !reads) continue;
      if (!writes) {  // a reader
        reading = true;
        ok = ok && !IsBitCopy(p, s);
        continue;
      }
      if (reading || s.iters.size() != 1 || s.dst.strides[0] != 1 || s.src1.strides[0] != 1 ||
          s.src2_kind == Operand2::kBuffer || s.op == Op::kMaxPool) {
        ok = false;
        break;
      }
      const int64_t lo = s.dst.base, hi = s.dst.base + s.iters[0];
      if (s.src1.buffer == buf) {  // in place: extends the chain of the ranges it covers
        if (!(s.src1 == s.dst)) {
          ok = false;
          break;
        }
        // ... of exactly a run of whole ranges.
        int64_t covered = 0;
        for (const Segment& g : segs) {
          if (g.lo >= lo && g.hi <= hi) covered += g.hi - g.lo;
          if (g.lo < hi && g.hi > lo && (g.lo < lo || g.hi > hi)) ok = false;
        }
        if (!ok || covered != hi - lo) {
          ok = false;
          break;
        }
        for (Segment& g : segs) {
          if (g.lo >= lo && g.hi <= hi) g.ops.emplace_back(s.op, s.scalar);
        }
        continue;
      }
      if (p.buffers[s.src1.buffer].role != Role::kInput) {
        ok = false;
        break;
      }
      for (const Segment& g : segs) ok = ok && (hi <= g.lo || g.hi <= lo);
      if (!ok) break;
      Segment g;
      g.lo = lo;
      g.hi = hi;
      g.source = s.src1.buffer;
      g.source_base = s.src1.base;
      if (s.op != Op::kCopy) g.ops.emplace_back(s.op, s.scalar);
      segs.push_back(std::move(g));
    }
    if (!ok || !reading || segs.empty()) continue;
    std::sort(segs.begin(), segs.end(),
              [](const Segment& a, const Segment& c) { return a.lo < c.lo; });
    int64_t covered = 0;
    for (const Segment& g : segs) {
      if (g.lo != covered) ok = false;
      covered = g.hi;
    }
    if (!ok || covered != p.buffers[b].count) continue;
    v[b].active = true;
    v[b].segments = std::move(segs);
  }
  return v;
}

struct Memory {
  const std::vector<Bound>& bufs;
  const std::vector<Virtual>& virtuals;
  const uint8_t* At(const Access& a, int64_t element) const {
    const Bound& b = bufs[a.buffer];
    return b.read + element * static_cast<int64_t>(b.size);
  }
  uint8_t* AtMutable(const Access& a, int64_t element) const {
    const Bound& b = bufs[a.buffer];
    return b.write + element * static_cast<int64_t>(b.size);
  }
  DataType Type(const Access& a) const { return bufs[a.buffer].dtype; }

  // The f32 values of n elements of a's buffer from `element` by `stride` (LoadTile, or the
  // computation of a virtual buffer's elements from its inputs).
  const float* Load(const Access& a, int64_t element, int64_t stride, size_t n,
                    float* scratch) const {
    if (!virtuals[a.buffer].active) {
      return internal::LoadTile(Type(a), At(a, element), stride, n, scratch);
    }
    const std::vector<Segment>& segs = virtuals[a.buffer].segments;
    const DataType type = bufs[a.buffer].dtype;
    auto segment_of = [&](int64_t e) {
      return std::upper_bound(segs.begin(), segs.end(), e,
                              [](int64_t x, const Segment& g) { return x < g.lo; }) -
             1;
    };
    auto piece = [&](const Segment& g, int64_t e, int64_t st, size_t len, float* out) {
      const Bound& src = bufs[g.source];
      const uint8_t* at = src.read + (g.source_base + (e - g.lo)) * static_cast<int64_t>(src.size);
      const float* x = internal::LoadTile(src.dtype, at, st, len, out);
      if (x != out) std::memcpy(out, x, len * 4);
      uint8_t bytes[internal::kTile * 4];
      for (const auto& [op, scalar] : g.ops) {
        internal::ApplyTile(op, out, nullptr, scalar, len, out);
        if (type != DataType::kF32) {  // stored to the buffer's type, as the interpreter would
          internal::StoreTile(type, bytes, 1, len, out);
          internal::LoadTile(type, bytes, 1, len, out);
        }
      }
    };
    const int64_t last = element + static_cast<int64_t>(n - 1) * stride;
    auto first_seg = segment_of(element), last_seg = segment_of(last);
    if (first_seg == last_seg) {
      piece(*first_seg, element, stride, n, scratch);
      return scratch;
    }
    if (stride == 1) {  // contiguous pieces, one per segment
      size_t done = 0;
      for (auto g = first_seg; done < n; ++g) {
        const int64_t e = element + static_cast<int64_t>(done);
        const size_t len = static_cast<size_t>(std::min<int64_t>(g->hi - e, n - done));
        piece(*g, e, 1, len, scratch + done);
        done += len;
      }
      return scratch;
    }
    for (size_t i = 0; i < n; ++i) {  // strided across segments: element by element
      const int64_t e = element + static_cast<int64_t>(i) * stride;
      piece(*segment_of(e), e, 1, 1, scratch + i);
    }
    return scratch;
  }
};

void RunFused(const Pass& pass, const Memory& mem) {
  const size_t levels = pass.iters.size(), inner = levels - 1, n_steps = pass.steps.size();
  std::vector<float> tiles((n_steps + 2) * kTile);
  std::vector<uint8_t> bytes(kTile * 4);
  float* load_a = tiles.data() + n_steps * kTile;
  float* load_b = load_a + kTile;
  std::vector<const float*> result(n_steps);
  // Results read by a later step of the pass go through their destination's type, as the
  // interpreter's store and load would.
  std::vector<bool> forwarded(n_steps, false);
  for (size_t s = 0; s < n_steps; ++s) {
    if (pass.forward1[s] >= 0) forwarded[pass.forward1[s]] = true;
    if (pass.forward2[s] >= 0) forwarded[pass.forward2[s]] = true;
  }
  const int64_t total = pass.iters[inner];
  WalkExcept(pass.iters, inner, inner, [&](const Index& idx) {
    for (int64_t j0 = 0; j0 < total; j0 += static_cast<int64_t>(kTile)) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(kTile, total - j0));
      Index at = idx;
      at[inner] = j0;
      for (size_t s = 0; s < n_steps; ++s) {
        const Step& st = pass.steps[s];
        auto operand = [&](const Access& a, int from, float* scratch) -> const float* {
          if (from >= 0) return result[from];
          return mem.Load(a, Offset(a, at, levels), a.strides[inner], n, scratch);
        };
        const float* a = operand(st.src1, pass.forward1[s], load_a);
        const float* b = st.src2_kind == Operand2::kBuffer
                             ? operand(st.src2, pass.forward2[s], load_b)
                             : nullptr;
        float* out = tiles.data() + s * kTile;
        const DataType dt = mem.Type(st.dst);
        if (st.op == Op::kCopy || st.op == Op::kCast) {
          // Into the step's own tile: `a` may be a load buffer the next step reuses, or memory
          // a later step of the pass overwrites in place.
          std::memcpy(out, a, n * 4);
          result[s] = out;
        } else {
          internal::ApplyTile(st.op, a, b, st.scalar, n, out);
          result[s] = out;
        }
        if (forwarded[s] && dt != DataType::kF32) {
          internal::StoreTile(dt, bytes.data(), 1, n, result[s]);
          result[s] = internal::LoadTile(dt, bytes.data(), 1, n, out);
        }
        if (pass.store[s]) {
          internal::StoreTile(dt, mem.AtMutable(st.dst, Offset(st.dst, at, levels)),
                              st.dst.strides[inner], n, result[s]);
        }
      }
    }
  });
}

// Max pooling by boxes: when some levels, window and outer ones among them, walk one contiguous
// block of the source (as a row of an image: (width, window column, channel)), each block is
// loaded once, contiguously, and the window's maxima are taken from it in the cache. The other
// window levels must come before the block's in the nest, so that every output sees its window's
// values in the interpreter's order. False when the pass has no such block.
bool RunMaxPoolBoxes(const Pass& pass, const Memory& mem) {
  constexpr int64_t kMaxBox = 16384;
  const Step& st = pass.steps[0];
  const size_t levels = pass.iters.size();
  const size_t outer = levels - static_cast<size_t>(st.window_levels);
  std::vector<bool> in_box(levels, false);
  int64_t box = 1;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t l = 0; l < levels; ++l) {
      if (!in_box[l] && pass.iters[l] > 1 && st.src1.strides[l] == box &&
          box * pass.iters[l] <= kMaxBox) {
        in_box[l] = true;
        box *= pass.iters[l];
        grew = true;
        break;
      }
    }
  }
  std::vector<size_t> box_outer, box_window, rest_outer, rest_window;
  for (size_t l = 0; l < levels; ++l) {
    (in_box[l] ? (l < outer ? box_outer : box_window) : (l < outer ? rest_outer : rest_window))
        .push_back(l);
  }
  if (box_outer.empty() || box_window.empty()) return false;
  if (!rest_window.empty() && rest_window.back() > box_window.front()) return false;
  // Offsets within the block of its outputs' windows (row-major over the block's window levels)
  // and of its outputs, and the outputs' destination offsets.
  auto offsets = [&](const std::vector<size_t>& ls, const Access& a) {
    std::vector<int64_t> off = {0};
    for (size_t l : ls) {
      std::vector<int64_t> next;
      for (int64_t o : off) {
        for (int64_t i = 0; i < pass.iters[l]; ++i) next.push_back(o + i * a.strides[l]);
      }
      off = std::move(next);
    }
    return off;
  };
  const std::vector<int64_t> win = offsets(box_window, st.src1);
  const std::vector<int64_t> src = offsets(box_outer, st.src1);
  const std::vector<int64_t> dst = offsets(box_outer, st.dst);
  const size_t k_out = src.size();
  bool dst_regular = k_out > 1;
  for (size_t k = 1; k < k_out && dst_regular; ++k) dst_regular = dst[k] == dst[1] * int64_t(k);
  std::vector<float> block(static_cast<size_t>(box)), m(k_out);
  const DataType d_type = mem.Type(st.dst);
  const size_t d_size = mem.bufs[st.dst.buffer].size;
  // Walks the levels in `ls` (row-major), others of `idx` fixed.
  auto walk = [&](const std::vector<size_t>& ls, Index idx, auto&& f) {
    for (;;) {
      f(idx);
      size_t i = ls.size();
      for (;;) {
        if (i == 0) return;
        --i;
        if (++idx[ls[i]] < pass.iters[ls[i]]) break;
        idx[ls[i]] = 0;
      }
    }
  };
  walk(rest_outer, Index{}, [&](const Index& o) {
    bool first = true;
    walk(rest_window, o, [&](const Index& p) {
      const int64_t base = Offset(st.src1, p, levels);
      for (int64_t done = 0; done < box;) {  // the block, contiguously, a tile at a time
        const size_t n = static_cast<size_t>(std::min<int64_t>(kTile, box - done));
        const float* x = mem.Load(st.src1, base + done, 1, n, block.data() + done);
        if (x != block.data() + done) std::memcpy(block.data() + done, x, n * 4);
        done += static_cast<int64_t>(n);
      }
      for (size_t k = 0; k < k_out; ++k) {
        const float* b = block.data() + src[k];
        float r = first ? b[win[0]] : m[k];
        for (size_t j = first ? 1 : 0; j < win.size(); ++j) {
          const float v = b[win[j]];
          r = (r != r) ? r : ((v != v || v > r) ? v : r);
        }
        m[k] = r;
      }
      first = false;
    });
    uint8_t* d = mem.AtMutable(st.dst, Offset(st.dst, o, levels));
    if (dst_regular) {
      for (size_t k = 0; k < k_out; k += kTile) {
        const size_t n = std::min(kTile, k_out - k);
        internal::StoreTile(d_type, d + dst[k] * static_cast<int64_t>(d_size), dst[1], n,
                            m.data() + k);
      }
    } else {
      for (size_t k = 0; k < k_out; ++k) {
        internal::StoreTile(d_type, d + dst[k] * static_cast<int64_t>(d_size), 1, 1, m.data() + k);
      }
    }
  });
  return true;
}

void RunMaxPool(const Pass& pass, const Memory& mem) {
  if (RunMaxPoolBoxes(pass, mem)) return;
  const Step& st = pass.steps[0];
  const size_t levels = pass.iters.size();
  const size_t outer = levels - static_cast<size_t>(st.window_levels);
  // Tiles along the outer level whose source elements lie closest together (the window's reads
  // then stream through memory), among levels long enough to fill a tile usefully; any order of
  // the outer points gives the same result (each is written once).
  size_t t = 0;
  auto better = [&](size_t l, size_t than) {
    const bool long_l = pass.iters[l] >= 16, long_than = pass.iters[than] >= 16;
    if (long_l != long_than) return long_l;
    if (!long_l) return pass.iters[l] > pass.iters[than];
    return std::llabs(st.src1.strides[l]) < std::llabs(st.src1.strides[than]);
  };
  for (size_t l = 1; l < outer; ++l) {
    if (better(l, t)) t = l;
  }
  std::vector<float> m(kTile), v(kTile);
  const int64_t total = outer > 0 ? pass.iters[t] : 1;
  const int64_t s_stride = outer > 0 ? st.src1.strides[t] : 0;
  const int64_t d_stride = outer > 0 ? st.dst.strides[t] : 0;
  const DataType d_type = mem.Type(st.dst);
  Shape window(pass.iters.begin() + static_cast<ptrdiff_t>(outer), pass.iters.end());
  WalkExcept(pass.iters, outer, outer > 0 ? t : levels, [&](const Index& idx) {
    for (int64_t j0 = 0; j0 < total; j0 += static_cast<int64_t>(kTile)) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(kTile, total - j0));
      Index at = idx;
      if (outer > 0) at[t] = j0;
      bool first = true;
      WalkExcept(window, window.size(), window.size(), [&](const Index& w) {
        Index p = at;
        for (size_t l = 0; l < window.size(); ++l) p[outer + l] = w[l];
        const float* x = mem.Load(st.src1, Offset(st.src1, p, levels), s_stride, n, v.data());
        if (first) {
          std::memcpy(m.data(), x, n * 4);
          first = false;
        } else {
          internal::MaxTile(x, n, m.data());
        }
      });
      internal::StoreTile(d_type, mem.AtMutable(st.dst, Offset(st.dst, at, levels)), d_stride, n,
                          m.data());
    }
  });
}

template <typename T>
void TransposeBlocks(const Pass& pass, const Memory& mem, size_t p, size_t q) {
  // dst is contiguous along q, src along p: 32 x 32 blocks, written in dst order.
  constexpr int64_t kBlock = 32;
  const Step& st = pass.steps[0];
  const size_t levels = pass.iters.size();
  const int64_t dp = st.dst.strides[p], sq = st.src1.strides[q];
  WalkExcept(pass.iters, levels, p, [&](const Index& outer) {
    if (outer[q] != 0) return;  // q is walked below
    for (int64_t i0 = 0; i0 < pass.iters[p]; i0 += kBlock) {
      for (int64_t j0 = 0; j0 < pass.iters[q]; j0 += kBlock) {
        Index at = outer;
        at[p] = i0;
        at[q] = j0;
        T* d = reinterpret_cast<T*>(mem.AtMutable(st.dst, Offset(st.dst, at, levels)));
        const T* s = reinterpret_cast<const T*>(mem.At(st.src1, Offset(st.src1, at, levels)));
        const int64_t ni = std::min(kBlock, pass.iters[p] - i0);
        const int64_t nj = std::min(kBlock, pass.iters[q] - j0);
        int64_t i4 = 0, j4 = 0;
        if constexpr (sizeof(T) == 4) {  // 4 x 4 tiles through SSE registers
          i4 = ni & ~int64_t{3};
          j4 = nj & ~int64_t{3};
          for (int64_t i = 0; i < i4; i += 4) {
            for (int64_t j = 0; j < j4; j += 4) {
              __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(s + i + (j + 0) * sq));
              __m128 r1 = _mm_loadu_ps(reinterpret_cast<const float*>(s + i + (j + 1) * sq));
              __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(s + i + (j + 2) * sq));
              __m128 r3 = _mm_loadu_ps(reinterpret_cast<const float*>(s + i + (j + 3) * sq));
              _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
              _mm_storeu_ps(reinterpret_cast<float*>(d + (i + 0) * dp + j), r0);
              _mm_storeu_ps(reinterpret_cast<float*>(d + (i + 1) * dp + j), r1);
              _mm_storeu_ps(reinterpret_cast<float*>(d + (i + 2) * dp + j), r2);
              _mm_storeu_ps(reinterpret_cast<float*>(d + (i + 3) * dp + j), r3);
            }
          }
        }
        for (int64_t i = 0; i < ni; ++i) {  // what the 4 x 4 tiles left
          for (int64_t j = i < i4 ? j4 : 0; j < nj; ++j) d[i * dp + j] = s[i + j * sq];
        }
      }
    }
  });
}

void RunBitCopy(const Pass& pass, const Memory& mem) {
  const Step& st = pass.steps[0];
  const size_t levels = pass.iters.size(), inner = levels - 1;
  const size_t size = mem.bufs[st.dst.buffer].size;
  if (st.dst.strides[inner] == 1 && st.src1.strides[inner] == 1) {
    const size_t row = static_cast<size_t>(pass.iters[inner]) * size;
    WalkExcept(pass.iters, inner, inner, [&](const Index& idx) {
      std::memmove(mem.AtMutable(st.dst, Offset(st.dst, idx, levels)),
                   mem.At(st.src1, Offset(st.src1, idx, levels)), row);
    });
    return;
  }
  size_t p = levels, q = levels;
  for (size_t l = 0; l < levels; ++l) {
    if (st.src1.strides[l] == 1 && pass.iters[l] > 1) p = l;
    if (st.dst.strides[l] == 1 && pass.iters[l] > 1) q = l;
  }
  if (p < levels && q < levels && p != q && (size == 1 || size == 2 || size == 4)) {
    if (size == 1) TransposeBlocks<uint8_t>(pass, mem, p, q);
    if (size == 2) TransposeBlocks<uint16_t>(pass, mem, p, q);
    if (size == 4) TransposeBlocks<uint32_t>(pass, mem, p, q);
    return;
  }
  WalkExcept(pass.iters, inner, inner, [&](const Index& idx) {
    uint8_t* d = mem.AtMutable(st.dst, Offset(st.dst, idx, levels));
    const uint8_t* s = mem.At(st.src1, Offset(st.src1, idx, levels));
    const int64_t ds = st.dst.strides[inner] * static_cast<int64_t>(size);
    const int64_t ss = st.src1.strides[inner] * static_cast<int64_t>(size);
    for (int64_t j = 0; j < pass.iters[inner]; ++j) std::memmove(d + j * ds, s + j * ss, size);
  });
}

}  // namespace

absl::StatusOr<Executor> Executor::Compile(Program program) {
  PLEXUS_RETURN_IF_ERROR(Validate(program));
  Executor e;
  e.program_ = std::move(program);
  const Program& p = e.program_;
  std::vector<Step> canonical = p.steps;
  for (Step& s : canonical) Canonicalize(s);
  e.virtual_ = FindVirtual(p, canonical);
  for (Step s : canonical) {
    if (e.virtual_[s.dst.buffer].active) continue;  // computed where it is read
    Pass::Kind kind = s.op == Op::kMaxPool ? Pass::Kind::kMaxPool
                      : IsBitCopy(p, s)    ? Pass::Kind::kBitCopy
                                           : Pass::Kind::kFused;
    // A copy of f32 passes through an f32 tile unchanged, so it may join a fused pass.
    const bool f32_copy =
        kind == Pass::Kind::kBitCopy && p.buffers[s.dst.buffer].dtype == DataType::kF32;
    if ((kind == Pass::Kind::kFused || f32_copy) && !e.passes_.empty() &&
        e.passes_.back().kind == Pass::Kind::kFused && TryFuse(e.passes_.back(), s)) {
      continue;
    }
    Pass pass;
    pass.kind = kind;
    pass.iters = s.iters;
    pass.steps = {s};
    pass.forward1 = {-1};
    pass.forward2 = {-1};
    e.passes_.push_back(std::move(pass));
  }
  // A step's result is stored when a later pass reads its buffer or the buffer is an output,
  // and no later step of its pass writes the same elements again.
  for (size_t i = 0; i < e.passes_.size(); ++i) {
    Pass& pass = e.passes_[i];
    pass.store.assign(pass.steps.size(), true);
    if (pass.kind != Pass::Kind::kFused) continue;
    MergePassLevels(pass);
    for (size_t s = 0; s < pass.steps.size(); ++s) {
      const int y = pass.steps[s].dst.buffer;
      bool last = true;
      for (size_t k = s + 1; k < pass.steps.size(); ++k)
        last = last && pass.steps[k].dst.buffer != y;
      bool read_later = p.buffers[y].role == Role::kOutput;
      for (size_t j = i + 1; j < e.passes_.size() && !read_later; ++j) {
        for (const Step& t : e.passes_[j].steps) read_later = read_later || Reads(t, y);
      }
      pass.store[s] = last && read_later;
    }
  }
  return e;
}

absl::Status Executor::Run(absl::Span<const ConstBytes> inputs,
                           absl::Span<const MutableBytes> outputs) const {
  // Scratch that no pass stores or reads from memory is never allocated.
  std::vector<bool> needed(program_.buffers.size(), false);
  for (const Pass& pass : passes_) {
    for (size_t s = 0; s < pass.steps.size(); ++s) {
      const Step& st = pass.steps[s];
      if (pass.store[s]) needed[st.dst.buffer] = true;
      const bool fused = pass.kind == Pass::Kind::kFused;
      if (!fused || pass.forward1[s] < 0) needed[st.src1.buffer] = true;
      if (st.src2_kind == Operand2::kBuffer && (!fused || pass.forward2[s] < 0)) {
        needed[st.src2.buffer] = true;
      }
    }
  }
  for (size_t b = 0; b < virtual_.size(); ++b) {
    if (virtual_[b].active) needed[b] = false;
  }
  internal::BoundBuffers bound;
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(program_, inputs, outputs, &bound, &needed));
  const Memory mem{bound.bufs, virtual_};
  for (const Pass& pass : passes_) {
    switch (pass.kind) {
      case Pass::Kind::kFused:
        RunFused(pass, mem);
        break;
      case Pass::Kind::kMaxPool:
        RunMaxPool(pass, mem);
        break;
      case Pass::Kind::kBitCopy:
        RunBitCopy(pass, mem);
        break;
    }
  }
  return absl::OkStatus();
}

std::string Executor::Describe() const {
  std::vector<std::string> lines;
  for (size_t i = 0; i < passes_.size(); ++i) {
    const Pass& pass = passes_[i];
    std::vector<std::string> ops;
    int stores = 0;
    for (size_t s = 0; s < pass.steps.size(); ++s) {
      ops.push_back(std::string(OpName(pass.steps[s].op)));
      stores += pass.store[s] ? 1 : 0;
    }
    const char* kind = pass.kind == Pass::Kind::kFused     ? "fused"
                       : pass.kind == Pass::Kind::kMaxPool ? "maxpool"
                                                           : "copy";
    lines.push_back(absl::StrCat("pass ", i, ": ", kind, " ", absl::StrJoin(ops, ", "), " over [",
                                 absl::StrJoin(pass.iters, ", "), "] (stores ", stores, " of ",
                                 pass.steps.size(), ")"));
  }
  for (size_t b = 0; b < virtual_.size(); ++b) {
    if (!virtual_[b].active) continue;
    std::vector<std::string> from;
    for (const Segment& g : virtual_[b].segments) {
      from.push_back(absl::StrCat("'", program_.buffers[g.source].name, "'"));
      if (!g.ops.empty()) {
        std::vector<std::string> ops;
        for (const auto& [op, scalar] : g.ops) ops.push_back(std::string(OpName(op)));
        absl::StrAppend(&from.back(), " (", absl::StrJoin(ops, ", "), ")");
      }
    }
    lines.push_back(absl::StrCat("virtual '", program_.buffers[b].name,
                                 "': computed where read from ", absl::StrJoin(from, ", ")));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace plexus::restructure
