// The fast executor against the reference interpreter: bit for bit on casts, arithmetic, layout
// ops and pooling at odd shapes, on random fused chains, and on the five pipelines; kPow's x * x
// and kLog10's polynomial within their documented bounds.
#include "plexus/restructure/executor.hpp"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "restructure/support.hpp"
#include "tile.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pk = plexus::kernels;
using pk::DataType;

namespace {

pr::Program Built(absl::StatusOr<pr::Program> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

using plexus::restructure::testing::RandomInputs;
using plexus::restructure::testing::Ulps;

std::vector<std::vector<uint8_t>> Outputs(const pr::Program& p, uint8_t fill) {
  std::vector<std::vector<uint8_t>> out;
  for (const pr::BufferDecl& b : p.buffers) {
    if (b.role == pr::Role::kOutput) {
      out.emplace_back(static_cast<size_t>(b.count) * pk::DataTypeSize(b.dtype), fill);
    }
  }
  return out;
}

struct Both {
  std::vector<std::vector<uint8_t>> reference, fast;
};

Both RunBothOn(const pr::Program& p, const std::vector<std::vector<uint8_t>>& inputs) {
  std::vector<pr::ConstBytes> in;
  for (const auto& v : inputs) in.emplace_back(v.data(), v.size());
  Both r{Outputs(p, 0xEE), Outputs(p, 0xEE)};
  auto spans = [](std::vector<std::vector<uint8_t>>& v) {
    std::vector<pr::MutableBytes> s;
    for (auto& x : v) s.emplace_back(x.data(), x.size());
    return s;
  };
  REQUIRE(pr::Interpret(p, in, spans(r.reference)).ok());
  auto e = pr::Executor::Compile(p);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  const absl::Status s = e->Run(in, spans(r.fast));
  INFO(s.ToString());
  REQUIRE(s.ok());
  return r;
}

Both RunBoth(const pr::Program& p, uint32_t seed) { return RunBothOn(p, RandomInputs(p, seed)); }

void RequireSameOn(const pr::Program& p, const std::vector<std::vector<uint8_t>>& inputs) {
  const Both b = RunBothOn(p, inputs);
  for (size_t k = 0; k < b.reference.size(); ++k) {
    size_t first = b.reference[k].size();
    for (size_t i = 0; i < b.reference[k].size(); ++i) {
      if (b.reference[k][i] != b.fast[k][i]) {
        first = i;
        break;
      }
    }
    INFO("output " << k << " first differing byte " << first << " of " << b.reference[k].size());
    CHECK(first == b.reference[k].size());
  }
}

void RequireSame(const pr::Program& p, uint32_t seed) { RequireSameOn(p, RandomInputs(p, seed)); }

constexpr DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16,
                               DataType::kI32, DataType::kI8,  DataType::kU8};

}  // namespace

TEST_CASE("casts between every pair of types, bit for bit", "[restructure][executor]") {
  for (DataType from : kTypes) {
    for (DataType to : kTypes) {
      for (int64_t n : {1, 7, 1023, 1024, 1025, 3000}) {
        pr::ProgramBuilder b;
        auto x = b.Input("x", from, n);
        auto y = b.Output("y", to, n);
        b.Cast(y, x);
        INFO(pk::DataTypeName(from) << " -> " << pk::DataTypeName(to) << " n " << n);
        RequireSame(Built(b.Build()), static_cast<uint32_t>(n));
      }
    }
  }
}

