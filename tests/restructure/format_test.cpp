// The binary format: round trips, refusals of malformed bytes, and that no truncation or byte flip
// of a valid encoding crashes or yields a program the validator would refuse.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/format.hpp"
#include "plexus/restructure/pipelines.hpp"

namespace pr = plexus::restructure;
using plexus::kernels::DataType;
using pr::Op;
using pr::ProgramBuilder;

namespace {

// A program using every op, both src2 kinds, negative strides and a NaN scalar.
pr::Program EveryOp() {
  ProgramBuilder b;
  const auto x = b.Input("x", DataType::kF32, 64);
  const auto w = b.Input("w", DataType::kBF16, 8);
  const auto y = b.Output("y", DataType::kF16, 64);
  const auto q = b.Output("q", DataType::kI8, 16);
  const auto t = b.Scratch("t", DataType::kF32, 64);
  b.Copy(t, x);
  b.Add(t, t, 1.5f);
  b.Step(Op::kMul, {8, 8}, ProgramBuilder::At(t, 63, {-8, -1}), ProgramBuilder::At(t, 63, {-8, -1}),
         ProgramBuilder::At(w, 0, {0, 1}));
  b.Div(t, t, std::nanf(""));
  b.Pow(t, t, x);
  b.Log10(t, t);
  b.Cast(y, t);
  pr::Step pool;
  pool.op = Op::kMaxPool;
  pool.iters = {4, 4, 2, 2};
  pool.dst = ProgramBuilder::At(q, 0, {4, 1, 0, 0});
  pool.src1 = ProgramBuilder::At(x, 0, {16, 2, 8, 1});
  pool.window_levels = 2;
  b.Step(pool);
  absl::StatusOr<pr::Program> p = b.Build();
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

}  // namespace

TEST_CASE("programs round-trip through the format", "[restructure][format]") {
  const pr::Program p = EveryOp();
  const std::string bytes = pr::Serialize(p);
  absl::StatusOr<pr::Program> back = pr::Decode(bytes);
  REQUIRE(back.ok());
  CHECK(*back == p);
  CHECK(pr::Serialize(*back) == bytes);
  CHECK(std::isnan(back->steps[3].scalar));
  for (auto made : {pr::pipelines::VideoSurveillance(), pr::pipelines::SoundDetection(),
                    pr::pipelines::BrainStimulation(), pr::pipelines::PiiRedaction(),
                    pr::pipelines::DbHashJoin()}) {
    REQUIRE(made.ok());
    absl::StatusOr<pr::Program> again = pr::Decode(pr::Serialize(*made));
    REQUIRE(again.ok());
    CHECK(*again == *made);
  }
}

TEST_CASE("every truncation of a valid encoding is refused", "[restructure][format]") {
  const std::string bytes = pr::Serialize(EveryOp());
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<pr::Program> p = pr::Decode(std::string_view(bytes).substr(0, n));
    INFO("first " << n << " bytes");
    REQUIRE_FALSE(p.ok());
    REQUIRE(p.status().code() == absl::StatusCode::kDataLoss);
  }
  CHECK(pr::Decode(bytes + '\0').status().message() ==
        "restructure program: 1 bytes after the last step (offset " + std::to_string(bytes.size()) +
            ")");
}

TEST_CASE("malformed headers and fields name what is wrong", "[restructure][format]") {
  const std::string good = pr::Serialize(EveryOp());
  std::string bad = good;
  bad[0] ^= 1;
  CHECK(pr::Decode(bad).status().message().find("not a restructure program") != std::string::npos);
  bad = good;
  bad[4] = 9;
  CHECK(pr::Decode(bad).status().message().find("version 9 (this build reads 1)") !=
        std::string::npos);
  bad = good;
  bad[6] = static_cast<char>(65);
  CHECK(pr::Decode(bad).status().message().find("65 buffers (limit 64)") != std::string::npos);
  bad = good;
  bad[7] = static_cast<char>(0x01);
  bad[8] = static_cast<char>(0x04);  // 1025 steps
  CHECK(pr::Decode(bad).status().message().find("1025 steps (limit 1024)") != std::string::npos);
  bad = good;
  bad[9] = static_cast<char>(200);  // the first buffer's name length
  CHECK(pr::Decode(bad).status().message().find("buffer 0: name of 200 bytes (limit 64)") !=
        std::string::npos);
  bad = good;
  bad[11] = 1;  // the first buffer's dtype: f64
  const absl::Status s = pr::Decode(bad).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("buffer 0 'x': dtype f64 is not supported") != std::string::npos);
}

