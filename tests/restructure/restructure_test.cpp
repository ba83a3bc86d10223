// Every op of the restructure IR against plain loops written here (odd shapes, non-zero bases,
// negative strides), the casts' rounding and saturation, and the validator's refusals.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"
#include "restructure/support.hpp"

namespace pr = plexus::restructure;
using plexus::kernels::DataType;
using pr::Access;
using pr::Op;
using pr::ProgramBuilder;
using pr::testing::FromBytes;
using pr::testing::RunProgram;
using pr::testing::ToBytes;

namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// The test's own statement of integer stores: round half to even, saturate, NaN -> 0.
template <typename T>
T IntegerOf(float v) {
  if (std::isnan(v)) return 0;
  double r = std::floor(static_cast<double>(v));
  const double frac = static_cast<double>(v) - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  if (r < std::numeric_limits<T>::min()) return std::numeric_limits<T>::min();
  if (r > std::numeric_limits<T>::max()) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

pr::Program MustBuild(const ProgramBuilder& b) {
  absl::StatusOr<pr::Program> p = b.Build();
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

// A one-step program: dst and src buffers of the given types and counts.
std::string Refusal(const pr::Program& p) {
  const absl::Status s = pr::Validate(p);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

}  // namespace

TEST_CASE("copy walks odd shapes with a base and negative strides", "[restructure]") {
  ProgramBuilder b;
  const auto x = b.Input("x", DataType::kF32, 200);
  const auto y = b.Output("y", DataType::kF32, 150);
  b.Step(Op::kCopy, {7, 5}, ProgramBuilder::At(y, 3, {5, 1}),
         ProgramBuilder::At(x, 190, {-13, -2}));
  const pr::Program p = MustBuild(b);
  const std::vector<float> xs = RandomFloats(200, 1);
  std::vector<std::vector<uint8_t>> out;
  REQUIRE(RunProgram(p, {ToBytes(xs)}, &out, 0).ok());
  const std::vector<float> ys = FromBytes<float>(out[0]);
  std::vector<float> want(150, 0.0f);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 5; ++j) want[3 + 5 * i + j] = xs[190 - 13 * i - 2 * j];
  for (size_t k = 0; k < want.size(); ++k) REQUIRE(SameBits(ys[k], want[k]));
}

TEST_CASE("binary ops over three levels, buffer and scalar operands", "[restructure]") {
  const Op ops[] = {Op::kAdd, Op::kMul, Op::kDiv, Op::kPow};
  const std::vector<float> as = RandomFloats(300, 2, 0.1f, 3.0f);
  const std::vector<float> bs = RandomFloats(100, 3, -2.0f, 2.0f);
  auto apply = [](Op op, float a, float c) {
    switch (op) {
      case Op::kAdd:
        return a + c;
      case Op::kMul:
        return a * c;
      case Op::kDiv:
        return a / c;
      default:
        return std::pow(a, c);
    }
  };
  for (Op op : ops) {
    for (bool scalar : {false, true}) {
      ProgramBuilder b;
      const auto a = b.Input("a", DataType::kF32, 300);
      const auto c = b.Input("c", DataType::kF32, 100);
      const auto y = b.Output("y", DataType::kF32, 3 * 4 * 5 + 11);
      const Access dst = ProgramBuilder::At(y, 11, {20, 5, 1});
      const Access s1 = ProgramBuilder::At(a, 299, {-7, -31, -40});
      // src2 broadcasts along the middle level (stride 0).
      const Access s2 = ProgramBuilder::At(c, 2, {9, 0, 17});
      if (scalar) {
        b.Step(op, {3, 4, 5}, dst, s1, 1.75f);
        b.Copy(y, y);  // harmless in-place copy after the op
      } else {
        b.Step(op, {3, 4, 5}, dst, s1, s2);
      }
      // The second input is unused in the scalar form: still declared, still checked.
      const pr::Program p = MustBuild(b);
      std::vector<std::vector<uint8_t>> out;
      REQUIRE(RunProgram(p, {ToBytes(as), ToBytes(bs)}, &out).ok());
      const std::vector<float> ys = FromBytes<float>(out[0]);
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j)
          for (int k = 0; k < 5; ++k) {
            const float av = as[299 - 7 * i - 31 * j - 40 * k];
            const float cv = scalar ? 1.75f : bs[2 + 9 * i + 17 * k];
            INFO(pr::OpName(op) << " scalar " << scalar << " at " << i << "," << j << "," << k);
            REQUIRE(SameBits(ys[11 + 20 * i + 5 * j + k], apply(op, av, cv)));
          }
      // Elements no step writes keep the caller's bytes.
      for (size_t e = 0; e < 11 * 4; ++e) REQUIRE(out[0][e] == 0xEE);
    }
  }
}

