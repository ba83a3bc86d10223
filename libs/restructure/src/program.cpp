#include "plexus/restructure/program.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/names.hpp"
#include "plexus/base/status.hpp"

namespace plexus::restructure {
namespace {

constexpr std::string_view kOpNames[kNumOps] = {"copy", "cast", "add",   "mul",
                                                "div",  "pow",  "log10", "maxpool"};
constexpr std::string_view kRoleNames[] = {"input", "output", "scratch"};

// The element range [lo, hi] an access reaches over the nest; false on int64 overflow.
bool Reach(const Access& a, const std::vector<int64_t>& iters, int64_t* lo, int64_t* hi) {
  int64_t l = a.base, h = a.base;
  for (size_t i = 0; i < iters.size(); ++i) {
    int64_t extent;
    if (__builtin_mul_overflow(iters[i] - 1, a.strides[i], &extent)) return false;
    if (__builtin_add_overflow(extent < 0 ? l : h, extent, extent < 0 ? &l : &h)) return false;
  }
  *lo = l;
  *hi = h;
  return true;
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c > ' ' && c < 127 && c != '\'' && c != '"'; });
}

class Validator {
 public:
  explicit Validator(const Program& p) : p_(p), written_(p.buffers.size(), false) {}

  absl::Status Run() {
    if (p_.buffers.size() > static_cast<size_t>(kMaxBuffers)) {
      return Fail(
          absl::StrCat("program: ", p_.buffers.size(), " buffers (limit ", kMaxBuffers, ")"));
    }
    if (p_.steps.size() > static_cast<size_t>(kMaxSteps)) {
      return Fail(absl::StrCat("program: ", p_.steps.size(), " steps (limit ", kMaxSteps, ")"));
    }
    for (size_t b = 0; b < p_.buffers.size(); ++b) PLEXUS_RETURN_IF_ERROR(CheckBuffer(b));
    for (size_t s = 0; s < p_.steps.size(); ++s) PLEXUS_RETURN_IF_ERROR(CheckStep(s));
    return absl::OkStatus();
  }

 private:
  static absl::Status Fail(std::string message) {
    return absl::InvalidArgumentError(std::move(message));
  }

  absl::Status CheckBuffer(size_t b) {
    const BufferDecl& d = p_.buffers[b];
    const std::string at = absl::StrCat("buffer ", b);
    if (!ValidName(d.name)) {
      return Fail(absl::StrCat(at, ": name must be 1..", kMaxNameBytes,
                               " printable characters without spaces or quotes"));
    }
    const std::string who = absl::StrCat(at, " '", d.name, "'");
    for (size_t o = 0; o < b; ++o) {
      if (p_.buffers[o].name == d.name) {
        return Fail(absl::StrCat(who, ": name already used by buffer ", o));
      }
    }
    if (static_cast<int>(d.dtype) >= kernels::kNumDataTypes || !SupportedType(d.dtype)) {
      return Fail(absl::StrCat(who, ": dtype ", std::string(kernels::DataTypeName(d.dtype)),
                               " is not supported (f32, f16, bf16, i32, i8, u8)"));
    }
    if (static_cast<size_t>(d.role) >= std::size(kRoleNames)) {
      return Fail(absl::StrCat(who, ": invalid role ", static_cast<int>(d.role)));
    }
    if (d.count < 1 || d.count > kMaxElements) {
      return Fail(absl::StrCat(who, ": count ", d.count, " outside 1..", kMaxElements));
    }
    return absl::OkStatus();
  }

  // "step 3 (mul): "
  std::string StepAt(size_t s) const {
    return absl::StrCat("step ", s, " (", std::string(OpName(p_.steps[s].op)), "): ");
  }

