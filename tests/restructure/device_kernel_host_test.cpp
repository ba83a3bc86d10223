// The device kernel's source (src/cuda/restructure.cu) compiled for the host and run one thread
// at a time over a small grid (so its grid-stride loop strides): the step parameters the device
// executor builds, the kernel's indexing, conversions, saturation, pooling and unaligned paths,
// checked against the interpreter on every machine, GPU or not. CUDA's own math (powf, log10f),
// memory and launches are not exercised here; restructure_device_gpu_test does that on a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
struct HostDim {
  unsigned x = 0;
};
}  // namespace

// What the kernel source reads of CUDA, as the host provides it.
#define __global__
#define __device__
#define __host__
static HostDim blockIdx, threadIdx, blockDim, gridDim;
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int2float_rn(int v) { return static_cast<float>(v); }
using std::isnan;

#include "bind.hpp"
#include "cuda/restructure.cu"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "restructure/support.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pk = plexus::kernels;
using pk::DataType;
using plexus::restructure::testing::RandomInputs;
using plexus::restructure::testing::Ulps;

namespace {

pr::Program Built(absl::StatusOr<pr::Program> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

// Buffers `offset` bytes into allocations of their own (an unaligned base when offset is not a
// multiple of the element size).
struct Placed {
  std::vector<uint8_t> storage;
  size_t offset = 0, size = 0;
  uint8_t* data() { return storage.data() + offset; }
};

Placed Place(const std::vector<uint8_t>& bytes, size_t offset) {
  Placed p{std::vector<uint8_t>(bytes.size() + offset + 1, 0xAB), offset, bytes.size()};
  std::memcpy(p.data(), bytes.data(), bytes.size());
  return p;
}

// The program run by the kernel source on the host as the device executor launches it (single
// steps and fused groups), every launch 3 blocks of 7 threads; the outputs (started as 0xEE).
std::vector<std::vector<uint8_t>> RunKernel(const pr::Program& p,
                                            const std::vector<std::vector<uint8_t>>& inputs,
                                            size_t offset) {
  std::vector<Placed> in, out;
  std::vector<pr::ConstBytes> ins;
  std::vector<pr::MutableBytes> outs;
  for (const auto& v : inputs) in.push_back(Place(v, offset));
  for (const pr::BufferDecl& b : p.buffers) {
    if (b.role != pr::Role::kOutput) continue;
    out.push_back(
        Place(std::vector<uint8_t>(static_cast<size_t>(b.count) * pk::DataTypeSize(b.dtype), 0xEE),
              offset));
  }
  for (auto& x : in) ins.emplace_back(x.data(), x.size);
  for (auto& x : out) outs.emplace_back(x.data(), x.size);
  pr::internal::BoundBuffers bound;
  REQUIRE(pr::internal::BindBuffers(p, ins, outs, &bound).ok());
  gridDim.x = 3;
  blockDim.x = 7;
  auto launch = [](auto&& kernel) {
    for (unsigned b = 0; b < gridDim.x; ++b) {
      for (unsigned t = 0; t < blockDim.x; ++t) {
        blockIdx.x = b;
        threadIdx.x = t;
        kernel();
      }
    }
  };
  // The device executor's plan: single steps and fused groups.
  for (const pr::internal::DeviceLaunch& l : pr::internal::PlanDevice(p)) {
    if (l.steps.size() > 1) {
      const pr::internal::DeviceFusedParams f = pr::internal::FusedParams(l, bound.bufs);
      launch([&] { plexus_restructure_fused(f); });
      continue;
    }
    const pr::Step& st = p.steps[l.steps[0]];
    const pr::internal::DeviceStepParams params = pr::internal::StepParams(st, bound.bufs);
    uint8_t* dst = bound.bufs[st.dst.buffer].write;
    const uint8_t* src1 = bound.bufs[st.src1.buffer].read;
    const uint8_t* src2 =
        st.src2_kind == pr::Operand2::kBuffer ? bound.bufs[st.src2.buffer].read : nullptr;
    launch([&] { plexus_restructure_step(params, dst, src1, src2); });
  }
  std::vector<std::vector<uint8_t>> result;
  for (auto& x : out) result.emplace_back(x.data(), x.data() + x.size);
  return result;
}

// The reference: the interpreter, or (`executor`) the CPU executor, whose power of 2 is x * x
// as the kernel's.
std::vector<std::vector<uint8_t>> Reference(const pr::Program& p,
                                            const std::vector<std::vector<uint8_t>>& inputs,
                                            bool executor) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<pr::MutableBytes> outs;
  for (const pr::BufferDecl& b : p.buffers) {
    if (b.role == pr::Role::kOutput) {
      out.emplace_back(static_cast<size_t>(b.count) * pk::DataTypeSize(b.dtype), 0xEE);
    }
  }
  for (auto& v : out) outs.emplace_back(v.data(), v.size());
  const std::vector<pr::ConstBytes> ins(inputs.begin(), inputs.end());
  if (executor) {
    auto e = pr::Executor::Compile(p);
    REQUIRE(e.ok());
    REQUIRE(e->Run(ins, outs).ok());
  } else {
    REQUIRE(pr::Interpret(p, ins, outs).ok());
  }
  return out;
}

void RequireSame(const pr::Program& p, uint32_t seed, size_t offset = 0, bool executor = false) {
  const auto inputs = RandomInputs(p, seed);
  const auto want = Reference(p, inputs, executor);
  const auto got = RunKernel(p, inputs, offset);
  for (size_t k = 0; k < want.size(); ++k) {
    size_t first = want[k].size();
    for (size_t i = 0; i < want[k].size(); ++i) {
      if (want[k][i] != got[k][i]) {
        first = i;
        break;
      }
    }
    INFO("output " << k << " first differing byte " << first << " of " << want[k].size()
                   << ", base offset " << offset);
    CHECK(first == want[k].size());
  }
}

constexpr DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16,
                               DataType::kI32, DataType::kI8,  DataType::kU8};

}  // namespace