TEST_CASE("arithmetic chains fuse into one pass and match", "[restructure][executor]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t rows = 1 + rng() % 40, cols = 1 + rng() % 70, n = rows * cols;
    pr::ProgramBuilder b;
    auto x = b.Input("x", kTypes[rng() % 6], n);
    auto w = b.Input("w", DataType::kF32, cols);
    auto t1 = b.Scratch("t1", kTypes[rng() % 3], n);  // f32, f16 or bf16
    auto t2 = b.Scratch("t2", DataType::kF32, n);
    auto y = b.Output("y", kTypes[rng() % 6], n);
    b.Mul(t1, x, 0.75f);
    b.Add(t1, t1, 3.0f);  // in place
    // A [rows, cols] nest beside flat ones: the weights walk the columns of every row.
    b.Step(pr::Op::kMul, {rows, cols}, pr::ProgramBuilder::At(t2, 0, {cols, 1}),
           pr::ProgramBuilder::At(t1, 0, {cols, 1}), pr::ProgramBuilder::At(w, 0, {0, 1}));
    if (rng() % 2) b.Div(t2, t2, 1.5f);
    b.Cast(y, t2);
    const pr::Program p = Built(b.Build());
    INFO("trial " << trial << " rows " << rows << " cols " << cols);
    RequireSame(p, static_cast<uint32_t>(trial));
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    INFO(e->Describe());
    CHECK(e->passes() == 1);
  }
}

TEST_CASE("large outputs stored past the cache match, at odd sizes and unaligned bases",
          "[restructure][executor]") {
  // From 8 MiB on an f32 output that no later pass reads is streamed (non-temporal stores) by
  // the tile passes; every type, an odd element count, and a destination starting off a 16-byte
  // boundary. A chain kept in registers stores through the cache.
  for (bool chain : {false, true}) {
    for (DataType to : kTypes) {
      const int64_t n = (int64_t{9} << 20) / 2 + 7;  // >= 8 MiB for every type but i8/u8: they
                                                     // get twice the count below
      const int64_t count = pk::DataTypeSize(to) == 1 ? 2 * n : n;
      pr::ProgramBuilder b;
      auto x = b.Input("x", DataType::kF32, count);
      auto z = b.Input("z", DataType::kF32, 2 * count);
      auto y = b.Output("y", to, count + 3);
      auto t = b.Scratch("t", DataType::kF32, count);
      b.Mul(t, x, 0.5f);
      if (chain) {
        b.Step(pr::Op::kAdd, {count}, pr::ProgramBuilder::At(y, 3, {1}),
               pr::ProgramBuilder::At(t, 0, {1}), 1.0f);
      } else {  // an operand read with a stride: not a chain
        b.Step(pr::Op::kAdd, {count}, pr::ProgramBuilder::At(y, 3, {1}),
               pr::ProgramBuilder::At(t, 0, {1}), pr::ProgramBuilder::At(z, 1, {2}));
      }
      INFO("-> " << pk::DataTypeName(to) << (chain ? ", a chain" : ""));
      const pr::Program p = Built(b.Build());
      auto e = pr::Executor::Compile(p);
      REQUIRE(e.ok());
      // Streamed: f32 outputs of tile passes only (the others convert through a cached tile).
      if (to == DataType::kF32 && !chain) {
        CHECK_THAT(e->Describe(), Catch::Contains("1 streamed"));
      } else {
        CHECK_THAT(e->Describe(), !Catch::Contains("streamed"));
      }
      RequireSame(p, 11);
    }
  }
}

