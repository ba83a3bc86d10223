#include "plexus/restructure/builder.hpp"

#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus::restructure {

BufferRef ProgramBuilder::Declare(std::string name, DataType dtype, int64_t count, Role role) {
  program_.buffers.push_back({std::move(name), dtype, count, role});
  return BufferRef{static_cast<int>(program_.buffers.size()) - 1};
}
BufferRef ProgramBuilder::Input(std::string name, DataType dtype, int64_t count) {
  return Declare(std::move(name), dtype, count, Role::kInput);
}
BufferRef ProgramBuilder::Output(std::string name, DataType dtype, int64_t count) {
  return Declare(std::move(name), dtype, count, Role::kOutput);
}
BufferRef ProgramBuilder::Scratch(std::string name, DataType dtype, int64_t count) {
  return Declare(std::move(name), dtype, count, Role::kScratch);
}

void ProgramBuilder::Fail(std::string message) {
  if (error_.ok()) error_ = absl::InvalidArgumentError(std::move(message));
}

const BufferDecl* ProgramBuilder::Decl(BufferRef ref, const char* what) {
  if (ref.index < 0 || static_cast<size_t>(ref.index) >= program_.buffers.size()) {
    Fail(absl::StrCat(what, ": buffer reference ", ref.index, " was not declared"));
    return nullptr;
  }
  return &program_.buffers[ref.index];
}

Access ProgramBuilder::At(BufferRef buffer, int64_t base, std::vector<int64_t> strides) {
  return Access{buffer.index, base, std::move(strides)};
}

void ProgramBuilder::Step(restructure::Step step) { program_.steps.push_back(std::move(step)); }

void ProgramBuilder::Step(Op op, std::vector<int64_t> iters, Access dst, Access src1) {
  restructure::Step s;
  s.op = op;
  s.iters = std::move(iters);
  s.dst = std::move(dst);
  s.src1 = std::move(src1);
  Step(std::move(s));
}

void ProgramBuilder::Step(Op op, std::vector<int64_t> iters, Access dst, Access src1, Access src2) {
  restructure::Step s;
  s.op = op;
  s.iters = std::move(iters);
  s.dst = std::move(dst);
  s.src1 = std::move(src1);
  s.src2_kind = Operand2::kBuffer;
  s.src2 = std::move(src2);
  Step(std::move(s));
}

void ProgramBuilder::Step(Op op, std::vector<int64_t> iters, Access dst, Access src1,
                          float scalar) {
  restructure::Step s;
  s.op = op;
  s.iters = std::move(iters);
  s.dst = std::move(dst);
  s.src1 = std::move(src1);
  s.src2_kind = Operand2::kScalar;
  s.scalar = scalar;
  Step(std::move(s));
}

void ProgramBuilder::ElementWise(Op op, BufferRef dst, BufferRef a, const BufferRef* b,
                                 float scalar) {
  const std::string what(OpName(op));
  const BufferDecl* d = Decl(dst, what.c_str());
  const BufferDecl* s1 = Decl(a, what.c_str());
  const BufferDecl* s2 = b != nullptr ? Decl(*b, what.c_str()) : nullptr;
  if (d == nullptr || s1 == nullptr || (b != nullptr && s2 == nullptr)) return;
  for (const BufferDecl* s : {s1, s2}) {
    if (s != nullptr && s->count != d->count) {
      return Fail(absl::StrCat(what, ": dst '", d->name, "' has ", d->count, " elements but '",
                               s->name, "' has ", s->count));
    }
  }
  const int64_t n = d->count;
  if (b != nullptr) {
    Step(op, {n}, At(dst, 0, {1}), At(a, 0, {1}), At(*b, 0, {1}));
  } else if (IsBinary(op)) {
    Step(op, {n}, At(dst, 0, {1}), At(a, 0, {1}), scalar);
  } else {
    Step(op, {n}, At(dst, 0, {1}), At(a, 0, {1}));
  }
}

void ProgramBuilder::Copy(BufferRef dst, BufferRef src) {
  ElementWise(Op::kCopy, dst, src, nullptr, 0);
}
void ProgramBuilder::Cast(BufferRef dst, BufferRef src) {
  ElementWise(Op::kCast, dst, src, nullptr, 0);
}
void ProgramBuilder::Add(BufferRef dst, BufferRef a, BufferRef b) {
  ElementWise(Op::kAdd, dst, a, &b, 0);
}
void ProgramBuilder::Add(BufferRef dst, BufferRef a, float b) {
  ElementWise(Op::kAdd, dst, a, nullptr, b);
}
void ProgramBuilder::Mul(BufferRef dst, BufferRef a, BufferRef b) {
  ElementWise(Op::kMul, dst, a, &b, 0);
}
void ProgramBuilder::Mul(BufferRef dst, BufferRef a, float b) {
  ElementWise(Op::kMul, dst, a, nullptr, b);
}
void ProgramBuilder::Div(BufferRef dst, BufferRef a, BufferRef b) {
  ElementWise(Op::kDiv, dst, a, &b, 0);
}
void ProgramBuilder::Div(BufferRef dst, BufferRef a, float b) {
  ElementWise(Op::kDiv, dst, a, nullptr, b);
}
void ProgramBuilder::Pow(BufferRef dst, BufferRef a, BufferRef b) {
  ElementWise(Op::kPow, dst, a, &b, 0);
}
void ProgramBuilder::Pow(BufferRef dst, BufferRef a, float b) {
  ElementWise(Op::kPow, dst, a, nullptr, b);
}
void ProgramBuilder::Log10(BufferRef dst, BufferRef src) {
  ElementWise(Op::kLog10, dst, src, nullptr, 0);
}