TEST_CASE("device kernel on the host: every cast pair at odd sizes and unaligned bases",
          "[restructure][device]") {
  for (DataType from : kTypes) {
    for (DataType to : kTypes) {
      for (int64_t n : {1, 7, 1025}) {
        pr::ProgramBuilder b;
        auto x = b.Input("x", from, n);
        auto y = b.Output("y", to, n);
        b.Cast(y, x);
        INFO(pk::DataTypeName(from) << " -> " << pk::DataTypeName(to) << " n " << n);
        RequireSame(Built(b.Build()), static_cast<uint32_t>(n), 0);
        RequireSame(Built(b.Build()), static_cast<uint32_t>(n) + 1, 1);
      }
    }
  }
}

TEST_CASE("device kernel on the host: arithmetic, layout and pooling", "[restructure][device]") {
  for (DataType t : kTypes) {
    INFO(pk::DataTypeName(t));
    {
      pr::ProgramBuilder b;
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
      RequireSame(Built(b.Build()), 3, 0, true);
      RequireSame(Built(b.Build()), 4, 3, true);
    }
    {
      pr::ProgramBuilder b;
      auto x = b.Input("x", t, 37 * 53);
      auto y = b.Output("y", t, 37 * 53);
      b.Transpose2D(y, x, 37, 53);
      RequireSame(Built(b.Build()), 7);
      RequireSame(Built(b.Build()), 8, 1);
    }
    {
      pr::ProgramBuilder b;
      auto p0 = b.Input("p0", t, 33 * 17);
      auto p1 = b.Input("p1", t, 33 * 17);
      auto y = b.Output("y", t, 2 * 33 * 17);
      b.Concat2D(y, {p0, p1}, 33);
      RequireSame(Built(b.Build()), 9, 1);
    }
    {
      pr::ProgramBuilder b;
      pr::Pool2D shape;
      shape.height = 13;
      shape.width = 11;
      shape.channels = 3;
      auto x = b.Input("x", t, 13 * 11 * 3);
      auto y = b.Output("y", t, shape.out_h() * shape.out_w() * 3);
      b.MaxPool2D(y, x, shape);
      RequireSame(Built(b.Build()), 10);
      RequireSame(Built(b.Build()), 11, 1);
    }
  }
}