TEST_CASE("layout ops: transposes, concats, strided and reversed copies",
          "[restructure][executor]") {
  for (DataType t : kTypes) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {33, 31}, {64, 100}, {257, 3}}) {
      pr::ProgramBuilder b;
      auto x = b.Input("x", t, rows * cols);
      auto y = b.Output("y", t, rows * cols);
      b.Transpose2D(y, x, rows, cols);
      INFO(pk::DataTypeName(t) << " transpose " << rows << "x" << cols);
      RequireSame(Built(b.Build()), static_cast<uint32_t>(rows));
    }
    {
      // Batched, into padded rows at an odd base: the outer level, strides that are not the
      // extents and a strip's tails (19 rows, 23 columns) all move.
      pr::ProgramBuilder bt;
      auto x = bt.Input("x", t, 2 * 23 * 19);
      auto y = bt.Output("y", t, 1 + 2 * 19 * 25);
      bt.Step(pr::Op::kCopy, {2, 19, 23}, pr::ProgramBuilder::At(y, 1, {19 * 25, 25, 1}),
              pr::ProgramBuilder::At(x, 0, {23 * 19, 1, 19}));
      INFO(pk::DataTypeName(t) << " batched transpose");
      RequireSame(Built(bt.Build()), 7);
    }
    pr::ProgramBuilder c;
    auto a = c.Input("a", t, 6 * 7), b2 = c.Input("b", t, 6 * 9), d = c.Input("d", t, 6 * 1);
    auto y = c.Output("y", t, 6 * 17);
    c.Concat2D(y, {a, b2, d}, 6);
    RequireSame(Built(c.Build()), 3);
    // A reversed copy: negative strides.
    pr::ProgramBuilder r;
    auto x = r.Input("x", t, 1001);
    auto z = r.Output("z", t, 1001);
    r.Step(pr::Op::kCopy, {1001}, pr::ProgramBuilder::At(z, 0, {1}),
           pr::ProgramBuilder::At(x, 1000, {-1}));
    RequireSame(Built(r.Build()), 5);
  }
}

TEST_CASE("chains kept in registers: every source type, values rounded through their types",
          "[restructure][executor]") {
  // One pass whose first step reads memory and whose later steps take the step before: run in
  // registers 32 elements at a time (tails and unaligned bases through the tiles), with a
  // computed scratch of each type in between, into every output type (integers take the tiles).
  for (DataType in : kTypes) {
    for (DataType mid : kTypes) {
      for (DataType out : kTypes) {
        const int64_t n = 1000 + 37;
        pr::ProgramBuilder b;
        auto x = b.Input("x", in, n + 1);
        auto t = b.Scratch("t", mid, n);
        auto y = b.Output("y", out, n + 3);
        b.Step(pr::Op::kMul, {n}, pr::ProgramBuilder::At(t, 0, {1}),
               pr::ProgramBuilder::At(x, 1, {1}), 0.37f);
        b.Step(pr::Op::kDiv, {n}, pr::ProgramBuilder::At(t, 0, {1}),
               pr::ProgramBuilder::At(t, 0, {1}), 3.0f);
        b.Step(pr::Op::kAdd, {n}, pr::ProgramBuilder::At(y, 3, {1}),
               pr::ProgramBuilder::At(t, 0, {1}), 1.5f);
        INFO(pk::DataTypeName(in) << " -> " << pk::DataTypeName(mid) << " -> "
                                  << pk::DataTypeName(out));
        RequireSame(Built(b.Build()), 41);
      }
    }
  }
}

TEST_CASE("chains kept in registers with operands read from memory", "[restructure][executor]") {
  // A row of weights applied to every row (stride 0 across rows), then a tensor of the chain's
  // own shape at an odd base; rows of 77 elements: two chunks of 32 and a tail.
  for (DataType out : kTypes) {
    const int64_t rows = 9, cols = 77;
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, rows * cols);
    auto w = b.Input("w", DataType::kF32, cols);
    auto z = b.Input("z", DataType::kF32, rows * cols + 1);
    auto t = b.Scratch("t", DataType::kF32, rows * cols);
    auto y = b.Output("y", out, rows * cols);
    const pr::Access all = pr::ProgramBuilder::At(t, 0, {cols, 1});
    b.Mul(t, x, 0.5f);
    b.Step(pr::Op::kMul, {rows, cols}, all, all, pr::ProgramBuilder::At(w, 0, {0, 1}));
    b.Step(pr::Op::kDiv, {rows, cols}, all, all, pr::ProgramBuilder::At(z, 1, {cols, 1}));
    b.Add(t, t, 1.0f);
    b.Cast(y, t);
    INFO("-> " << pk::DataTypeName(out));
    RequireSame(Built(b.Build()), 43);
  }
}

