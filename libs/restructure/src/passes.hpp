// The fast executor's passes over memory (executor.hpp): the bound buffers with the virtual
// ones, the walks over a nest, and one function per kind of pass. Shared by the executor and
// the streams (stream.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "bind.hpp"
#include "plexus/restructure/executor.hpp"
#include "tile.hpp"

namespace plexus::restructure::internal {

using Shape = std::vector<int64_t>;
using Pass = Executor::Pass;
using Virtual = Executor::VirtualBuffer;
using Segment = Executor::Segment;

using Index = std::array<int64_t, kMaxLevels>;

// The coarsest shape that refines both (each level of either is a run of its levels), if any;
// and an element-wise step re-expressed on a refinement of its shape (the executor's fusion,
// also the device executor's).
std::optional<Shape> CommonShape(const Shape& a, const Shape& b);
Step ReexpressStep(const Step& s, const Shape& refined);

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

inline int64_t Offset(const Access& a, const Index& idx, size_t levels) {
  int64_t o = a.base;
  for (size_t l = 0; l < levels; ++l) o += idx[l] * a.strides[l];
  return o;
}

// The program's buffers as one pass sees them. A window redirects one buffer's elements
// [window_first, ...) to other memory (a stream's piece of an input or output).
struct Memory {
  const std::vector<Bound>& bufs;
  const std::vector<Virtual>& virtuals;
  int window = -1;
  int64_t window_first = 0;
  const uint8_t* window_read = nullptr;
  uint8_t* window_write = nullptr;
  const uint8_t* At(const Access& a, int64_t element) const {
    const Bound& b = bufs[a.buffer];
    if (a.buffer == window) {
      return window_read + (element - window_first) * static_cast<int64_t>(b.size);
    }
    return b.read + element * static_cast<int64_t>(b.size);
  }
  uint8_t* AtMutable(const Access& a, int64_t element) const {
    const Bound& b = bufs[a.buffer];
    if (a.buffer == window) {
      return window_write + (element - window_first) * static_cast<int64_t>(b.size);
    }
    return b.write + element * static_cast<int64_t>(b.size);
  }
  DataType Type(const Access& a) const { return bufs[a.buffer].dtype; }

  // The f32 values of n elements of a's buffer from `element` by `stride` (LoadTile, or the
  // computation of a virtual buffer's elements from its inputs).
  const float* Load(const Access& a, int64_t element, int64_t stride, size_t n,
                    float* scratch) const;
  // Where contiguous elements of a's buffer from `element` come from: memory of type *type at
  // *src, through the ops appended to ops[*n_ops...] (a virtual buffer's, rounded to its type),
  // for the first *n of them (clipped to one virtual segment). False when the ops do not fit.
  bool Source(const Access& a, int64_t element, size_t* n, const uint8_t** src, DataType* type,
              ChainOp* ops, size_t* n_ops) const;
};

// A fused pass that is one chain (RunFused keeps it in registers where RunChain takes it): its
// first step reads memory, each later one takes the step before as src1 with a scalar, no src2
// or a src2 read from memory, only the last stores, and the first source, every src2 and the
// last destination are contiguous along the innermost level.
bool IsChain(const Pass& pass);

// The points [first, last) of the pass's nest in row-major order (last -1: to the end).
void RunFused(const Pass& pass, const Memory& mem, int64_t first = 0, int64_t last = -1);
void RunMaxPool(const Pass& pass, const Memory& mem);
void RunBitCopy(const Pass& pass, const Memory& mem);

}  // namespace plexus::restructure::internal