void ProgramBuilder::Reshape(BufferRef dst, BufferRef src) {
  if (dst.index == src.index && Decl(dst, "reshape") != nullptr) return;  // a view: no step
  Copy(dst, src);
}
void ProgramBuilder::Flatten(BufferRef dst, BufferRef src) { Reshape(dst, src); }

void ProgramBuilder::Transpose2D(BufferRef dst, BufferRef src, int64_t rows, int64_t cols) {
  const BufferDecl* d = Decl(dst, "transpose");
  const BufferDecl* s = Decl(src, "transpose");
  if (d == nullptr || s == nullptr) return;
  if (rows < 1 || cols < 1 || rows * cols != s->count || d->count != s->count) {
    return Fail(absl::StrCat("transpose: ", rows, " x ", cols, " does not match src '", s->name,
                             "' (", s->count, " elements) and dst '", d->name, "' (", d->count,
                             ")"));
  }
  // dst[c][r] = src[r][c], walked in dst order.
  Step(Op::kCopy, {cols, rows}, At(dst, 0, {rows, 1}), At(src, 0, {1, cols}));
}

void ProgramBuilder::Concat(BufferRef dst, const std::vector<BufferRef>& parts) {
  const BufferDecl* d = Decl(dst, "concat");
  if (d == nullptr) return;
  int64_t total = 0;
  for (BufferRef p : parts) {
    const BufferDecl* s = Decl(p, "concat");
    if (s == nullptr) return;
    total += s->count;
  }
  if (total != d->count) {
    return Fail(absl::StrCat("concat: the parts have ", total, " elements, dst '", d->name,
                             "' has ", d->count));
  }
  int64_t offset = 0;
  for (BufferRef p : parts) {
    const int64_t n = program_.buffers[p.index].count;
    Step(Op::kCopy, {n}, At(dst, offset, {1}), At(p, 0, {1}));
    offset += n;
  }
}

void ProgramBuilder::Concat2D(BufferRef dst, const std::vector<BufferRef>& parts, int64_t rows) {
  const BufferDecl* d = Decl(dst, "concat2d");
  if (d == nullptr) return;
  if (rows < 1) return Fail(absl::StrCat("concat2d: ", rows, " rows"));
  int64_t width = 0;
  for (BufferRef p : parts) {
    const BufferDecl* s = Decl(p, "concat2d");
    if (s == nullptr) return;
    if (s->count % rows != 0) {
      return Fail(absl::StrCat("concat2d: part '", s->name, "' has ", s->count,
                               " elements, not a multiple of ", rows, " rows"));
    }
    width += s->count / rows;
  }
  if (width * rows != d->count) {
    return Fail(absl::StrCat("concat2d: the parts make ", rows, " x ", width, " but dst '", d->name,
                             "' has ", d->count, " elements"));
  }
  int64_t column = 0;
  for (BufferRef p : parts) {
    const int64_t cols = program_.buffers[p.index].count / rows;
    Step(Op::kCopy, {rows, cols}, At(dst, column, {width, 1}), At(p, 0, {cols, 1}));
    column += cols;
  }
}

void ProgramBuilder::MaxPool2D(BufferRef dst, BufferRef src, const Pool2D& q) {
  const BufferDecl* d = Decl(dst, "maxpool2d");
  const BufferDecl* s = Decl(src, "maxpool2d");
  if (d == nullptr || s == nullptr) return;
  if (q.channels < 1 || q.window_h < 1 || q.window_w < 1 || q.stride_h < 1 || q.stride_w < 1 ||
      q.window_h > q.height || q.window_w > q.width) {
    return Fail(absl::StrCat("maxpool2d: window ", q.window_h, "x", q.window_w, " stride ",
                             q.stride_h, "x", q.stride_w, " does not fit ", q.height, "x", q.width,
                             "x", q.channels));
  }
  const int64_t oh = q.out_h(), ow = q.out_w(), c = q.channels;
  if (s->count != q.height * q.width * c || d->count != oh * ow * c) {
    return Fail(absl::StrCat("maxpool2d: src '", s->name, "' has ", s->count, " elements for ",
                             q.height, "x", q.width, "x", c, " and dst '", d->name, "' has ",
                             d->count, " for ", oh, "x", ow, "x", c));
  }
  const int64_t row = q.width * c;
  restructure::Step step;
  step.op = Op::kMaxPool;
  step.iters = {oh, ow, c, q.window_h, q.window_w};
  step.dst = At(dst, 0, {ow * c, c, 1, 0, 0});
  step.src1 = At(src, 0, {q.stride_h * row, q.stride_w * c, 1, row, c});
  step.window_levels = 2;
  Step(std::move(step));
}

absl::StatusOr<Program> ProgramBuilder::Build() const {
  if (!error_.ok()) return error_;
  if (absl::Status s = Validate(program_); !s.ok()) return s;
  return program_;
}

}  // namespace plexus::restructure
