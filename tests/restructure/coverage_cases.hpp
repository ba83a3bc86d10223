// The programs an executor is checked with against the reference: every cast pair at odd sizes,
// arithmetic chains per type, transposes, concats, pooling and the five pipelines but sound
// detection (whose log10 is checked within its bound), each with a seed, a base offset for its
// buffers (unaligned bases) and whether the reference is the CPU executor (whose power of 2 is
// x * x, as the device's) rather than the interpreter. Shared by the device tests (on a GPU, and
// the kernels' source run on the host).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/pipelines.hpp"

namespace plexus::restructure::testing {

struct CoverageCase {
  std::string name;
  absl::StatusOr<Program> program;
  uint32_t seed = 1;
  size_t offset = 0;
  bool executor_reference = false;
};

inline std::vector<CoverageCase> CoverageCases() {
  using kernels::DataType;
  namespace pp = pipelines;
  constexpr DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16,
                                 DataType::kI32, DataType::kI8,  DataType::kU8};
  std::vector<CoverageCase> cases;
  for (DataType from : kTypes) {
    for (DataType to : kTypes) {
      for (int64_t n : {1, 7, 1025}) {
        ProgramBuilder b;
        auto x = b.Input("x", from, n);
        auto y = b.Output("y", to, n);
        b.Cast(y, x);
        const std::string name =
            absl::StrCat("cast ", std::string(kernels::DataTypeName(from)), " -> ",
                         std::string(kernels::DataTypeName(to)), ", n ", n);
        cases.push_back({name, b.Build(), static_cast<uint32_t>(n), 0});
        cases.push_back({name + ", unaligned", b.Build(), static_cast<uint32_t>(n) + 1, 1});
      }
    }
  }
  for (DataType t : kTypes) {
    const std::string type(kernels::DataTypeName(t));
    {
      ProgramBuilder b;
      const int64_t n = 999;
      auto x = b.Input("x", t, n);
      auto w = b.Input("w", DataType::kF32, n);
      auto s = b.Scratch("s", DataType::kF32, n);
      auto y = b.Output("y", t, n);
      b.Mul(s, x, 0.37f);
      b.Add(s, s, w);
      b.Div(s, s, w);
      b.Add(s, s, -1.25f);
      b.Pow(s, s, 2.0f);
      b.Cast(y, s);
      cases.push_back({"arithmetic chain " + type, b.Build(), 3, 0, true});
      cases.push_back({"arithmetic chain unaligned " + type, b.Build(), 4, 3, true});
    }
    {
      ProgramBuilder b;
      auto x = b.Input("x", t, 37 * 53);
      auto y = b.Output("y", t, 37 * 53);
      b.Transpose2D(y, x, 37, 53);
      cases.push_back({"transpose " + type, b.Build(), 7, 0});
      cases.push_back({"transpose unaligned " + type, b.Build(), 8, 1});
    }
    {
      ProgramBuilder b;
      auto p0 = b.Input("p0", t, 33 * 17);
      auto p1 = b.Input("p1", t, 33 * 17);
      auto p2 = b.Input("p2", t, 33 * 17);
      auto y = b.Output("y", t, 3 * 33 * 17);
      b.Concat2D(y, {p0, p1, p2}, 33);
      cases.push_back({"concat rows " + type, b.Build(), 9, 1});
    }
    {
      ProgramBuilder b;
      Pool2D shape;
      shape.height = 13;
      shape.width = 11;
      shape.channels = 3;
      auto x = b.Input("x", t, 13 * 11 * 3);
      auto y = b.Output("y", t, shape.out_h() * shape.out_w() * 3);
      b.MaxPool2D(y, x, shape);
      cases.push_back({"max pooling " + type, b.Build(), 10, 0});
      cases.push_back({"max pooling unaligned " + type, b.Build(), 11, 1});
    }
  }
  cases.push_back({"video f16", pp::VideoSurveillance({96, 54, 3, 1.0f / 255, DataType::kF16}), 1});
  cases.push_back({"video bf16", pp::VideoSurveillance({13, 7, 2, 0.37f, DataType::kBF16}), 2, 1});
  cases.push_back({"pii rows", pp::PiiRedaction({4, 33, 17, 0}), 3});
  cases.push_back({"pii columns", pp::PiiRedaction({3, 33, 17, 1}), 4, 1});
  cases.push_back({"join f32", pp::DbHashJoin({4, 31, 17, DataType::kF32}), 5});
  cases.push_back({"join i8", pp::DbHashJoin({3, 31, 17, DataType::kI8}), 6, 2});
  cases.push_back(
      {"brain bf16", pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kBF16}), 7, 0, true});
  cases.push_back(
      {"brain f32", pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kF32}), 8, 0, true});
  return cases;
}

}  // namespace plexus::restructure::testing
