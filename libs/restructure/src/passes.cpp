#include "passes.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace plexus::restructure::internal {

const float* Memory::Load(const Access& a, int64_t element, int64_t stride, size_t n,
                          float* scratch) const {
  if (!virtuals[a.buffer].active) {
    return LoadTile(Type(a), At(a, element), stride, n, scratch);
  }
  const std::vector<Segment>& segs = virtuals[a.buffer].segments;
  const DataType type = bufs[a.buffer].dtype;
  auto segment_of = [&](int64_t e) {
    return std::upper_bound(segs.begin(), segs.end(), e,
                            [](int64_t x, const Segment& g) { return x < g.lo; }) -
           1;
  };
  // The values of `len` elements from segment g: the source itself where it holds them (f32,
  // no ops), else `out`. The first op reads the source where it lies: copying a tile out of
  // memory first (a string copy per tile) measured as slow as the whole pass.
  auto piece = [&](const Segment& g, int64_t e, int64_t st, size_t len,
                   float* out) -> const float* {
    const Bound& src = bufs[g.source];
    const uint8_t* at = src.read + (g.source_base + (e - g.lo)) * static_cast<int64_t>(src.size);
    const float* x = LoadTile(src.dtype, at, st, len, out);
    for (const auto& [op, scalar] : g.ops) {
      ApplyTile(op, x, nullptr, scalar, len, out);
      x = out;
      RoundTile(type, out, len);  // stored to the buffer's type, as the interpreter would
    }
    return x;
  };
  auto piece_into = [&](const Segment& g, int64_t e, int64_t st, size_t len, float* out) {
    const float* x = piece(g, e, st, len, out);
    if (x != out) CopyTile(out, x, len);
  };
  const int64_t last = element + static_cast<int64_t>(n - 1) * stride;
  auto first_seg = segment_of(element), last_seg = segment_of(last);
  if (first_seg == last_seg) return piece(*first_seg, element, stride, n, scratch);
  if (stride == 1) {  // contiguous pieces, one per segment
    size_t done = 0;
    for (auto g = first_seg; done < n; ++g) {
      const int64_t e = element + static_cast<int64_t>(done);
      const size_t len = static_cast<size_t>(std::min<int64_t>(g->hi - e, n - done));
      piece_into(*g, e, 1, len, scratch + done);
      done += len;
    }
    return scratch;
  }
  for (size_t i = 0; i < n; ++i) {  // strided across segments: element by element
    const int64_t e = element + static_cast<int64_t>(i) * stride;
    piece_into(*segment_of(e), e, 1, 1, scratch + i);
  }
  return scratch;
}

bool Memory::Source(const Access& a, int64_t element, size_t* n, const uint8_t** src,
                    DataType* type, ChainOp* ops, size_t* n_ops) const {
  if (!virtuals[a.buffer].active) {
    *src = At(a, element);
    *type = Type(a);
    return true;
  }
  const std::vector<Segment>& segs = virtuals[a.buffer].segments;
  auto g = std::upper_bound(segs.begin(), segs.end(), element,
                            [](int64_t x, const Segment& s) { return x < s.lo; });
  if (g == segs.begin()) return false;
  --g;
  if (*n_ops + g->ops.size() > kMaxChainOps) return false;
  *n = std::min(*n, static_cast<size_t>(g->hi - element));
  const Bound& b = bufs[g->source];
  *src = b.read + (g->source_base + (element - g->lo)) * static_cast<int64_t>(b.size);
  *type = b.dtype;
  for (const auto& [op, scalar] : g->ops) ops[(*n_ops)++] = {op, scalar, bufs[a.buffer].dtype};
  return true;
}

bool IsChain(const Pass& pass) {
  const size_t n = pass.steps.size(), inner = pass.iters.size() - 1;
  if (n == 0 || n > kMaxChainOps / 2) return false;
  for (size_t s = 0; s < n; ++s) {
    const Step& st = pass.steps[s];
    if (pass.store[s] != (s + 1 == n) || pass.forward1[s] != static_cast<int>(s) - 1) {
      return false;
    }
    if (st.src2_kind == Operand2::kBuffer &&
        (pass.forward2[s] >= 0 || st.src2.strides[inner] != 1)) {
      return false;
    }
  }
  return pass.steps[0].src1.strides[inner] == 1 && pass.steps.back().dst.strides[inner] == 1;
}

