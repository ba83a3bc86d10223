// The restructuring IR: a Program is a plain value (buffers and steps) that the validator proves
// safe, the format carries between processes and every executor runs with the same result.
//
// Modelled on the per-operand loop configuration of a data restructuring accelerator: each step
// has one loop nest (up to kMaxLevels levels, level 0 outermost) and each operand walks it with
// its own base and one signed stride per level. Buffers are flat arrays of elements; shapes exist
// only in the strides.
//
// Semantics (the reference interpreter, interpreter.hpp, defines them):
// - Every point of the nest, in row-major order (the last level fastest), computes
//     dst[dst.base + sum_l i_l * dst.stride[l]] =
//         op(src1[src1.base + sum_l i_l * src1.stride[l]], src2[...] or scalar).
// - Each source element is loaded and converted to f32 (i32 rounds to nearest even; f16, bf16,
//   i8 and u8 are exact), the op is computed in f32 (kPow: std::pow(float, float), kLog10:
//   std::log10(float)), and the result is stored in the destination's type: f16/bf16 round to
//   nearest even (kernels::FloatToHalf / FloatToBf16), integers round to nearest even and
//   saturate to the type's range, NaN stores as 0 in an integer type.
// - kCopy needs dst and src1 of the same type and copies bits; kCast of a same-type element
//   copies bits too.
// - kMaxPool reduces the innermost `window_levels` levels: dst at each outer point is the
//   maximum of src1 over the window (a NaN anywhere in the window gives NaN; of equal values the
//   first in iteration order is kept). The dst strides of the window levels are 0.
// - Scratch buffers start zero-filled; output elements no step writes keep the caller's bytes.
// - Steps run in order; a step sees every earlier step's writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "plexus/kernels/types.hpp"

namespace plexus::restructure {

using kernels::DataType;

inline constexpr int kMaxLevels = 6;
inline constexpr int kMaxBuffers = 64;
inline constexpr int kMaxSteps = 1024;
inline constexpr size_t kMaxNameBytes = 64;
// Refused beyond these: a buffer's element count, a step's total iterations, |base| and |stride|.
inline constexpr int64_t kMaxElements = int64_t{1} << 40;
inline constexpr int64_t kMaxIterations = int64_t{1} << 40;

enum class Op : uint8_t {
  kCopy = 0,     // dst = src1 (same type, bit copy); layout ops are copies with strides
  kCast = 1,     // dst = src1 converted to dst's type
  kAdd = 2,      // dst = src1 + src2
  kMul = 3,      // dst = src1 * src2
  kDiv = 4,      // dst = src1 / src2
  kPow = 5,      // dst = src1 ** src2
  kLog10 = 6,    // dst = log10(src1)
  kMaxPool = 7,  // dst[outer] = max over the innermost window_levels levels of src1
};
inline constexpr int kNumOps = 8;
// "copy", "cast", "add", "mul", "div", "pow", "log10", "maxpool".
std::string_view OpName(Op op);
// True for kAdd, kMul, kDiv, kPow: they take src2 (a buffer or a scalar).
bool IsBinary(Op op);

enum class Role : uint8_t { kInput = 0, kOutput = 1, kScratch = 2 };
// "input", "output", "scratch".
std::string_view RoleName(Role role);

// One flat array of `count` elements. Names are 1..kMaxNameBytes printable ASCII characters
// (no space or quote), unique within a program: error messages name buffers by them.
struct BufferDecl {
  std::string name;
  DataType dtype = DataType::kF32;
  int64_t count = 0;
  Role role = Role::kInput;
  friend bool operator==(const BufferDecl&, const BufferDecl&) = default;
};

// How one operand walks the step's loop nest: element index = base + sum_l i_l * strides[l].
// strides has exactly one entry per level of the step.
struct Access {
  int buffer = 0;  // index into Program::buffers
  int64_t base = 0;
  std::vector<int64_t> strides;
  friend bool operator==(const Access&, const Access&) = default;
};

// What a binary op takes as its second operand.
enum class Operand2 : uint8_t { kNone = 0, kBuffer = 1, kScalar = 2 };

struct Step {
  Op op = Op::kCopy;
  std::vector<int64_t> iters;  // iteration count per level, level 0 outermost; each >= 1
  Access dst;
  Access src1;
  Operand2 src2_kind = Operand2::kNone;
  Access src2;            // when src2_kind == kBuffer (otherwise empty)
  float scalar = 0;       // when src2_kind == kScalar (otherwise 0)
  int window_levels = 0;  // kMaxPool only: 1..levels
  // Compares `scalar` by bits, so that NaN scalars compare equal to themselves.
  friend bool operator==(const Step& a, const Step& b);
};

struct Program {
  std::vector<BufferDecl> buffers;
  std::vector<Step> steps;
  friend bool operator==(const Program&, const Program&) = default;
};

// Whether the restructure library handles `dtype`: f32, f16, bf16, i32, i8, u8.
bool SupportedType(DataType dtype);

// Proves, before anything runs, that the program is well formed and every access of every step
// stays inside its buffer. InvalidArgument naming the step, op, operand and buffer otherwise
// ("step 3 (mul): src1 'spectrum' reaches element 1048576 but has 1048576 elements"). Checks:
// limits above; supported types; unique valid names; op arity (binary ops have src2, others
// none); kCopy types equal; dst not an input; 1..kMaxLevels levels, one stride per level, every
// iteration count >= 1, total iterations <= kMaxIterations; window_levels only on kMaxPool and
// its dst strides 0 there; no step reads a scratch or output buffer that no earlier step writes;
// each dst writes every element at most once per outer point (a sufficient condition on the
// strides: sorted by magnitude, each exceeds the span of the smaller ones); a dst in the same
// buffer as a source either is identical to that access (in place) or touches a disjoint
// element range. All index arithmetic is overflow-checked int64.
absl::Status Validate(const Program& program);

// Sizes a caller may bound before running a program (e.g. a peer's).
struct ProgramSize {
  int64_t iterations = 0;   // sum over steps of the product of their iteration counts
  int64_t input_bytes = 0;  // declared bytes per role
  int64_t output_bytes = 0;
  int64_t scratch_bytes = 0;
};
// Of a validated program (the sums cannot overflow within the limits above).
ProgramSize MeasureProgram(const Program& program);

}  // namespace plexus::restructure