TEST_CASE("log10 and mixed-type operands convert through f32", "[restructure]") {
  ProgramBuilder b;
  const auto u = b.Input("u", DataType::kU8, 50);
  const auto h = b.Input("h", DataType::kBF16, 50);
  const auto y = b.Output("y", DataType::kI8, 50);
  const auto l = b.Output("l", DataType::kF16, 50);
  b.Add(y, u, h);
  b.Log10(l, u);
  const pr::Program p = MustBuild(b);
  std::vector<uint8_t> us(50);
  std::vector<uint16_t> hs(50);
  for (int i = 0; i < 50; ++i) {
    us[i] = static_cast<uint8_t>(i * 5);
    hs[i] = plexus::kernels::FloatToBf16(-1.3f * static_cast<float>(i));
  }
  std::vector<std::vector<uint8_t>> out;
  REQUIRE(RunProgram(p, {us, ToBytes(hs)}, &out).ok());
  const std::vector<int8_t> ys = FromBytes<int8_t>(out[0]);
  const std::vector<uint16_t> ls = FromBytes<uint16_t>(out[1]);
  for (int i = 0; i < 50; ++i) {
    const float sum = static_cast<float>(us[i]) + plexus::kernels::Bf16ToFloat(hs[i]);
    REQUIRE(ys[i] == IntegerOf<int8_t>(sum));
    REQUIRE(ls[i] == plexus::kernels::FloatToHalf(std::log10(static_cast<float>(us[i]))));
  }
  CHECK(ls[0] == 0xFC00);  // log10(0) = -inf
}

TEST_CASE("maxpool reduces the window levels, NaN propagates", "[restructure]") {
  // A 1-D pool with a negative source stride: dst[i] = max(src[60 - 4i - k], k < 3).
  ProgramBuilder b;
  const auto x = b.Input("x", DataType::kF32, 61);
  const auto y = b.Output("y", DataType::kF32, 14);
  pr::Step s;
  s.op = Op::kMaxPool;
  s.iters = {13, 3};
  s.dst = ProgramBuilder::At(y, 1, {1, 0});
  s.src1 = ProgramBuilder::At(x, 60, {-4, -1});
  s.window_levels = 1;
  b.Step(s);
  const pr::Program p = MustBuild(b);
  std::vector<float> xs = RandomFloats(61, 4);
  xs[60 - 4 * 5 - 1] = NAN;
  std::vector<std::vector<uint8_t>> out;
  REQUIRE(RunProgram(p, {ToBytes(xs)}, &out).ok());
  const std::vector<float> ys = FromBytes<float>(out[0]);
  for (int i = 0; i < 13; ++i) {
    float m = -INFINITY;
    bool nan = false;
    for (int k = 0; k < 3; ++k) {
      const float v = xs[60 - 4 * i - k];
      nan = nan || std::isnan(v);
      m = std::max(m, v);
    }
    if (nan) {
      REQUIRE(std::isnan(ys[1 + i]));
    } else {
      REQUIRE(ys[1 + i] == m);
    }
  }
  CHECK(std::isnan(ys[6]));
}