namespace {

// Elements [begin, end) of a row of a chain pass (at: the row's index) in registers
// (RunChain), a run of one source at a time (a computed scratch's segments); returns how many
// from `begin` it did, the rest being left to the tiles.
int64_t RunChainRow(const Pass& pass, const Memory& mem, Index at, int64_t begin, int64_t end) {
  const size_t levels = pass.iters.size();
  const Step& first = pass.steps.front();
  const Step& out = pass.steps.back();
  int64_t done = begin;
  while (done < end) {
    at[levels - 1] = done;
    size_t n = static_cast<size_t>(end - done);
    ChainOp ops[kMaxChainOps];
    size_t n_ops = 0;
    const uint8_t* src = nullptr;
    DataType type = DataType::kF32;
    if (!mem.Source(first.src1, Offset(first.src1, at, levels), &n, &src, &type, ops, &n_ops)) {
      break;
    }
    bool ok = true;
    for (size_t s = 0; s < pass.steps.size() && ok; ++s) {
      const Step& st = pass.steps[s];
      // Stored and loaded through its buffer's type where a later step reads it (RunFused).
      const bool last = s + 1 == pass.steps.size();
      ops[n_ops] = {st.op, st.scalar, last ? DataType::kF32 : mem.Type(st.dst), nullptr};
      float r;  // a division by a power of two is the multiplication by its reciprocal
      if (st.op == Op::kDiv && st.src2_kind != Operand2::kBuffer &&
          ExactReciprocal(st.scalar, &r)) {
        ops[n_ops].op = Op::kMul;
        ops[n_ops].scalar = r;
      }
      if (st.src2_kind == Operand2::kBuffer) {  // f32 in memory, read where it lies
        ok = !mem.virtuals[st.src2.buffer].active && mem.Type(st.src2) == DataType::kF32;
        ops[n_ops].operand =
            reinterpret_cast<const float*>(mem.At(st.src2, Offset(st.src2, at, levels)));
      }
      ++n_ops;
    }
    if (!ok || !RunChain(type, src, ops, n_ops, mem.Type(out.dst),
                         mem.AtMutable(out.dst, Offset(out.dst, at, levels)), n)) {
      break;
    }
    done += static_cast<int64_t>(n);
  }
  return done - begin;
}

}  // namespace

void RunFused(const Pass& pass, const Memory& mem, int64_t first, int64_t last) {
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
  // A chain runs in registers where RunChain takes its rows; tiles otherwise.
  const bool chain = IsChain(pass);
  // Row by row (a row: the innermost level), tile by tile, over the points [first, last).
  const int64_t total = pass.iters[inner];
  int64_t points = 1;
  for (int64_t i : pass.iters) points *= i;
  if (last < 0) last = points;
  for (int64_t row = first / total; row * total < last; ++row) {
    Index idx{};
    for (size_t l = inner, r = static_cast<size_t>(row); l-- > 0;) {
      idx[l] = static_cast<int64_t>(r % static_cast<size_t>(pass.iters[l]));
      r /= static_cast<size_t>(pass.iters[l]);
    }
    int64_t begin = std::max<int64_t>(0, first - row * total);
    const int64_t end = std::min<int64_t>(total, last - row * total);
    if (chain) begin += RunChainRow(pass, mem, idx, begin, end);
    for (int64_t j0 = begin; j0 < end; j0 += static_cast<int64_t>(kTile)) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(kTile, end - j0));
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
          // A value of `a` already: kept as it is when `a` is an earlier step's tile (stable for
          // the rest of the tile) or when no later step reads it; copied into the step's own
          // tile when a later step does and `a` is a load buffer the next step reuses, or memory
          // a later step of the pass may overwrite in place.
          const bool stable = (a >= tiles.data() && a < load_a) || !forwarded[s];
          if (!stable) CopyTile(out, a, n);
          result[s] = stable ? a : out;
        } else {
          ApplyTile(st.op, a, b, st.scalar, n, out);
          result[s] = out;
        }
        if (forwarded[s] && dt != DataType::kF32) {
          StoreTile(dt, bytes.data(), 1, n, result[s]);
          result[s] = LoadTile(dt, bytes.data(), 1, n, out);
        }
        if (pass.store[s]) {
          uint8_t* to = mem.AtMutable(st.dst, Offset(st.dst, at, levels));
          // Not into a stream's window: that memory is the transport's, read right after. Only
          // f32 here: the tile holds the output's bytes.
          if (pass.stream[s] && st.dst.buffer != mem.window && dt == DataType::kF32) {
            StreamCopy(to, result[s], n * sizeof(float));
          } else {
            StoreTile(dt, to, st.dst.strides[inner], n, result[s]);
          }
        }
      }
    }
  }
  // Streamed stores are weakly ordered: fenced before anyone reads the output.
  for (size_t s = 0; s < n_steps; ++s) {
    if (pass.stream[s]) {
      StreamFence();
      break;
    }
  }
}

