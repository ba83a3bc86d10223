#include "plexus/restructure/pipelines.hpp"

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/restructure/builder.hpp"

namespace plexus::restructure::pipelines {
namespace {

// Every dimension >= 1 and their product within kMaxElements.
absl::Status CheckDims(const char* shape,
                       std::initializer_list<std::pair<const char*, int64_t>> dims) {
  int64_t total = 1;
  for (const auto& [name, value] : dims) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(shape, ".", name, " is ", value, " (>= 1)"));
    }
    if (__builtin_mul_overflow(total, value, &total) || total > kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape, ": more than ", kMaxElements, " elements"));
    }
  }
  return absl::OkStatus();
}

std::vector<BufferRef> Parts(ProgramBuilder& b, int64_t n, DataType dtype, int64_t count) {
  std::vector<BufferRef> parts;
  for (int64_t k = 0; k < n; ++k) parts.push_back(b.Input(absl::StrCat("part", k), dtype, count));
  return parts;
}

}  // namespace

absl::StatusOr<Program> VideoSurveillance(const VideoShape& s) {
  if (s.height < 2 || s.width < 2) {
    return absl::InvalidArgumentError(absl::StrCat("VideoShape: ", s.height, " x ", s.width,
                                                   " (height and width >= 2 for the 2x2 pool)"));
  }
  if (absl::Status st = CheckDims(
          "VideoShape", {{"height", s.height}, {"width", s.width}, {"channels", s.channels}});
      !st.ok()) {
    return st;
  }
  const Pool2D pool{s.height, s.width, s.channels, 2, 2, 2, 2};
  const int64_t oh = pool.out_h(), ow = pool.out_w(), c = s.channels;
  ProgramBuilder b;
  const auto frame = b.Input("frame", DataType::kU8, s.height * s.width * c);
  const auto tensor = b.Output("tensor", s.out_dtype, c * oh * ow);
  const auto scaled = b.Scratch("scaled", DataType::kF32, s.height * s.width * c);
  const auto pooled = b.Scratch("pooled", DataType::kF32, oh * ow * c);
  b.Mul(scaled, frame, s.scale);
  b.MaxPool2D(pooled, scaled, pool);
  // tensor[ch][y][x] = pooled[y][x][ch], walked in tensor order.
  b.Step(Op::kCast, {c, oh, ow}, ProgramBuilder::At(tensor, 0, {oh * ow, ow, 1}),
         ProgramBuilder::At(pooled, 0, {1, ow * c, c}));
  return b.Build();
}

absl::StatusOr<Program> SoundDetection(const SoundShape& s) {
  if (absl::Status st = CheckDims("SoundShape", {{"frames", s.frames}, {"bins", s.bins}});
      !st.ok()) {
    return st;
  }
  const int64_t n = s.frames * s.bins;
  ProgramBuilder b;
  const auto magnitude = b.Input("magnitude", DataType::kF32, n);
  const auto mel = b.Input("mel_weights", DataType::kF32, s.bins);
  const auto features = b.Output("features", s.out_dtype, n);
  const auto power = b.Scratch("power", DataType::kF32, n);
  b.Pow(power, magnitude, 2.0f);
  b.Add(power, power, s.epsilon);
  const Access rows = ProgramBuilder::At(power, 0, {s.bins, 1});
  b.Step(Op::kMul, {s.frames, s.bins}, rows, rows, ProgramBuilder::At(mel, 0, {0, 1}));
  b.Div(power, power, s.reference);
  b.Log10(power, power);
  b.Cast(features, power);
  return b.Build();
}

absl::StatusOr<Program> BrainStimulation(const BrainShape& s) {
  if (absl::Status st = CheckDims(
          "BrainShape", {{"windows", s.windows}, {"bins", s.bins}, {"electrodes", s.electrodes}});
      !st.ok()) {
    return st;
  }
  const int64_t per_window = s.bins * s.electrodes, n = s.windows * per_window;
  ProgramBuilder b;
  const auto spectrum = b.Input("spectrum", DataType::kF32, n);
  const auto baseline = b.Input("baseline", DataType::kF32, per_window);
  const auto observation = b.Output("observation", s.out_dtype, n);
  const auto power = b.Scratch("power", DataType::kF32, n);
  b.Pow(power, spectrum, 2.0f);
  const Access all = ProgramBuilder::At(power, 0, {per_window, 1});
  b.Step(Op::kDiv, {s.windows, per_window}, all, all, ProgramBuilder::At(baseline, 0, {0, 1}));
  b.Mul(power, power, s.gain);
  b.Cast(observation, power);
  return b.Build();
}

absl::StatusOr<Program> PiiRedaction(const PiiShape& s) {
  if (absl::Status st =
          CheckDims("PiiShape", {{"parts", s.parts}, {"rows", s.rows}, {"cols", s.cols}});
      !st.ok()) {
    return st;
  }
  if (s.axis != 0 && s.axis != 1) {
    return absl::InvalidArgumentError(absl::StrCat("PiiShape.axis is ", s.axis, " (0 or 1)"));
  }
  if (s.parts > kMaxBuffers - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PiiShape.parts is ", s.parts, " (at most ", kMaxBuffers - 1, ")"));
  }
  ProgramBuilder b;
  const std::vector<BufferRef> parts = Parts(b, s.parts, DataType::kU8, s.rows * s.cols);
  const auto text = b.Output("text", DataType::kU8, s.parts * s.rows * s.cols);
  if (s.axis == 0) {
    b.Concat(text, parts);
  } else {
    b.Concat2D(text, parts, s.rows);
  }
  b.Flatten(text, text);
  return b.Build();
}

absl::StatusOr<Program> DbHashJoin(const JoinShape& s) {
  if (absl::Status st =
          CheckDims("JoinShape", {{"parts", s.parts}, {"rows", s.rows}, {"cols", s.cols}});
      !st.ok()) {
    return st;
  }
  if (s.parts > kMaxBuffers - 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinShape.parts is ", s.parts, " (at most ", kMaxBuffers - 2, ")"));
  }
  const int64_t n = s.parts * s.rows * s.cols;
  ProgramBuilder b;
  const std::vector<BufferRef> parts = Parts(b, s.parts, DataType::kI32, s.rows * s.cols);
  const auto table = b.Output("table", s.out_dtype, n);
  const auto rows = b.Scratch("rows", DataType::kI32, n);
  b.Concat(rows, parts);
  b.Reshape(rows, rows);
  b.Cast(table, rows);
  return b.Build();
}

}  // namespace plexus::restructure::pipelines