TEST_CASE("MaxPool2D at odd shapes, windows and strides", "[restructure]") {
  struct Case {
    int64_t h, w, c, wh, ww, sh, sw;
  };
  for (const Case& k : {Case{7, 9, 3, 2, 2, 2, 2}, Case{11, 5, 1, 3, 2, 2, 3},
                        Case{6, 6, 2, 3, 3, 1, 1}, Case{4, 3, 5, 4, 3, 1, 1}}) {
    const pr::Pool2D q{k.h, k.w, k.c, k.wh, k.ww, k.sh, k.sw};
    const int64_t oh = q.out_h(), ow = q.out_w();
    ProgramBuilder b;
    const auto x = b.Input("img", DataType::kU8, k.h * k.w * k.c);
    const auto y = b.Output("pool", DataType::kBF16, oh * ow * k.c);
    b.MaxPool2D(y, x, q);
    const pr::Program p = MustBuild(b);
    std::vector<uint8_t> xs(k.h * k.w * k.c);
    std::mt19937 rng(static_cast<uint32_t>(k.h * 100 + k.w));
    for (auto& v : xs) v = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, {xs}, &out).ok());
    const std::vector<uint16_t> ys = FromBytes<uint16_t>(out[0]);
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t c = 0; c < k.c; ++c) {
          int m = 0;
          for (int64_t a = 0; a < k.wh; ++a)
            for (int64_t d = 0; d < k.ww; ++d)
              m = std::max<int>(m, xs[((i * k.sh + a) * k.w + j * k.sw + d) * k.c + c]);
          REQUIRE(ys[(i * ow + j) * k.c + c] ==
                  plexus::kernels::FloatToBf16(static_cast<float>(m)));
        }
  }
}

TEST_CASE("layout ops: transpose, concat, concat2d, reshape", "[restructure]") {
  const int64_t rows = 5, cols = 7;
  ProgramBuilder b;
  const auto m = b.Input("m", DataType::kI8, rows * cols);
  const auto p0 = b.Input("p0", DataType::kI8, 3);
  const auto p1 = b.Input("p1", DataType::kI8, 10);
  const auto p2 = b.Input("p2", DataType::kI8, 5);
  const auto t = b.Output("t", DataType::kI8, rows * cols);
  const auto cat = b.Output("cat", DataType::kI8, 18);
  const auto wide = b.Output("wide", DataType::kI8, 5 * (2 + 1));
  const auto same = b.Output("same", DataType::kI8, rows * cols);
  const auto q0 = b.Input("q0", DataType::kI8, 10);
  b.Transpose2D(t, m, rows, cols);
  b.Concat(cat, {p0, p1, p2});
  b.Concat2D(wide, {q0, p2}, 5);
  b.Reshape(same, m);
  b.Flatten(same, same);  // a view: no step
  const pr::Program p = MustBuild(b);
  CHECK(p.steps.size() == 1 + 3 + 2 + 1);
  std::vector<std::vector<uint8_t>> in;
  for (int64_t n : {rows * cols, int64_t{3}, int64_t{10}, int64_t{5}, int64_t{10}}) {
    std::vector<uint8_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(n * 16 + i);
    in.push_back(v);
  }
  std::vector<std::vector<uint8_t>> out;
  REQUIRE(RunProgram(p, in, &out).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) REQUIRE(out[0][c * rows + r] == in[0][r * cols + c]);
  std::vector<uint8_t> want;
  for (int k : {1, 2, 3}) want.insert(want.end(), in[k].begin(), in[k].end());
  CHECK(out[1] == want);
  for (int r = 0; r < 5; ++r) {
    CHECK(out[2][r * 3] == in[4][r * 2]);
    CHECK(out[2][r * 3 + 1] == in[4][r * 2 + 1]);
    CHECK(out[2][r * 3 + 2] == in[3][r]);
  }
  CHECK(out[3] == in[0]);
}