// Max pooling by boxes: when some levels, window and outer ones among them, walk one contiguous
// block of the source (as a row of an image: (width, window column, channel)), each block is
// loaded once, contiguously, and the window's maxima are taken from it in the cache. The other
// window levels must come before the block's in the nest, so that every output sees its window's
// values in the interpreter's order. False when the pass has no such block.
namespace {

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
  const std::vector<int64_t> src = offsets(box_outer, st.src1);
  const std::vector<int64_t> dst = offsets(box_outer, st.dst);
  const size_t k_out = src.size();
  bool dst_regular = k_out > 1;
  for (size_t k = 1; k < k_out && dst_regular; ++k) dst_regular = dst[k] == dst[1] * int64_t(k);
  // The outputs' values are picked from the reduced block (`select`): as runs of `run`
  // consecutive positions every `period` where the offsets are such (an image's channels at
  // every window start), else by gathering each offset.
  int64_t run = 1;
  while (static_cast<size_t>(run) < k_out && src[run] == src[0] + run) ++run;
  const int64_t period = static_cast<size_t>(run) < k_out ? src[run] - src[0] : 0;
  bool runs = k_out % static_cast<size_t>(run) == 0 &&
              (run == static_cast<int64_t>(k_out) || period >= run);
  for (size_t k = 0; k < k_out && runs; ++k) {
    runs =
        src[k] == src[0] + static_cast<int64_t>(k) / run * period + static_cast<int64_t>(k) % run;
  }
  // The common 2 x 2 window (both its levels in the block) with increasing offsets is reduced in
  // one pass a few hundred outputs at a time: the two rows it reads stream from memory while
  // what was reduced is still in the first-level cache.
  bool increasing = true;
  for (size_t k = 1; k < k_out && increasing; ++k) increasing = src[k] > src[k - 1];
  const bool window_2x2 = box_window.size() == 2 && pass.iters[box_window[0]] == 2 &&
                          pass.iters[box_window[1]] == 2 && increasing;
  const size_t chunk = window_2x2 ? static_cast<size_t>(runs ? 128 * run : 512) : k_out;
  std::vector<float> block(static_cast<size_t>(box)), reduced(static_cast<size_t>(box)), m(k_out);
  std::vector<float> picked(chunk);
  std::vector<int32_t> at(chunk);
  // out[0, k1 - k0) = the values of outputs [k0, k1) in `values`, which holds the block's
  // positions from src[k0] on.
  auto select = [&](const float* values, size_t k0, size_t k1, float* out) {
    if (runs) {
      return CompactRuns(values, run, period, static_cast<int64_t>(k1 - k0) / run, out);
    }
    for (size_t k = k0; k < k1; ++k) at[k - k0] = static_cast<int32_t>(src[k] - src[k0]);
    GatherTile(values, at.data(), k1 - k0, out);
  };
  // f32 in memory (not a computed buffer, not a stream's window) is reduced where it lies.
  const bool direct = !mem.virtuals[st.src1.buffer].active && st.src1.buffer != mem.window &&
                      mem.Type(st.src1) == DataType::kF32;
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
  // Contiguous f32 outputs written once each (no window level outside the block) are selected
  // straight into the destination: storing them from `m` afterwards cost as much again.
  const bool select_out =
      rest_window.empty() && d_type == DataType::kF32 && dst_regular && dst[1] == 1;
  walk(rest_outer, Index{}, [&](const Index& o) {
    float* out = select_out
                     ? reinterpret_cast<float*>(mem.AtMutable(st.dst, Offset(st.dst, o, levels)))
                     : m.data();
    bool first = true;
    walk(rest_window, o, [&](const Index& p) {
      const int64_t base = Offset(st.src1, p, levels);
      // The block, contiguously: f32 in memory is read where it is; else a tile at a time.
      const float* cur = block.data();
      if (direct) {
        cur = reinterpret_cast<const float*>(mem.At(st.src1, base));
      } else {
        for (int64_t done = 0; done < box;) {
          const size_t n = static_cast<size_t>(std::min<int64_t>(kTile, box - done));
          const float* x = mem.Load(st.src1, base + done, 1, n, block.data() + done);
          if (x != block.data() + done) CopyTile(block.data() + done, x, n);
          done += static_cast<int64_t>(n);
        }
      }
      // Outputs [k0, k1) selected from their reduced values, into `out` the first time, else
      // as the later window values of outputs the earlier ones already set.
      auto finish = [&](const float* values, size_t k0, size_t k1) {
        if (first) return select(values, k0, k1, out + k0);
        select(values, k0, k1, picked.data());
        MaxTile(picked.data(), k1 - k0, m.data() + k0);
      };
      if (window_2x2) {
        // The window's four values in the interpreter's order, over the positions from the
        // chunk's first output to its last.
        const int64_t outer_stride = st.src1.strides[box_window[0]];
        const int64_t inner_stride = st.src1.strides[box_window[1]];
        for (size_t k0 = 0; k0 < k_out; k0 += chunk) {
          const size_t k1 = std::min(k_out, k0 + chunk);
          const float* a = cur + src[k0];
          Max4Tile(a, a + inner_stride, a + outer_stride, a + outer_stride + inner_stride,
                   static_cast<size_t>(src[k1 - 1] - src[k0] + 1), reduced.data());
          finish(reduced.data(), k0, k1);
        }
        first = false;
        return;
      }
      // The block's window levels reduced one at a time, innermost first, each as shifted
      // maxima over the whole block (vectorised): the leftmost maximum of a window is the
      // leftmost maximum of its rows' leftmost maxima, so the interpreter's order is kept.
      // Only the positions whose whole window of the level lies in what is still valid are
      // reduced; every later read (an outer level's window, an output's window start) falls
      // among them, as every window lies in the block.
      float* next = reduced.data();
      int64_t valid = box;
      for (auto l = box_window.rbegin(); l != box_window.rend(); ++l) {
        const int64_t stride = st.src1.strides[*l];
        const int64_t n = valid - (pass.iters[*l] - 1) * stride;
        Max2Tile(cur, cur + stride, static_cast<size_t>(n), next);
        for (int64_t t = 2; t < pass.iters[*l]; ++t) {
          MaxTile(cur + t * stride, static_cast<size_t>(n), next);
        }
        valid = n;
        cur = next;
        next = next == reduced.data() ? block.data() : reduced.data();
      }
      for (size_t k0 = 0; k0 < k_out; k0 += chunk) {
        finish(cur + src[k0], k0, std::min(k_out, k0 + chunk));
      }
      first = false;
    });
    if (select_out) return;
    uint8_t* d = mem.AtMutable(st.dst, Offset(st.dst, o, levels));
    if (dst_regular) {
      for (size_t k = 0; k < k_out; k += kTile) {
        const size_t n = std::min(kTile, k_out - k);
        StoreTile(d_type, d + dst[k] * static_cast<int64_t>(d_size), dst[1], n, m.data() + k);
      }
    } else {
      for (size_t k = 0; k < k_out; ++k) {
        StoreTile(d_type, d + dst[k] * static_cast<int64_t>(d_size), 1, 1, m.data() + k);
      }
    }
  });
  return true;
}

}  // namespace

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
          CopyTile(m.data(), x, n);
          first = false;
        } else {
          MaxTile(x, n, m.data());
        }
      });
      StoreTile(d_type, mem.AtMutable(st.dst, Offset(st.dst, at, levels)), d_stride, n, m.data());
    }
  });
}

