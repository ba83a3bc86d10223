// The fast executor: a Program compiled once into passes over memory and run many times, with
// the interpreter's results (interpreter.hpp).
//
// - Element-wise steps (kCast, kAdd, kMul, kDiv, kPow, kLog10, and kCopy of f32) that walk the
//   same points are fused into one pass: the nest is cut into tiles along its innermost level,
//   each step's result stays in an L1-resident f32 tile that the next step reads, and only what
//   is read later (outputs, and scratch a later pass reads) is stored. A chain of element-wise
//   ops reads its inputs and writes its outputs once. Nests that describe the same points with
//   other levels (a flat [n] and a [rows, cols]) are brought to a common shape first.
// - Loads and stores convert in bulk (f16/bf16 through the kernels' F16C casts, the same ones the
//   collectives' wire casts use); f32 operands in contiguous memory are used in place.
// - A scratch buffer whose every element is an input element copied or transformed by
//   element-wise ops with scalar operands (a concat's parts, a scaled frame) is never written:
//   the passes that read it load the input and apply the ops as they go.
// - kMaxPool is a pass of its own, vectorised along an outer level; bit copies (kCopy, and
//   kCast to the same type) are contiguous copies, blocked transposes (32 x 32) when the two
//   operands are contiguous along different levels, or element copies.
//
// Results equal the interpreter's bit for bit, except: kPow with a scalar exponent of exactly 2
// computes x * x (correctly rounded; the interpreter's std::pow is within 1 ULP of it), and kLog10
// uses a polynomial (within kLog10MaxUlp of std::log10 for every float; special values -- zero,
// negatives, infinities, NaN, subnormals -- exactly as std::log10).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure {
namespace internal {
struct Memory;
}  // namespace internal

inline constexpr int kLog10MaxUlp = 3;

class Executor {
 public:
  // Validates `program` and plans its passes.
  static absl::StatusOr<Executor> Compile(Program program);

  // Runs the program: the same contract as Interpret (buffers in declaration order, exact sizes,
  // outputs not overlapping other caller buffers). Thread-safe: Run holds no state between calls.
  absl::Status Run(absl::Span<const ConstBytes> inputs,
                   absl::Span<const MutableBytes> outputs) const;

  // The passes, one line each ("pass 1: fused mul, pow, cast over [6291456] (stores 1 of 3)").
  std::string Describe() const;
  int passes() const { return static_cast<int>(passes_.size()); }
  const Program& program() const { return program_; }

  // What one pass does; public for the implementation's helpers, not a user API.
  struct Pass {
    enum class Kind { kFused, kMaxPool, kBitCopy } kind = Kind::kFused;
    std::vector<int64_t> iters;  // the common nest of the pass's steps
    // Per step of the pass (steps[first .. first + count) of program_, re-expressed on `iters`).
    std::vector<Step> steps;
    // kFused: for each step, the step (index within the pass) whose result its src1 / src2 is,
    // or -1 (read from memory); and whether its result is stored.
    std::vector<int> forward1, forward2;
    std::vector<bool> store;
    // kFused: per step, whether its contiguous stores bypass the cache (a large output that no
    // later pass reads: a cached store would first read each line it writes).
    std::vector<bool> stream;
  };
  // A scratch buffer that is never materialised: every element is a function of an input element
  // (a copy, or a chain of element-wise ops with scalar operands, as its writing steps computed
  // it), and the passes that read it compute it from the input as they load. `segments` cover the
  // buffer; public for the implementation's helpers, not a user API.
  struct Segment {
    int64_t lo = 0, hi = 0;                 // elements [lo, hi) of the buffer
    int source = -1;                        // the input buffer
    int64_t source_base = 0;                // element lo is source[source_base]
    std::vector<std::pair<Op, float>> ops;  // applied in order, each stored to the buffer's type
  };
  struct VirtualBuffer {
    bool active = false;
    std::vector<Segment> segments;  // sorted by lo
  };

 private:
  friend class OutputStream;
  friend class InputStream;
  Executor() = default;
  std::vector<bool> NeededScratch() const;
  void RunPass(size_t i, const internal::Memory& mem) const;
  Program program_;
  std::vector<Pass> passes_;
  std::vector<VirtualBuffer> virtual_;  // indexed like program_.buffers
};

}  // namespace plexus::restructure