TEST_CASE("casts round to nearest even and saturate", "[restructure]") {
  struct Case {
    DataType to;
    float from;
    int64_t want;  // integer result, or the f16/bf16 bits
  };
  const Case cases[] = {
      {DataType::kU8, 300.7f, 255},
      {DataType::kU8, -3.2f, 0},
      {DataType::kU8, 2.5f, 2},
      {DataType::kU8, 3.5f, 4},
      {DataType::kU8, 254.5f, 254},
      {DataType::kU8, 255.5f, 255},
      {DataType::kU8, NAN, 0},
      {DataType::kU8, INFINITY, 255},
      {DataType::kI8, -1e9f, -128},
      {DataType::kI8, 1e9f, 127},
      {DataType::kI8, 127.5f, 127},
      {DataType::kI8, -128.5f, -128},
      {DataType::kI8, -2.5f, -2},
      {DataType::kI8, -3.5f, -4},
      {DataType::kI8, NAN, 0},
      {DataType::kI8, -INFINITY, -128},
      {DataType::kI32, 3e9f, 2147483647},
      {DataType::kI32, -3e9f, -2147483648LL},
      {DataType::kI32, 2.5f, 2},
      {DataType::kI32, -0.5f, 0},
      {DataType::kI32, NAN, 0},
      {DataType::kI32, 2147483520.0f, 2147483520},
      {DataType::kBF16, 1.0f + 1.0f / 256, 0x3F80},  // tie: even (down)
      {DataType::kBF16, 1.0f + 3.0f / 256, 0x3F82},  // tie: even (up)
      {DataType::kF16, 1.0f + 1.0f / 2048, 0x3C00},
      {DataType::kF16, 65520.0f, 0x7C00},
      {DataType::kF16, -65504.0f, 0xFBFF},
  };
  for (const Case& c : cases) {
    ProgramBuilder b;
    const auto x = b.Input("x", DataType::kF32, 1);
    const auto y = b.Output("y", c.to, 1);
    b.Cast(y, x);
    const pr::Program p = MustBuild(b);
    std::vector<std::vector<uint8_t>> out;
    REQUIRE(RunProgram(p, {ToBytes(std::vector<float>{c.from})}, &out).ok());
    int64_t got = 0;
    switch (c.to) {
      case DataType::kU8:
        got = out[0][0];
        break;
      case DataType::kI8:
        got = FromBytes<int8_t>(out[0])[0];
        break;
      case DataType::kI32:
        got = FromBytes<int32_t>(out[0])[0];
        break;
      default:
        got = FromBytes<uint16_t>(out[0])[0];
    }
    INFO(plexus::kernels::DataTypeName(c.to) << " of " << c.from);
    CHECK(got == c.want);
  }
}

TEST_CASE("every cast pair agrees with the stated conversions", "[restructure]") {
  const DataType types[] = {DataType::kF32, DataType::kF16, DataType::kBF16,
                            DataType::kI32, DataType::kI8,  DataType::kU8};
  const std::vector<int32_t> i32s = {
      0, 1, -1, 127, 128, -129, 255, 256, 16777217, 16777219, -2147483647 - 1, 2147483647};
  const std::vector<float> f32s = {0.0f,    -0.0f, 0.5f,   1.5f, -2.5f,    100.49f,  255.5f,
                                   -128.5f, 1e10f, -1e10f, NAN,  INFINITY, 3.14159f, 65519.0f};
  for (DataType from : types) {
    for (DataType to : types) {
      // Source bytes: the f32 values or the i32 values in `from`'s encoding.
      std::vector<uint8_t> src;
      std::vector<float> as_f32;  // each source element as the test reads it
      const size_t n = std::max(i32s.size(), f32s.size());
      for (size_t i = 0; i < n; ++i) {
        const float f = f32s[i % f32s.size()];
        const int32_t v = i32s[i % i32s.size()];
        switch (from) {
          case DataType::kF32:
            for (uint8_t byte : ToBytes(std::vector<float>{f})) src.push_back(byte);
            as_f32.push_back(f);
            break;
          case DataType::kF16: {
            const uint16_t h = plexus::kernels::FloatToHalf(f);
            for (uint8_t byte : ToBytes(std::vector<uint16_t>{h})) src.push_back(byte);
            as_f32.push_back(plexus::kernels::HalfToFloat(h));
            break;
          }
          case DataType::kBF16: {
            const uint16_t h = plexus::kernels::FloatToBf16(f);
            for (uint8_t byte : ToBytes(std::vector<uint16_t>{h})) src.push_back(byte);
            as_f32.push_back(plexus::kernels::Bf16ToFloat(h));
            break;
          }
          case DataType::kI32:
            for (uint8_t byte : ToBytes(std::vector<int32_t>{v})) src.push_back(byte);
            as_f32.push_back(static_cast<float>(static_cast<double>(v)));
            break;
          case DataType::kI8:
            src.push_back(static_cast<uint8_t>(v));
            as_f32.push_back(static_cast<float>(static_cast<int8_t>(v)));
            break;
          default:
            src.push_back(static_cast<uint8_t>(v));
            as_f32.push_back(static_cast<float>(static_cast<uint8_t>(v)));
        }
      }
      ProgramBuilder b;
      const auto x = b.Input("x", from, static_cast<int64_t>(n));
      const auto y = b.Output("y", to, static_cast<int64_t>(n));
      b.Cast(y, x);
      const pr::Program p = MustBuild(b);
      std::vector<std::vector<uint8_t>> out;
      REQUIRE(RunProgram(p, {src}, &out).ok());
      INFO(plexus::kernels::DataTypeName(from) << " -> " << plexus::kernels::DataTypeName(to));
      if (from == to) {
        REQUIRE(out[0] == src);  // bit copy (NaN payloads too)
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        const float f = as_f32[i];
        INFO("element " << i << " = " << f);
        switch (to) {
          case DataType::kF32:
            REQUIRE(SameBits(FromBytes<float>(out[0])[i], f));
            break;
          case DataType::kF16:
            REQUIRE(FromBytes<uint16_t>(out[0])[i] == plexus::kernels::FloatToHalf(f));
            break;
          case DataType::kBF16:
            REQUIRE(FromBytes<uint16_t>(out[0])[i] == plexus::kernels::FloatToBf16(f));
            break;
          case DataType::kI32:
            REQUIRE(FromBytes<int32_t>(out[0])[i] == IntegerOf<int32_t>(f));
            break;
          case DataType::kI8:
            REQUIRE(FromBytes<int8_t>(out[0])[i] == IntegerOf<int8_t>(f));
            break;
          default:
            REQUIRE(out[0][i] == IntegerOf<uint8_t>(f));
        }
      }
    }
  }
  // i32 -> f32 rounds to nearest even; a same-type cast keeps even what f32 cannot hold.
  CHECK(static_cast<float>(16777217.0) == 16777216.0f);
}

