#include "plexus/restructure/executor.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "passes.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/types.hpp"

namespace plexus::restructure {
namespace {

using internal::Pass;
using internal::Segment;
using internal::Shape;
using internal::Virtual;

// A pass fuses at most this many steps (their f32 tiles stay in L1/L2).
constexpr size_t kMaxFusedSteps = 16;
// Outputs from this size on are stored past the cache (Pass::stream).
constexpr int64_t kStreamBytes = int64_t{8} << 20;

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
    // A level of one iteration moves nothing. Any other lies within exactly one original level
    // of more than one iteration (their point ranges [below, below * iters) tile the nest).
    size_t l = 0;
    while (
        refined[j] > 1 && l < orig.size() &&
        !(orig[l] > 1 && below[l] <= refined_below[j] && refined_below[j] < below[l] * orig[l])) {
      ++l;
    }
    for (size_t k = 0; k < ops.size(); ++k) {
      strides[k].push_back(refined[j] > 1 && l < orig.size()
                               ? ops[k]->strides[l] * (refined_below[j] / below[l])
                               : 0);
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

}  // namespace

namespace internal {
std::optional<Shape> CommonShape(const Shape& a, const Shape& b) { return CommonRefinement(a, b); }
Step ReexpressStep(const Step& s, const Shape& refined) { return Reexpress(s, refined); }
}  // namespace internal

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
    // Large f32 outputs that nothing later reads are streamed past the cache (about a quarter of
    // a server's last-level cache: below it the output may well be read from the cache next).
    pass.stream.assign(pass.steps.size(), false);
    for (size_t s = 0; s < pass.steps.size(); ++s) {
      const Step& st = pass.steps[s];
      const BufferDecl& out = p.buffers[st.dst.buffer];
      bool read_later = false;
      for (size_t j = i + 1; j < e.passes_.size() && !read_later; ++j) {
        for (const Step& t : e.passes_[j].steps) read_later = read_later || Reads(t, st.dst.buffer);
      }
      const int64_t out_bytes = out.count * static_cast<int64_t>(kernels::DataTypeSize(out.dtype));
      // f32 only: its tile is the output's bytes. Converting into a cached buffer first and
      // streaming that out measured slower than cached stores for f16 and bf16 outputs; a chain
      // kept in registers stores through the cache as well, which measured faster than
      // streaming from its registers (docs/measurements/restructure.md).
      pass.stream[s] = pass.store[s] && out.role == Role::kOutput && !read_later &&
                       out.dtype == DataType::kF32 && st.dst.strides.back() == 1 &&
                       out_bytes >= kStreamBytes && !internal::IsChain(pass);
    }
  }
  return e;
}

std::vector<bool> Executor::NeededScratch() const {
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
  return needed;
}

void Executor::RunPass(size_t i, const internal::Memory& mem) const {
  const Pass& pass = passes_[i];
  switch (pass.kind) {
    case Pass::Kind::kFused:
      internal::RunFused(pass, mem);
      break;
    case Pass::Kind::kMaxPool:
      internal::RunMaxPool(pass, mem);
      break;
    case Pass::Kind::kBitCopy:
      internal::RunBitCopy(pass, mem);
      break;
  }
}

absl::Status Executor::Run(absl::Span<const ConstBytes> inputs,
                           absl::Span<const MutableBytes> outputs) const {
  const std::vector<bool> needed = NeededScratch();
  internal::BoundBuffers bound;
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(program_, inputs, outputs, &bound, &needed));
  const internal::Memory mem{bound.bufs, virtual_};
  for (size_t i = 0; i < passes_.size(); ++i) RunPass(i, mem);
  return absl::OkStatus();
}

std::string Executor::Describe() const {
  std::vector<std::string> lines;
  for (size_t i = 0; i < passes_.size(); ++i) {
    const Pass& pass = passes_[i];
    std::vector<std::string> ops;
    int stores = 0, streamed = 0;
    for (size_t s = 0; s < pass.steps.size(); ++s) {
      ops.push_back(std::string(OpName(pass.steps[s].op)));
      stores += pass.store[s] ? 1 : 0;
      streamed += s < pass.stream.size() && pass.stream[s] ? 1 : 0;
    }
    const char* kind = pass.kind == Pass::Kind::kFused     ? "fused"
                       : pass.kind == Pass::Kind::kMaxPool ? "maxpool"
                                                           : "copy";
    lines.push_back(absl::StrCat(
        "pass ", i, ": ", kind, " ", absl::StrJoin(ops, ", "), " over [",
        absl::StrJoin(pass.iters, ", "), "] (stores ", stores, " of ", pass.steps.size(),
        streamed > 0 ? absl::StrCat(", ", streamed, " streamed") : "", ")"));
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