TEST_CASE("division by a power of two is multiplication by its reciprocal, bit for bit",
          "[restructure][executor]") {
  // Where the reciprocal is a normal float the product is the same real number as the quotient;
  // at the ends of the exponent range (2^127's reciprocal is subnormal, 2^-127 is subnormal
  // itself) the division stays. Chains (f32 and f16 outputs) and tiles (i32).
  for (float divisor : {4.0f, 0.25f, -2.0f, 1.0f, std::ldexp(1.0f, -126), std::ldexp(1.0f, 126),
                        std::ldexp(1.0f, 127), std::ldexp(1.0f, -127), 3.0f}) {
    for (DataType out : {DataType::kF32, DataType::kF16, DataType::kI32}) {
      pr::ProgramBuilder b;
      auto x = b.Input("x", DataType::kF32, 3001);
      auto y = b.Output("y", out, 3001);
      auto t = b.Scratch("t", DataType::kF32, 3001);
      b.Div(t, x, divisor);
      b.Cast(y, t);
      INFO("/ " << divisor << " -> " << pk::DataTypeName(out));
      RequireSame(Built(b.Build()), 47);
    }
  }
}

TEST_CASE("max pooling at odd shapes, every type", "[restructure][executor]") {
  for (DataType t : kTypes) {
    for (const pr::Pool2D& s :
         {pr::Pool2D{8, 8, 3, 2, 2, 2, 2}, pr::Pool2D{13, 7, 2, 3, 2, 2, 1},
          pr::Pool2D{5, 5, 1, 5, 5, 1, 1}, pr::Pool2D{64, 48, 3, 2, 2, 2, 2}}) {
      pr::ProgramBuilder b;
      auto x = b.Input("x", t, s.height * s.width * s.channels);
      auto y = b.Output("y", t, s.out_h() * s.out_w() * s.channels);
      b.MaxPool2D(y, x, s);
      INFO(pk::DataTypeName(t) << " pool " << s.height << "x" << s.width << "x" << s.channels);
      RequireSame(Built(b.Build()), static_cast<uint32_t>(s.height));
    }
  }
}

TEST_CASE("max pooling keeps the first maximum and the first NaN of each window",
          "[restructure][executor]") {
  // f32 drawn from a few values, so that windows hold ties of +0 and -0 and NaNs with distinct
  // payloads: only the interpreter's order (row by row, left to right) picks the same bits.
  auto inputs = [](const pr::Program& p, uint32_t seed) {
    std::mt19937 rng(seed);
    const float choices[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f};
    std::vector<uint8_t> bytes(static_cast<size_t>(p.buffers[0].count) * 4);
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
      float v = choices[rng() % 5];
      if (rng() % 13 == 0)
        v = std::bit_cast<float>(static_cast<uint32_t>(0x7fc00000u | (rng() & 0x3fffff)));
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
    return std::vector<std::vector<uint8_t>>{bytes};
  };
  // Channels 1-16 take every way of picking a window's values out of a row (gathered, runs of
  // 3-4 and 5-8 in one vector, longer runs copied); a row of 2800 x 3 is too long for one block
  // with its window's second row, which then merges across blocks.
  for (const pr::Pool2D& s :
       {pr::Pool2D{6, 10, 1, 2, 2, 2, 2}, pr::Pool2D{7, 9, 2, 2, 2, 2, 2},
        pr::Pool2D{6, 34, 3, 2, 2, 2, 2}, pr::Pool2D{5, 11, 4, 2, 2, 2, 2},
        pr::Pool2D{4, 10, 5, 2, 2, 2, 2}, pr::Pool2D{4, 9, 8, 2, 2, 2, 2},
        pr::Pool2D{4, 6, 9, 2, 2, 2, 2}, pr::Pool2D{4, 7, 16, 2, 2, 2, 2},
        pr::Pool2D{5, 8, 3, 2, 2, 1, 1}, pr::Pool2D{6, 8, 3, 2, 2, 2, 3},
        pr::Pool2D{5, 600, 3, 2, 2, 2, 2}, pr::Pool2D{4, 2800, 3, 2, 2, 2, 2}}) {
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, s.height * s.width * s.channels);
    auto y = b.Output("y", DataType::kF32, s.out_h() * s.out_w() * s.channels);
    b.MaxPool2D(y, x, s);
    const pr::Program p = Built(b.Build());
    INFO("pool " << s.height << "x" << s.width << "x" << s.channels << " stride " << s.stride_h
                 << "x" << s.stride_w);
    for (const bool avx2 : {true, false}) {
      INFO((avx2 ? "AVX2 where the CPU has it" : "baseline kernels"));
      const bool was = pk::SetAvx2Allowed(avx2);
      for (uint32_t seed : {1u, 2u, 3u}) RequireSameOn(p, inputs(p, seed));
      pk::SetAvx2Allowed(was);
    }
  }
  // Outputs in another order than their windows (channel-major from an interleaved image).
  const int64_t h = 6, w = 14, c = 3, row = w * c;
  pr::ProgramBuilder b;
  auto x = b.Input("x", DataType::kF32, h * row);
  auto y = b.Output("y", DataType::kF32, h / 2 * w / 2 * c);
  pr::Step step;
  step.op = pr::Op::kMaxPool;
  step.iters = {h / 2, c, w / 2, 2, 2};
  step.dst = pr::ProgramBuilder::At(y, 0, {w / 2, h / 2 * w / 2, 1, 0, 0});
  step.src1 = pr::ProgramBuilder::At(x, 0, {2 * row, 1, 2 * c, row, c});
  step.window_levels = 2;
  b.Step(step);
  const pr::Program p = Built(b.Build());
  INFO("channel-major outputs");
  for (uint32_t seed : {4u, 5u}) RequireSameOn(p, inputs(p, seed));
}