TEST_CASE("device kernel on the host: the five pipelines", "[restructure][device]") {
  RequireSame(Built(pp::VideoSurveillance({96, 54, 3, 1.0f / 255, DataType::kF16})), 1);
  RequireSame(Built(pp::VideoSurveillance({13, 7, 2, 0.37f, DataType::kBF16})), 2, 1);
  RequireSame(Built(pp::PiiRedaction({4, 33, 17, 0})), 3);
  RequireSame(Built(pp::PiiRedaction({3, 33, 17, 1})), 4, 1);
  RequireSame(Built(pp::DbHashJoin({4, 31, 17, DataType::kF32})), 5);
  RequireSame(Built(pp::DbHashJoin({3, 31, 17, DataType::kI8})), 6, 2);
  RequireSame(Built(pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kBF16})), 7, 0, true);
  RequireSame(Built(pp::BrainStimulation({9, 33, 8, 0.5f, DataType::kF32})), 8, 0, true);
  // Sound runs log10: the host's log10f here, within one step of a 16-bit output.
  const pr::Program sound = Built(pp::SoundDetection({81, 77, 1e-10f, 1.0f, DataType::kF16}));
  const auto inputs = RandomInputs(sound, 9);
  const auto want = Reference(sound, inputs, false);
  const auto got = RunKernel(sound, inputs, 0);
  int64_t worst = 0;
  for (size_t i = 0; i < want[0].size() / 2; ++i) {
    uint16_t a, c;
    std::memcpy(&a, want[0].data() + 2 * i, 2);
    std::memcpy(&c, got[0].data() + 2 * i, 2);
    worst = std::max<int64_t>(worst, a > c ? a - c : c - a);
  }
  CHECK(worst <= 1);
  (void)Ulps;
}

TEST_CASE("device kernel on the host: fused values pass through their intermediate types",
          "[restructure][device]") {
  // A result forwarded in a register is what a later step would have loaded: rounded to the type
  // it was stored as (f16, bf16; integers saturated).
  for (DataType mid : kTypes) {
    pr::ProgramBuilder b;
    const int64_t n = 1001;
    auto x = b.Input("x", DataType::kF32, n);
    auto m = b.Scratch("m", mid, n);
    auto y = b.Output("y", DataType::kF32, n);
    b.Mul(m, x, 0.37f);
    b.Add(y, m, 1.0f);
    const pr::Program p = Built(b.Build());
    INFO(pk::DataTypeName(mid));
    REQUIRE(pr::internal::PlanDevice(p).size() == 1);  // one fused kernel
    RequireSame(p, 13);
  }
}

TEST_CASE("device plan: element-wise runs fuse, other steps launch alone",
          "[restructure][device]") {
  auto launches = [](const pr::Program& p) {
    std::vector<size_t> sizes;
    for (const auto& l : pr::internal::PlanDevice(p)) sizes.push_back(l.steps.size());
    return sizes;
  };
  // Sound: pow, add, mul, div, log10, cast: one fused kernel, only the output stored.
  const pr::Program sound = Built(pp::SoundDetection({8, 16, 1e-10f, 1.0f, DataType::kF16}));
  CHECK(launches(sound) == std::vector<size_t>{6});
  const auto plan = pr::internal::PlanDevice(sound);
  CHECK(plan[0].store == std::vector<int32_t>{0, 0, 0, 0, 0, 1});
  CHECK(plan[0].forward1 == std::vector<int32_t>{-1, 0, 1, 2, 3, 4});
  // Brain: pow, div, mul, cast in one. Video: mul, then the pooling, then the cast, alone.
  CHECK(launches(Built(pp::BrainStimulation({4, 8, 2, 0.5f, DataType::kBF16}))) ==
        std::vector<size_t>{4});
  CHECK(launches(Built(pp::VideoSurveillance({8, 6, 3, 1.0f / 255, DataType::kF16}))) ==
        std::vector<size_t>{1, 1, 1});
  // A step reading a buffer the run wrote through another access ends the run there.
  pr::ProgramBuilder b;
  auto x = b.Input("x", DataType::kF32, 8);
  auto s = b.Scratch("s", DataType::kF32, 8);
  auto y = b.Output("y", DataType::kF32, 8);
  b.Mul(s, x, 2.0f);
  b.Step(pr::Op::kAdd, {8}, pr::ProgramBuilder::At(y, 0, {1}), pr::ProgramBuilder::At(s, 7, {-1}),
         1.0f);
  CHECK(launches(Built(b.Build())) == std::vector<size_t>{1, 1});
  RequireSame(Built(b.Build()), 12);
}