  absl::Status CheckAccess(size_t s, const char* operand, const Access& a, int64_t* lo,
                           int64_t* hi) const {
    const Step& st = p_.steps[s];
    if (a.buffer < 0 || static_cast<size_t>(a.buffer) >= p_.buffers.size()) {
      return Fail(absl::StrCat(StepAt(s), operand, ": buffer index ", a.buffer,
                               " but the program has ", p_.buffers.size(), " buffers"));
    }
    const BufferDecl& d = p_.buffers[a.buffer];
    const std::string who = absl::StrCat(StepAt(s), operand, " '", d.name, "'");
    if (a.strides.size() != st.iters.size()) {
      return Fail(
          absl::StrCat(who, ": ", a.strides.size(), " strides for ", st.iters.size(), " levels"));
    }
    if (a.base < -kMaxElements || a.base > kMaxElements) {
      return Fail(absl::StrCat(who, ": base ", a.base, " beyond +-", kMaxElements));
    }
    for (size_t l = 0; l < a.strides.size(); ++l) {
      if (a.strides[l] < -kMaxElements || a.strides[l] > kMaxElements) {
        return Fail(
            absl::StrCat(who, ": level ", l, " stride ", a.strides[l], " beyond +-", kMaxElements));
      }
    }
    if (!Reach(a, st.iters, lo, hi)) return Fail(absl::StrCat(who, ": index arithmetic overflows"));
    if (*lo < 0) {
      return Fail(absl::StrCat(who, " reaches element ", *lo, " (before its first element)"));
    }
    if (*hi >= d.count) {
      return Fail(absl::StrCat(who, " reaches element ", *hi, " but has ", d.count, " elements"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckRead(size_t s, const char* operand, const Access& a) const {
    const BufferDecl& d = p_.buffers[a.buffer];
    if (d.role != Role::kInput && !written_[a.buffer]) {
      return Fail(absl::StrCat(StepAt(s), operand, " '", d.name, "': reads ",
                               std::string(RoleName(d.role)), " that no earlier step writes"));
    }
    return absl::OkStatus();
  }

  // Sufficient for "no element written twice per outer point": sorted by magnitude, every
  // stride exceeds the span of the smaller ones (a mixed-radix numbering).
  absl::Status CheckInjective(size_t s, const Step& st) const {
    const size_t outer = st.iters.size() - static_cast<size_t>(st.window_levels);
    std::vector<std::pair<int64_t, size_t>> levels;
    for (size_t l = 0; l < outer; ++l) {
      if (st.iters[l] > 1) levels.emplace_back(std::abs(st.dst.strides[l]), l);
    }
    std::sort(levels.begin(), levels.end());
    int64_t span = 0;  // bounded by the access's checked range
    for (const auto& [stride, l] : levels) {
      if (stride <= span) {
        return Fail(absl::StrCat(StepAt(s), "dst '", p_.buffers[st.dst.buffer].name,
                                 "' may write an element twice (level ", l, ": stride ",
                                 st.dst.strides[l], ", ", st.iters[l], " iterations)"));
      }
      span += (st.iters[l] - 1) * stride;
    }
    return absl::OkStatus();
  }

  absl::Status CheckStep(size_t s) {
    const Step& st = p_.steps[s];
    if (static_cast<int>(st.op) >= kNumOps) {
      return Fail(absl::StrCat("step ", s, ": invalid op ", static_cast<int>(st.op)));
    }
    const std::string at = StepAt(s);
    const size_t levels = st.iters.size();
    if (levels < 1 || levels > static_cast<size_t>(kMaxLevels)) {
      return Fail(absl::StrCat(at, levels, " levels (1..", kMaxLevels, ")"));
    }
    int64_t total = 1;
    for (size_t l = 0; l < levels; ++l) {
      if (st.iters[l] < 1) {
        return Fail(absl::StrCat(at, "level ", l, " iteration count ", st.iters[l], " (>= 1)"));
      }
      if (__builtin_mul_overflow(total, st.iters[l], &total) || total > kMaxIterations) {
        return Fail(absl::StrCat(at, "more than ", kMaxIterations, " iterations"));
      }
    }
    if (static_cast<int>(st.src2_kind) > static_cast<int>(Operand2::kScalar)) {
      return Fail(absl::StrCat(at, "invalid src2 kind ", static_cast<int>(st.src2_kind)));
    }
    if (IsBinary(st.op) && st.src2_kind == Operand2::kNone) {
      return Fail(absl::StrCat(at, "a binary op needs src2 (a buffer or a scalar)"));
    }
    if (!IsBinary(st.op) && st.src2_kind != Operand2::kNone) {
      return Fail(absl::StrCat(at, "a unary op takes no src2"));
    }
    if (st.src2_kind != Operand2::kBuffer && !(st.src2 == Access{})) {
      return Fail(absl::StrCat(at, "src2 access given but src2 is not a buffer"));
    }
    if (st.src2_kind != Operand2::kScalar && std::bit_cast<uint32_t>(st.scalar) != 0) {
      return Fail(absl::StrCat(at, "scalar given but src2 is not a scalar"));
    }
    if (st.op == Op::kMaxPool) {
      if (st.window_levels < 1 || static_cast<size_t>(st.window_levels) > levels) {
        return Fail(absl::StrCat(at, "window_levels ", st.window_levels, " outside 1..", levels));
      }
    } else if (st.window_levels != 0) {
      return Fail(absl::StrCat(at, "window_levels ", st.window_levels, " on a non-pooling op"));
    }

    int64_t dlo, dhi, lo, hi;
    PLEXUS_RETURN_IF_ERROR(CheckAccess(s, "dst", st.dst, &dlo, &dhi));
    const BufferDecl& dst = p_.buffers[st.dst.buffer];
    if (dst.role == Role::kInput) {
      return Fail(absl::StrCat(at, "dst '", dst.name, "' is an input buffer"));
    }
    for (size_t l = levels - st.window_levels; l < levels; ++l) {
      if (st.dst.strides[l] != 0) {
        return Fail(absl::StrCat(at, "dst '", dst.name, "' has stride ", st.dst.strides[l],
                                 " on window level ", l, " (must be 0)"));
      }
    }
    PLEXUS_RETURN_IF_ERROR(CheckInjective(s, st));

    std::vector<std::pair<const char*, const Access*>> sources = {{"src1", &st.src1}};
    if (st.src2_kind == Operand2::kBuffer) sources.emplace_back("src2", &st.src2);
    for (const auto& [operand, a] : sources) {
      PLEXUS_RETURN_IF_ERROR(CheckAccess(s, operand, *a, &lo, &hi));
      PLEXUS_RETURN_IF_ERROR(CheckRead(s, operand, *a));
      if (a->buffer == st.dst.buffer && !(*a == st.dst) && lo <= dhi && dlo <= hi) {
        return Fail(absl::StrCat(at, "dst '", dst.name, "' overlaps ", operand, " in elements [",
                                 std::max(lo, dlo), ", ", std::min(hi, dhi),
                                 "] without being the same access"));
      }
    }
    const BufferDecl& src1 = p_.buffers[st.src1.buffer];
    if (st.op == Op::kCopy && src1.dtype != dst.dtype) {
      return Fail(absl::StrCat(at, "dst '", dst.name, "' is ",
                               std::string(kernels::DataTypeName(dst.dtype)), " but src1 '",
                               src1.name, "' is ", std::string(kernels::DataTypeName(src1.dtype)),
                               " (copy keeps types; use cast)"));
    }
    written_[st.dst.buffer] = true;
    return absl::OkStatus();
  }

  const Program& p_;
  std::vector<bool> written_;
};

}  // namespace

std::string_view OpName(Op op) { return base::NameAt(static_cast<size_t>(op), kOpNames); }

bool IsBinary(Op op) {
  return op == Op::kAdd || op == Op::kMul || op == Op::kDiv || op == Op::kPow;
}

std::string_view RoleName(Role role) { return base::NameAt(static_cast<size_t>(role), kRoleNames); }

bool operator==(const Step& a, const Step& b) {
  return a.op == b.op && a.iters == b.iters && a.dst == b.dst && a.src1 == b.src1 &&
         a.src2_kind == b.src2_kind && a.src2 == b.src2 &&
         std::bit_cast<uint32_t>(a.scalar) == std::bit_cast<uint32_t>(b.scalar) &&
         a.window_levels == b.window_levels;
}

bool SupportedType(DataType dtype) {
  switch (dtype) {
    case DataType::kF32:
    case DataType::kF16:
    case DataType::kBF16:
    case DataType::kI32:
    case DataType::kI8:
    case DataType::kU8:
      return true;
    case DataType::kF64:
    case DataType::kI64:
      return false;
  }
  return false;
}

absl::Status Validate(const Program& program) { return Validator(program).Run(); }

ProgramSize MeasureProgram(const Program& program) {
  ProgramSize size;
  for (const BufferDecl& b : program.buffers) {
    const int64_t bytes = b.count * static_cast<int64_t>(kernels::DataTypeSize(b.dtype));
    (b.role == Role::kInput    ? size.input_bytes
     : b.role == Role::kOutput ? size.output_bytes
                               : size.scratch_bytes) += bytes;
  }
  for (const Step& s : program.steps) {
    int64_t n = 1;
    for (int64_t it : s.iters) n *= it;
    size.iterations += n;
  }
  return size;
}

}  // namespace plexus::restructure