TEST_CASE("the validator names the step, op, operand and buffer", "[restructure]") {
  ProgramBuilder b;
  const auto spectrum = b.Input("spectrum", DataType::kF32, 1048576);
  const auto y = b.Output("y", DataType::kF32, 2 * 1048576);
  const auto t = b.Scratch("t", DataType::kF32, 8);
  pr::Program p = MustBuild(b);
  auto step = [&](Op op, std::vector<int64_t> iters, Access dst, Access src1) {
    pr::Step s;
    s.op = op;
    s.iters = std::move(iters);
    s.dst = std::move(dst);
    s.src1 = std::move(src1);
    return s;
  };
  for (int k = 0; k < 3; ++k) {
    p.steps.push_back(
        step(Op::kCopy, {4}, ProgramBuilder::At(y, 0, {1}), ProgramBuilder::At(spectrum, 0, {1})));
  }
  pr::Step mul = step(Op::kMul, {1048576}, ProgramBuilder::At(y, 0, {1}),
                      ProgramBuilder::At(spectrum, 1, {1}));
  mul.src2_kind = pr::Operand2::kScalar;
  mul.scalar = 2.0f;
  p.steps.push_back(mul);
  CHECK(Refusal(p) ==
        "step 3 (mul): src1 'spectrum' reaches element 1048576 but has 1048576 elements");

  p.steps.back().src1 = ProgramBuilder::At(spectrum, 1048575, {-1});
  p.steps.back().iters = {1048577};
  p.steps.back().dst = ProgramBuilder::At(y, 0, {1});
  CHECK(Refusal(p) ==
        "step 3 (mul): src1 'spectrum' reaches element -1 (before its first element)");

  // Negative strides reach down from the base; the validator takes the sign into account.
  p.steps.back().iters = {1048576};
  p.steps.back().dst = ProgramBuilder::At(y, 1048575, {-1});
  CHECK(pr::Validate(p).ok());
  p.steps.back().dst = ProgramBuilder::At(y, 1048574, {-1});
  CHECK(Refusal(p) == "step 3 (mul): dst 'y' reaches element -1 (before its first element)");
  p.steps.back().dst = ProgramBuilder::At(y, 1048575, {-1});

  SECTION("src2 named") {
    p.steps.back().src2_kind = pr::Operand2::kBuffer;
    p.steps.back().scalar = 0;
    p.steps.back().src2 = ProgramBuilder::At(t, 0, {0});
    CHECK(Refusal(p) == "step 3 (mul): src2 't': reads scratch that no earlier step writes");
    p.steps.insert(p.steps.begin(), step(Op::kCopy, {1}, ProgramBuilder::At(t, 0, {0}),
                                         ProgramBuilder::At(spectrum, 0, {0})));
    CHECK(pr::Validate(p).ok());
    p.steps.back().src2 = ProgramBuilder::At(t, 7, {1});
    CHECK(Refusal(p) == "step 4 (mul): src2 't' reaches element 1048582 but has 8 elements");
  }
  SECTION("dst may not be an input") {
    p.steps.back().dst = ProgramBuilder::At(spectrum, 1048575, {-1});
    CHECK(Refusal(p).find("step 3 (mul): dst 'spectrum' is an input buffer") == 0);
  }
  SECTION("arity") {
    p.steps.back().src2_kind = pr::Operand2::kNone;
    p.steps.back().scalar = 0;
    CHECK(Refusal(p) == "step 3 (mul): a binary op needs src2 (a buffer or a scalar)");
    p.steps.back().op = Op::kLog10;
    CHECK(pr::Validate(p).ok());
    p.steps.back().src2_kind = pr::Operand2::kScalar;
    CHECK(Refusal(p) == "step 3 (log10): a unary op takes no src2");
  }
  SECTION("copy keeps types") {
    pr::Program q = p;
    q.buffers[1].dtype = DataType::kF16;
    CHECK(Refusal(q) ==
          "step 0 (copy): dst 'y' is f16 but src1 'spectrum' is f32 (copy keeps types; use cast)");
  }
  SECTION("unsupported types name the buffer") {
    p.buffers[2].dtype = DataType::kF64;
    CHECK(Refusal(p) == "buffer 2 't': dtype f64 is not supported (f32, f16, bf16, i32, i8, u8)");
    p.buffers[2].dtype = DataType::kI64;
    CHECK(Refusal(p).find("dtype i64 is not supported") != std::string::npos);
  }
  SECTION("names") {
    p.buffers[2].name = "y";
    CHECK(Refusal(p) == "buffer 2 'y': name already used by buffer 1");
    p.buffers[2].name = "has space";
    CHECK(Refusal(p).find("buffer 2: name must be") == 0);
    p.buffers[2].name = std::string(65, 'n');
    CHECK(Refusal(p).find("buffer 2: name must be") == 0);
  }
  SECTION("levels and iteration counts") {
    p.steps[0].iters = {0};
    CHECK(Refusal(p) == "step 0 (copy): level 0 iteration count 0 (>= 1)");
    p.steps[0].iters = {1, 1, 1, 1, 1, 1, 1};
    CHECK(Refusal(p) == "step 0 (copy): 7 levels (1..6)");
    p.steps[0].iters = {2, 2};
    CHECK(Refusal(p) == "step 0 (copy): dst 'y': 1 strides for 2 levels");
    p.steps[0].iters = {1 << 20, 1 << 20, 2};
    p.steps[0].dst.strides = {0, 0, 0};
    p.steps[0].src1.strides = {0, 0, 0};
    CHECK(Refusal(p).find("step 0 (copy): more than 1099511627776 iterations") == 0);
  }
  SECTION("overflow and huge strides are refused") {
    p.steps[0].iters = {1 << 20, 1 << 19};
    p.steps[0].dst.strides = {int64_t{1} << 40, int64_t{1} << 40};
    p.steps[0].src1.strides = {0, 0};
    CHECK(Refusal(p).find("step 0 (copy): dst 'y' reaches element") == 0);
    p.steps[0].dst.strides = {(int64_t{1} << 40) + 1, 1};
    CHECK(Refusal(p) ==
          "step 0 (copy): dst 'y': level 0 stride 1099511627777 beyond +-1099511627776");
    p.steps[0].dst.strides = {1, 1};
    p.steps[0].dst.base = std::numeric_limits<int64_t>::min();
    CHECK(Refusal(p).find("step 0 (copy): dst 'y': base") == 0);
  }
  SECTION("a dst may not write an element twice") {
    p.steps[0].iters = {3, 4};
    p.steps[0].dst.strides = {0, 1};
    p.steps[0].src1.strides = {4, 1};
    CHECK(Refusal(p) ==
          "step 0 (copy): dst 'y' may write an element twice (level 0: stride 0, 3 iterations)");
    p.steps[0].dst.strides = {3, 1};  // rows overlap by one element
    CHECK(Refusal(p).find("may write an element twice (level 0: stride 3") != std::string::npos);
    p.steps[0].dst.strides = {-4, -1};
    p.steps[0].dst.base = 11;
    CHECK(pr::Validate(p).ok());
  }
  SECTION("in place is fine, a partial overlap is not") {
    const Access a = ProgramBuilder::At(y, 0, {1});
    p.steps.push_back(step(Op::kLog10, {8}, a, a));
    CHECK(pr::Validate(p).ok());
    p.steps.back().src1 = ProgramBuilder::At(y, 1, {1});
    CHECK(Refusal(p) ==
          "step 4 (log10): dst 'y' overlaps src1 in elements [1, 7] without being the same access");
    p.steps.back().src1 = ProgramBuilder::At(y, 8, {1});  // disjoint: fine
    CHECK(pr::Validate(p).ok());
  }
  SECTION("maxpool windows") {
    pr::Step pool = step(Op::kMaxPool, {4, 2}, ProgramBuilder::At(y, 0, {1, 0}),
                         ProgramBuilder::At(spectrum, 0, {2, 1}));
    pool.window_levels = 1;
    p.steps.push_back(pool);
    CHECK(pr::Validate(p).ok());
    p.steps.back().window_levels = 3;
    CHECK(Refusal(p) == "step 4 (maxpool): window_levels 3 outside 1..2");
    p.steps.back().window_levels = 1;
    p.steps.back().dst.strides = {1, 1};
    CHECK(Refusal(p) == "step 4 (maxpool): dst 'y' has stride 1 on window level 1 (must be 0)");
    p.steps.back().op = Op::kCopy;
    CHECK(Refusal(p) == "step 4 (copy): window_levels 1 on a non-pooling op");
  }
}

