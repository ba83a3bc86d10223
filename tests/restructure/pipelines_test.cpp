// The five pipelines of Fianchetto's Table 3.1 run by the interpreter against plain loops written
// here, at scaled-down versions of the table's shapes and at odd shapes.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "restructure/support.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pk = plexus::kernels;
using pk::DataType;
using pr::testing::FromBytes;
using pr::testing::RunProgram;
using pr::testing::ToBytes;

namespace {

std::vector<float> Uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// f32 -> the output type's bits, through the kernels' conversions (f16, bf16) or exactly (f32).
uint32_t Bits(DataType t, float v) {
  if (t == DataType::kF16) return pk::FloatToHalf(v);
  if (t == DataType::kBF16) return pk::FloatToBf16(v);
  return std::bit_cast<uint32_t>(v);
}
uint32_t ElementBits(DataType t, const std::vector<uint8_t>& bytes, size_t i) {
  if (t == DataType::kF32) return FromBytes<uint32_t>(bytes)[i];
  return FromBytes<uint16_t>(bytes)[i];
}

pr::Program Built(absl::StatusOr<pr::Program> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

}  // namespace

TEST_CASE("video surveillance: scale, 2x2 max pool, planar layout, cast", "[restructure]") {
  for (const pp::VideoShape& s : {pp::VideoShape{96, 54, 3, 1.0f / 255, DataType::kF16},
                                  pp::VideoShape{13, 7, 2, 0.37f, DataType::kBF16},
                                  pp::VideoShape{2, 3, 1, 2.0f, DataType::kF32}}) {
    const pr::Program p = Built(pp::VideoSurveillance(s));
    std::vector<uint8_t> frame(s.height * s.width * s.channels);
    std::mt19937 rng(static_cast<uint32_t>(s.height));
    for (auto& v : frame) v = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, {frame}, &out).ok());
    const int64_t oh = s.height / 2, ow = s.width / 2, c = s.channels;
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          float m = -INFINITY;
          for (int64_t dy = 0; dy < 2; ++dy)
            for (int64_t dx = 0; dx < 2; ++dx) {
              const float v =
                  static_cast<float>(frame[((2 * y + dy) * s.width + 2 * x + dx) * c + ch]) *
                  s.scale;
              m = std::max(m, v);
            }
          REQUIRE(ElementBits(s.out_dtype, out[0], (ch * oh + y) * ow + x) == Bits(s.out_dtype, m));
        }
  }
}

TEST_CASE("sound detection: spectrogram, mel weights, log", "[restructure]") {
  for (const pp::SoundShape& s : {pp::SoundShape{128, 96, 1e-10f, 1.0f, DataType::kF16},
                                  pp::SoundShape{17, 13, 1e-3f, 0.25f, DataType::kF32}}) {
    const pr::Program p = Built(pp::SoundDetection(s));
    const std::vector<float> mag = Uniform(s.frames * s.bins, 8, -30.0f, 30.0f);
    const std::vector<float> mel = Uniform(s.bins, 9, 0.0f, 1.0f);
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, {ToBytes(mag), ToBytes(mel)}, &out).ok());
    for (int64_t f = 0; f < s.frames; ++f)
      for (int64_t k = 0; k < s.bins; ++k) {
        float v = std::pow(mag[f * s.bins + k], 2.0f);
        v = v + s.epsilon;
        v = v * mel[k];
        v = v / s.reference;
        v = std::log10(v);
        REQUIRE(ElementBits(s.out_dtype, out[0], f * s.bins + k) == Bits(s.out_dtype, v));
      }
  }
}

TEST_CASE("brain stimulation: power over baseline, gain, cast", "[restructure]") {
  for (const pp::BrainShape& s : {pp::BrainShape{16, 64, 8, 0.5f, DataType::kBF16},
                                  pp::BrainShape{3, 11, 5, 1.7f, DataType::kF16}}) {
    const pr::Program p = Built(pp::BrainStimulation(s));
    const int64_t per = s.bins * s.electrodes;
    const std::vector<float> spectrum = Uniform(s.windows * per, 10, -5.0f, 5.0f);
    const std::vector<float> baseline = Uniform(per, 11, 0.5f, 2.0f);
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, {ToBytes(spectrum), ToBytes(baseline)}, &out).ok());
    for (int64_t w = 0; w < s.windows; ++w)
      for (int64_t i = 0; i < per; ++i) {
        const float v = std::pow(spectrum[w * per + i], 2.0f) / baseline[i] * s.gain;
        REQUIRE(ElementBits(s.out_dtype, out[0], w * per + i) == Bits(s.out_dtype, v));
      }
  }
}