TEST_CASE("the pipelines match the interpreter", "[restructure][executor]") {
  // Video and the two layout pipelines bit for bit; the ones with Pow and Log10 within one unit
  // in the last place of their output type.
  RequireSame(Built(pp::VideoSurveillance({96, 54, 3, 1.0f / 255, DataType::kF16})), 1);
  RequireSame(Built(pp::VideoSurveillance({13, 7, 2, 0.37f, DataType::kBF16})), 2);
  RequireSame(Built(pp::PiiRedaction({4, 33, 17, 0})), 3);
  RequireSame(Built(pp::PiiRedaction({3, 33, 17, 1})), 4);
  RequireSame(Built(pp::DbHashJoin({4, 31, 17, DataType::kF32})), 5);
  RequireSame(Built(pp::DbHashJoin({3, 31, 17, DataType::kI8})), 6);
  for (const pr::Program& p : {Built(pp::SoundDetection({81, 77, 1e-10f, 1.0f, DataType::kF16})),
                               Built(pp::SoundDetection({64, 96, 1e-10f, 2.0f, DataType::kF32})),
                               Built(pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kBF16})),
                               Built(pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kF32}))}) {
    const Both b = RunBoth(p, 11);
    const DataType out =
        p.buffers.back().role == pr::Role::kOutput ? p.buffers.back().dtype : DataType::kF32;
    for (const pr::BufferDecl& d : p.buffers) {
      if (d.role != pr::Role::kOutput) continue;
      const size_t size = pk::DataTypeSize(d.dtype);
      int64_t worst = 0;
      for (size_t i = 0; i < b.reference[0].size() / size; ++i) {
        float r, f;
        if (size == 4) {
          std::memcpy(&r, b.reference[0].data() + 4 * i, 4);
          std::memcpy(&f, b.fast[0].data() + 4 * i, 4);
          worst = std::max(worst, Ulps(r, f));
        } else {
          uint16_t hr, hf;
          std::memcpy(&hr, b.reference[0].data() + 2 * i, 2);
          std::memcpy(&hf, b.fast[0].data() + 2 * i, 2);
          worst = std::max<int64_t>(worst, hr > hf ? hr - hf : hf - hr);
        }
      }
      INFO("output type " << pk::DataTypeName(d.dtype) << " worst " << worst);
      // f32 outputs carry the f32 ops' bounds (log10's, then a division); 16-bit ones at most
      // one step of their own.
      CHECK(worst <= (size == 4 ? 2 * pr::kLog10MaxUlp : 1));
    }
    (void)out;
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    INFO(e->Describe());
    CHECK(e->passes() == 1);  // every stage in one pass over memory
  }
}