TEST_CASE("the builder reports inconsistent sizes", "[restructure]") {
  ProgramBuilder b;
  const auto x = b.Input("x", DataType::kF32, 10);
  const auto y = b.Output("y", DataType::kF32, 12);
  b.Mul(y, x, 2.0f);
  absl::StatusOr<pr::Program> p = b.Build();
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message() == "mul: dst 'y' has 12 elements but 'x' has 10");
  ProgramBuilder c;
  const auto z = c.Output("z", DataType::kF32, 12);
  c.Concat(z, {c.Input("a", DataType::kF32, 5), c.Input("b", DataType::kF32, 5)});
  CHECK(c.Build().status().message() == "concat: the parts have 10 elements, dst 'z' has 12");
  ProgramBuilder d;
  d.Transpose2D(d.Output("t", DataType::kU8, 6), d.Input("s", DataType::kU8, 6), 4, 2);
  CHECK_FALSE(d.Build().ok());
}

TEST_CASE("the interpreter checks the caller's buffers", "[restructure]") {
  ProgramBuilder b;
  const auto x = b.Input("x", DataType::kF32, 4);
  const auto y = b.Output("y", DataType::kI32, 4);
  b.Cast(y, x);
  const pr::Program p = MustBuild(b);
  std::vector<uint8_t> in(16), out(16), small(12);
  const pr::ConstBytes ins[] = {{in.data(), in.size()}};
  const pr::MutableBytes outs[] = {{out.data(), out.size()}};
  CHECK(pr::Interpret(p, ins, outs).ok());
  const pr::MutableBytes short_out[] = {{small.data(), small.size()}};
  CHECK(pr::Interpret(p, ins, short_out).message() ==
        "output 'y': 12 bytes given, declared 4 i32 elements = 16 bytes");
  CHECK(pr::Interpret(p, {}, outs).message() ==
        "program declares 1 inputs and 1 outputs; given 0 and 1");
  const pr::MutableBytes aliased[] = {{in.data(), in.size()}};
  CHECK(pr::Interpret(p, ins, aliased).message() == "output 'y' overlaps input 'x' in memory");
}
