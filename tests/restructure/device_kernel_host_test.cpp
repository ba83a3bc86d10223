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
#include "restructure/coverage_cases.hpp"
#include "restructure/support.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pk = plexus::kernels;
using pk::DataType;
using plexus::restructure::testing::FirstDifference;
using plexus::restructure::testing::RandomInputs;
using plexus::restructure::testing::RunProgram;
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

void RequireSame(const pr::Program& p, uint32_t seed, size_t offset = 0, bool executor = false) {
  const auto inputs = RandomInputs(p, seed);
  std::vector<std::vector<uint8_t>> want;
  REQUIRE(RunProgram(p, inputs, &want, 0xEE, executor).ok());
  const auto got = RunKernel(p, inputs, offset);
  for (size_t k = 0; k < want.size(); ++k) {
    const size_t first = FirstDifference(want[k], got[k]);
    INFO("output " << k << " first differing byte " << first << " of " << want[k].size()
                   << ", base offset " << offset);
    CHECK(first == want[k].size());
  }
}

constexpr DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16,
                               DataType::kI32, DataType::kI8,  DataType::kU8};

}  // namespace

TEST_CASE("device kernel on the host: every op, cast pair and pipeline, bit for bit",
          "[restructure][device]") {
  for (const auto& c : plexus::restructure::testing::CoverageCases()) {
    INFO(c.name);
    RequireSame(Built(c.program), c.seed, c.offset, c.executor_reference);
  }
}

TEST_CASE("device kernel on the host: sound detection's log10", "[restructure][device]") {
  // Sound runs log10: the host's log10f here, within one step of a 16-bit output.
  const pr::Program sound = Built(pp::SoundDetection({81, 77, 1e-10f, 1.0f, DataType::kF16}));
  const auto inputs = RandomInputs(sound, 9);
  std::vector<std::vector<uint8_t>> want;
  REQUIRE(RunProgram(sound, inputs, &want).ok());
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