TEST_CASE("log10 within its bound of std::log10 over the floats", "[restructure][executor]") {
  int64_t worst = 0;
  float worst_at = 0;
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 997) {  // every positive finite float class
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    const int64_t u = Ulps(pr::internal::Log10(x), std::log10(x));
    if (u > worst) {
      worst = u;
      worst_at = x;
    }
  }
  INFO("worst " << worst << " ulp at " << worst_at);
  CHECK(worst <= pr::kLog10MaxUlp);
  for (float special :
       {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(), 1.0f, 10.0f, 1000.0f}) {
    const float f = pr::internal::Log10(special);
    const float r = std::log10(special);
    INFO("at " << special << ": " << f << " vs " << r);
    CHECK((std::bit_cast<uint32_t>(f) == std::bit_cast<uint32_t>(r) ||
           (std::isnan(f) && std::isnan(r))));
  }
}

TEST_CASE("pow by 2 is x * x, within 1 ulp of std::pow", "[restructure][executor]") {
  int64_t worst = 0;
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 1009) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    worst = std::max(worst, Ulps(x * x, std::pow(x, 2.0f)));
  }
  CHECK(worst <= 1);
}

TEST_CASE("the executor refuses what the interpreter refuses", "[restructure][executor]") {
  pr::Program p;
  p.buffers = {{"x", DataType::kF32, 10, pr::Role::kInput},
               {"y", DataType::kF32, 10, pr::Role::kOutput}};
  pr::Step st;
  st.op = pr::Op::kCopy;
  st.iters = {11};
  st.dst = {1, 0, {1}};
  st.src1 = {0, 0, {1}};
  p.steps = {st};
  auto e = pr::Executor::Compile(p);
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("step 0 (copy)") != std::string::npos);
  pr::ProgramBuilder ok;
  auto a = ok.Input("a", DataType::kF32, 4);
  auto c = ok.Output("c", DataType::kF32, 4);
  ok.Copy(c, a);
  auto good = pr::Executor::Compile(Built(ok.Build()));
  REQUIRE(good.ok());
  std::vector<uint8_t> small(12), out(16);
  const pr::ConstBytes in[] = {{small.data(), small.size()}};
  const pr::MutableBytes outs[] = {{out.data(), out.size()}};
  const absl::Status s = good->Run(in, outs);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("'a'") != std::string::npos);
}

