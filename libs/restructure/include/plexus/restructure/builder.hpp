// Building Programs: declarations, whole-buffer element-wise ops, the layout ops (reshape,
// flatten, transpose, concat) as copy steps, 2-D max pooling, and the general Step.
//
//   ProgramBuilder b;
//   auto x = b.Input("x", DataType::kF32, n);
//   auto y = b.Output("y", DataType::kF16, n);
//   auto t = b.Scratch("t", DataType::kF32, n);
//   b.Mul(t, x, 2.0f);
//   b.Cast(y, t);
//   absl::StatusOr<Program> p = b.Build();
//
// A helper given inconsistent sizes records the first such error; Build returns it (or the
// validator's verdict on the whole program).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure {

// A declared buffer: its index in Program::buffers.
struct BufferRef {
  int index = -1;
};

// Row-major (height, width, channels) pooling with a window of window_h x window_w elements
// moved by stride_h, stride_w; the output is (out_h, out_w, channels) with
// out = (in - window) / stride + 1.
struct Pool2D {
  int64_t height = 0, width = 0, channels = 1;
  int64_t window_h = 2, window_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t out_h() const { return (height - window_h) / stride_h + 1; }
  int64_t out_w() const { return (width - window_w) / stride_w + 1; }
};

class ProgramBuilder {
 public:
  BufferRef Input(std::string name, DataType dtype, int64_t count);
  BufferRef Output(std::string name, DataType dtype, int64_t count);
  BufferRef Scratch(std::string name, DataType dtype, int64_t count);

  // An access of `buffer` from `base` with one stride per level.
  static Access At(BufferRef buffer, int64_t base, std::vector<int64_t> strides);
  // Appends a step as given (Build validates it).
  void Step(restructure::Step step);
  // A step over the nest `iters` with explicit accesses; src2 a buffer access or a scalar.
  void Step(Op op, std::vector<int64_t> iters, Access dst, Access src1);
  void Step(Op op, std::vector<int64_t> iters, Access dst, Access src1, Access src2);
  void Step(Op op, std::vector<int64_t> iters, Access dst, Access src1, float scalar);

  // Element-wise over every element of dst; each source buffer has as many elements.
  void Copy(BufferRef dst, BufferRef src);
  void Cast(BufferRef dst, BufferRef src);
  void Add(BufferRef dst, BufferRef a, BufferRef b);
  void Add(BufferRef dst, BufferRef a, float b);
  void Mul(BufferRef dst, BufferRef a, BufferRef b);
  void Mul(BufferRef dst, BufferRef a, float b);
  void Div(BufferRef dst, BufferRef a, BufferRef b);
  void Div(BufferRef dst, BufferRef a, float b);
  void Pow(BufferRef dst, BufferRef a, BufferRef b);
  void Pow(BufferRef dst, BufferRef a, float b);
  void Log10(BufferRef dst, BufferRef src);

  // Buffers are flat: reshaping or flattening contiguous data is a contiguous copy into another
  // buffer of as many elements, and nothing at all when dst is src.
  void Reshape(BufferRef dst, BufferRef src);
  void Flatten(BufferRef dst, BufferRef src);
  // src is rows x cols row-major; dst becomes cols x rows (one strided copy, dst written in order).
  void Transpose2D(BufferRef dst, BufferRef src, int64_t rows, int64_t cols);
  // The parts one after another in dst (one copy per part at its offset); their counts sum to
  // dst's.
  void Concat(BufferRef dst, const std::vector<BufferRef>& parts);
  // Along the columns: part k is rows x c_k row-major, dst rows x sum(c_k); one strided copy per
  // part.
  void Concat2D(BufferRef dst, const std::vector<BufferRef>& parts, int64_t rows);
  // dst (out_h, out_w, channels) = max over each window of src (height, width, channels): one
  // kMaxPool step of 5 levels, 2 of them the window. Counts must match the shape.
  void MaxPool2D(BufferRef dst, BufferRef src, const Pool2D& shape);

  // The program, validated; or the first helper error, or the validator's.
  absl::StatusOr<Program> Build() const;

 private:
  BufferRef Declare(std::string name, DataType dtype, int64_t count, Role role);
  void ElementWise(Op op, BufferRef dst, BufferRef a, const BufferRef* b, float scalar);
  // The buffer's declaration, or null after recording an error naming `what`.
  const BufferDecl* Decl(BufferRef ref, const char* what);
  void Fail(std::string message);

  Program program_;
  absl::Status error_;
};

}  // namespace plexus::restructure