namespace {

template <typename T>
void TransposeBlocks(const Pass& pass, const Memory& mem, size_t p, size_t q) {
  // dst is contiguous along q, src along p. 4-byte elements go in strips of 16 along p (a cache
  // line of src) across the whole of q: each line of src is read once and the strip's 16 rows
  // of dst are written in order together, where square blocks read each line in several sweeps
  // (docs/measurements/restructure.md); others in 32 x 32 blocks element by element.
  constexpr int64_t kBlock = 32;
  constexpr int64_t kStrip = 64 / sizeof(T);
  const Step& st = pass.steps[0];
  const size_t levels = pass.iters.size();
  const int64_t dp = st.dst.strides[p], sq = st.src1.strides[q];
  WalkExcept(pass.iters, levels, p, [&](const Index& outer) {
    if (outer[q] != 0) return;  // q is walked below
    if constexpr (sizeof(T) == 4) {
      for (int64_t i0 = 0; i0 < pass.iters[p]; i0 += kStrip) {
        Index at = outer;
        at[p] = i0;
        TransposeStrip4(mem.At(st.src1, Offset(st.src1, at, levels)), sq,
                        mem.AtMutable(st.dst, Offset(st.dst, at, levels)), dp,
                        std::min(kStrip, pass.iters[p] - i0), pass.iters[q]);
      }
      return;
    }
    for (int64_t i0 = 0; i0 < pass.iters[p]; i0 += kBlock) {
      for (int64_t j0 = 0; j0 < pass.iters[q]; j0 += kBlock) {
        Index at = outer;
        at[p] = i0;
        at[q] = j0;
        T* d = reinterpret_cast<T*>(mem.AtMutable(st.dst, Offset(st.dst, at, levels)));
        const T* s = reinterpret_cast<const T*>(mem.At(st.src1, Offset(st.src1, at, levels)));
        const int64_t ni = std::min(kBlock, pass.iters[p] - i0);
        const int64_t nj = std::min(kBlock, pass.iters[q] - j0);
        for (int64_t i = 0; i < ni; ++i) {
          for (int64_t j = 0; j < nj; ++j) d[i * dp + j] = s[i + j * sq];
        }
      }
    }
  });
}

}  // namespace

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

}  // namespace plexus::restructure::internal