TEST_CASE("scratch computed where it is read: concats, scaled inputs, strided and across parts",
          "[restructure][executor]") {
  for (DataType t : {DataType::kF16, DataType::kBF16, DataType::kI8}) {
    // Two parts concatenated into a scratch, scaled in place, read transposed (strided reads that
    // cross from one part to the other) by a cast.
    pr::ProgramBuilder b;
    auto p0 = b.Input("p0", DataType::kU8, 3 * 5);
    auto p1 = b.Input("p1", DataType::kU8, 3 * 5);
    auto rows = b.Scratch("rows", t, 6 * 5);
    auto y = b.Output("y", DataType::kF32, 6 * 5);
    b.Step(pr::Op::kCast, {15}, pr::ProgramBuilder::At(rows, 0, {1}),
           pr::ProgramBuilder::At(p0, 0, {1}));
    b.Step(pr::Op::kCast, {15}, pr::ProgramBuilder::At(rows, 15, {1}),
           pr::ProgramBuilder::At(p1, 0, {1}));
    b.Mul(rows, rows, 0.3f);
    b.Step(pr::Op::kCast, {5, 6}, pr::ProgramBuilder::At(y, 0, {6, 1}),
           pr::ProgramBuilder::At(rows, 0, {1, 5}));
    const pr::Program p = Built(b.Build());
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    INFO(pk::DataTypeName(t) << "\n" << e->Describe());
    CHECK(e->Describe().find("virtual 'rows'") != std::string::npos);
    RequireSame(p, 21);
  }
  {
    // Max pooling over a scaled frame that is never written.
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kU8, 10 * 6 * 3);
    auto s = b.Scratch("s", DataType::kF32, 10 * 6 * 3);
    pr::Pool2D shape{10, 6, 3, 2, 2, 2, 2};
    auto y = b.Output("y", DataType::kF16, shape.out_h() * shape.out_w() * 3);
    b.Mul(s, x, -0.5f);  // negative: the max is taken after the scaling, as the interpreter does
    b.MaxPool2D(y, s, shape);
    const pr::Program p = Built(b.Build());
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    CHECK(e->Describe().find("virtual 's'") != std::string::npos);
    RequireSame(p, 22);
  }
  {
    // Written in part only: materialised (the rest reads as the zeros scratch starts with).
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, 8);
    auto s = b.Scratch("s", DataType::kF32, 16);
    auto y = b.Output("y", DataType::kF32, 16);
    b.Step(pr::Op::kMul, {8}, pr::ProgramBuilder::At(s, 4, {1}), pr::ProgramBuilder::At(x, 0, {1}),
           2.0f);
    b.Add(y, s, 1.0f);
    const pr::Program p = Built(b.Build());
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    CHECK(e->Describe().find("virtual") == std::string::npos);
    RequireSame(p, 23);
  }
}

TEST_CASE("the kernels' baseline build gives the same bits as the AVX2 one",
          "[restructure][executor]") {
  // Every other case runs the AVX2 build where the CPU has it; here the baseline build, for the
  // programs that exercise each kernel (casts of every type, arithmetic, log10, pooling,
  // transposes).
  const bool before = pk::SetAvx2Allowed(false);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{33, 31}, {64, 100}, {7, 5}}) {
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, rows * cols);
    auto y = b.Output("y", DataType::kF32, rows * cols);
    b.Transpose2D(y, x, rows, cols);
    RequireSame(Built(b.Build()), 34);
  }
  for (DataType from : kTypes) {
    for (DataType to : kTypes) {
      pr::ProgramBuilder b;
      auto x = b.Input("x", from, 3001);
      auto y = b.Output("y", to, 3001);
      b.Cast(y, x);
      RequireSame(Built(b.Build()), 31);
    }
  }
  RequireSame(Built(pp::VideoSurveillance({26, 18, 3, 1.0f / 255, DataType::kF16})), 32);
  RequireSame(Built(pp::DbHashJoin({3, 19, 17, DataType::kF32})), 33);
  int64_t worst = 0;
  std::vector<float> xs;
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 104729) {
    xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  for (float special :
       {-1.0f, -0.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    xs.insert(xs.begin() + 13, special);  // inside a vector of ordinary lanes
  }
  pr::ProgramBuilder lb;
  auto lx = lb.Input("x", DataType::kF32, static_cast<int64_t>(xs.size()));
  auto ly = lb.Output("y", DataType::kF32, static_cast<int64_t>(xs.size()));
  lb.Log10(ly, lx);
  auto e = pr::Executor::Compile(Built(lb.Build()));
  REQUIRE(e.ok());
  std::vector<float> base(xs.size()), fast(xs.size());
  const pr::ConstBytes in[] = {{reinterpret_cast<const uint8_t*>(xs.data()), xs.size() * 4}};
  pr::MutableBytes out[] = {{reinterpret_cast<uint8_t*>(base.data()), base.size() * 4}};
  REQUIRE(e->Run(in, out).ok());
  pk::SetAvx2Allowed(before);
  out[0] = {reinterpret_cast<uint8_t*>(fast.data()), fast.size() * 4};
  REQUIRE(e->Run(in, out).ok());
  for (size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, Ulps(base[i], fast[i]));
  CHECK(worst == 0);  // the two builds of log10 agree bit for bit
}