TEST_CASE("random byte flips never crash and decode only valid programs", "[restructure][format]") {
  const std::string good = pr::Serialize(EveryOp());
  std::mt19937 rng(5);
  int decoded = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
    }
    absl::StatusOr<pr::Program> p = pr::Decode(bytes);
    if (!p.ok()) continue;
    ++decoded;
    REQUIRE(pr::Validate(*p).ok());
    REQUIRE(pr::Serialize(*p) == bytes);  // the encoding is canonical
  }
  CHECK(decoded > 0);  // e.g. flips of a scalar's or a name's bits
}

TEST_CASE("programs round-trip through the JSON form; its errors name the field",
          "[restructure][format]") {
  // Every op, both src2 kinds, negative strides, a NaN scalar (by its bits), and the pipelines.
  std::vector<pr::Program> programs = {EveryOp()};
  for (auto made : {pr::pipelines::VideoSurveillance(), pr::pipelines::SoundDetection(),
                    pr::pipelines::BrainStimulation(), pr::pipelines::PiiRedaction(),
                    pr::pipelines::DbHashJoin()}) {
    REQUIRE(made.ok());
    programs.push_back(*made);
  }
  for (const pr::Program& program : programs) {
    auto back = pr::ProgramFromJson(pr::ProgramToJson(program));
    INFO((back.ok() ? "" : back.status().ToString()));
    REQUIRE(back.ok());
    CHECK(*back == program);
  }
  const std::string good = R"({"buffers": [
      {"name": "x", "dtype": "f32", "count": 8, "role": "input"},
      {"name": "y", "dtype": "f16", "count": 8, "role": "output"}],
    "steps": [{"op": "mul", "iters": [8], "dst": {"buffer": "y", "strides": [1]},
               "src1": {"buffer": "x", "base": 0, "strides": [1]}, "scalar": 0.5}]})";
  auto p = pr::ProgramFromJson(good);
  REQUIRE(p.ok());
  CHECK(p->steps[0].scalar == 0.5f);
  CHECK(p->buffers[1].dtype == pr::DataType::kF16);
  const auto refused = [&](std::string_view from, std::string_view to) {
    std::string text = good;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    auto r = pr::ProgramFromJson(text);
    REQUIRE_FALSE(r.ok());
    return std::string(r.status().message());
  };
  CHECK_THAT(refused(R"("buffer": "x")", R"("buffer": "z")"),
             Catch::Contains("steps[0].src1.buffer: no buffer named 'z'"));
  CHECK_THAT(refused(R"("op": "mul")", R"("op": "fma")"),
             Catch::Contains("steps[0].op: unknown op 'fma'"));
  CHECK_THAT(refused(R"("dtype": "f16")", R"("dtype": "f8")"), Catch::Contains("buffers[1].dtype"));
  CHECK_THAT(refused(R"("role": "input")", R"("role": "in")"),
             Catch::Contains("buffers[0].role: unknown role 'in'"));
  CHECK_THAT(refused(R"("iters": [8])", R"("iters": [9])"), Catch::Contains("step 0"));
  CHECK_THAT(refused(R"("scalar": 0.5)", R"("scalr": 0.5)"), Catch::Contains("steps[0].scalr"));
  CHECK_THAT(refused(R"("count": 8, "role": "output")", R"("count": 8, "role": "output", "x": 1)"),
             Catch::Contains("buffers[1].x: unknown field"));
  CHECK_FALSE(pr::ProgramFromJson("{").ok());
  CHECK_FALSE(pr::ProgramFromJson("[]").ok());
}