TEST_CASE("PII redaction: concat of the decrypted parts, flattened", "[restructure]") {
  for (const pp::PiiShape& s : {pp::PiiShape{4, 64, 48, 0}, pp::PiiShape{4, 64, 48, 1},
                                pp::PiiShape{3, 7, 5, 0}, pp::PiiShape{5, 3, 11, 1}}) {
    const pr::Program p = Built(pp::PiiRedaction(s));
    CHECK(p.steps.size() == static_cast<size_t>(s.parts));
    std::vector<std::vector<uint8_t>> parts(s.parts, std::vector<uint8_t>(s.rows * s.cols));
    std::mt19937 rng(12);
    for (auto& part : parts)
      for (auto& v : part) v = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, parts, &out).ok());
    std::vector<uint8_t> want;
    if (s.axis == 0) {
      for (const auto& part : parts) want.insert(want.end(), part.begin(), part.end());
    } else {
      for (int64_t r = 0; r < s.rows; ++r)
        for (const auto& part : parts)
          want.insert(want.end(), part.begin() + r * s.cols, part.begin() + (r + 1) * s.cols);
    }
    REQUIRE(out[0] == want);
  }
}

TEST_CASE("database hash join: concat, reshape, cast of the key columns", "[restructure]") {
  for (const pp::JoinShape& s :
       {pp::JoinShape{4, 64, 32, DataType::kF32}, pp::JoinShape{3, 5, 7, DataType::kI8},
        pp::JoinShape{2, 9, 3, DataType::kF16}}) {
    const pr::Program p = Built(pp::DbHashJoin(s));
    std::vector<std::vector<uint8_t>> parts;
    std::vector<int32_t> all;
    std::mt19937 rng(13);
    for (int64_t k = 0; k < s.parts; ++k) {
      std::vector<int32_t> v(s.rows * s.cols);
      for (auto& x : v) x = static_cast<int32_t>(rng());  // beyond 2^24: rounding matters
      v[0] = 16777217;
      all.insert(all.end(), v.begin(), v.end());
      parts.push_back(ToBytes(v));
    }
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, parts, &out).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      const float f = static_cast<float>(static_cast<double>(all[i]));
      if (s.out_dtype == DataType::kI8) {
        const int8_t want = all[i] >= 127    ? 127
                            : all[i] <= -128 ? -128
                                             : static_cast<int8_t>(all[i]);
        REQUIRE(FromBytes<int8_t>(out[0])[i] == want);
      } else {
        REQUIRE(ElementBits(s.out_dtype, out[0], i) == Bits(s.out_dtype, f));
      }
    }
  }
}

TEST_CASE("pipelines at the table's shapes build and validate", "[restructure]") {
  for (auto made : {pp::VideoSurveillance(), pp::SoundDetection(), pp::BrainStimulation(),
                    pp::PiiRedaction(), pp::DbHashJoin()}) {
    INFO(made.status().ToString());
    REQUIRE(made.ok());
    CHECK(pr::Validate(*made).ok());
  }
  const pr::ProgramSize video = pr::MeasureProgram(*pp::VideoSurveillance());
  CHECK(video.input_bytes == 960 * 540 * 3);
  CHECK(video.output_bytes == 480 * 270 * 3 * 2);
  CHECK(pp::VideoSurveillance({1, 5, 3}).status().message().find("height and width >= 2") !=
        std::string::npos);
  CHECK(pp::SoundDetection({0, 768}).status().message() == "SoundShape.frames is 0 (>= 1)");
  CHECK(pp::PiiRedaction({4, 2048, 768, 2}).status().message() == "PiiShape.axis is 2 (0 or 1)");
}

TEST_CASE("the documented video program is the pipeline's", "[restructure]") {
  namespace pr = plexus::restructure;
  pr::ProgramBuilder b;
  auto frame = b.Input("frame", DataType::kU8, 960 * 540 * 3);
  auto out = b.Output("tensor", DataType::kF16, 3 * 480 * 270);
  auto scaled = b.Scratch("scaled", DataType::kF32, 960 * 540 * 3);
  auto pooled = b.Scratch("pooled", DataType::kF32, 480 * 270 * 3);
  b.Mul(scaled, frame, 1.0f / 255);
  b.MaxPool2D(pooled, scaled, {960, 540, 3});
  b.Step(pr::Op::kCast, {3, 480, 270}, pr::ProgramBuilder::At(out, 0, {480 * 270, 270, 1}),
         pr::ProgramBuilder::At(pooled, 0, {1, 270 * 3, 3}));
  absl::StatusOr<pr::Program> p = b.Build();
  REQUIRE(p.ok());
  CHECK(*p == *pp::VideoSurveillance());
}
