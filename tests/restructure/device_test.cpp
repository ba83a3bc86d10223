// Programs on a CUDA device against the reference interpreter: every cast pair, arithmetic,
// layout ops and pooling at odd shapes and unaligned bases, the five pipelines, and the device
// streams fused with sends and receives over inproc, shm and tcp. Without a device the "[gpu]"
// cases skip (exit 77) with the reason; "[nodevice]" checks what a machine without one sees.
#include "plexus/restructure/device.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/cuda.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "plexus/restructure/stream.hpp"
#include "plexus/transport/types.hpp"
#include "restructure/coverage_cases.hpp"
#include "restructure/motion_support.hpp"
#include "restructure/support.hpp"
#include "support/skip.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pk = plexus::kernels;
namespace pt = plexus::transport;
namespace cuda = plexus::base::cuda;
using pk::DataType;
using plexus::restructure::testing::FirstDifference;
using plexus::restructure::testing::MoveProduced;
using plexus::restructure::testing::RandomInputs;
using plexus::restructure::testing::RunProgram;
using plexus::restructure::testing::Ulps;

namespace {

void RequireDevice() {
  std::string why;
  if (!pr::DeviceAvailable(&why)) plexus::testing::SkipTest(why);
}

pr::Program Built(absl::StatusOr<pr::Program> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

// Device memory holding `bytes` at `offset` bytes past an allocation's start (an unaligned base
// when offset is not a multiple of the element size).
struct OnDevice {
  cuda::DeviceBuffer buffer;
  size_t offset = 0, size = 0;
  uint8_t* data() const { return static_cast<uint8_t*>(buffer.data()) + offset; }
};

OnDevice ToDevice(const std::vector<uint8_t>& bytes, size_t offset) {
  auto b = cuda::DeviceBuffer::Allocate(bytes.size() + offset + 1);
  REQUIRE(b.ok());
  OnDevice d{std::move(*b), offset, bytes.size()};
  REQUIRE(cuda::Copy(d.data(), bytes.data(), bytes.size(), "test input").ok());
  return d;
}

std::vector<uint8_t> FromDevice(const OnDevice& d) {
  std::vector<uint8_t> out(d.size);
  REQUIRE(cuda::Copy(out.data(), d.data(), d.size, "test output").ok());
  return out;
}

// "" when `got` equals `want`, else the first differing byte and the 4 bytes around it of both.
std::string Difference(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  const size_t at = FirstDifference(want, got);
  if (at == want.size() && got.size() == want.size()) return "";
  std::string out = absl::StrCat("first differing byte ", at, " of ", want.size(), ":");
  const size_t from = at / 4 * 4, to = std::min(want.size(), from + 4);
  for (const auto* v : {&want, &got}) {
    out += v == &want ? " reference" : ", device";
    for (size_t i = from; i < to; ++i) out += absl::StrFormat(" %02x", i < v->size() ? (*v)[i] : 0);
  }
  return out;
}

struct Both {
  std::vector<std::vector<uint8_t>> reference, device;
};

// The interpreter (or, with `executor`, the CPU's fast executor, which also computes a power of
// 2 as x * x) on the host and the device executor on device copies of the same inputs, with
// every buffer `offset` bytes past an allocation's start; outputs start as 0xEE bytes on both.
Both RunBoth(const pr::Program& p, uint32_t seed, size_t offset = 0, bool executor = false) {
  const auto inputs = RandomInputs(p, seed);
  Both r;
  REQUIRE(RunProgram(p, inputs, &r.reference, 0xEE, executor).ok());

  std::vector<OnDevice> din, dout;
  std::vector<pr::ConstBytes> dspans_in;
  std::vector<pr::MutableBytes> dspans_out;
  for (const auto& v : inputs) din.push_back(ToDevice(v, offset));
  for (const auto& v : r.reference)
    dout.push_back(ToDevice(std::vector<uint8_t>(v.size(), 0xEE), offset));
  for (const auto& d : din) dspans_in.emplace_back(d.data(), d.size);
  for (const auto& d : dout) dspans_out.emplace_back(d.data(), d.size);
  auto e = pr::DeviceExecutor::Compile(p);
  REQUIRE(e.ok());
  const absl::Status s = e->Run(dspans_in, dspans_out);
  INFO(s.ToString());
  REQUIRE(s.ok());
  for (const auto& d : dout) r.device.push_back(FromDevice(d));
  return r;
}

void RequireSame(const pr::Program& p, uint32_t seed, size_t offset = 0, bool executor = false) {
  const Both b = RunBoth(p, seed, offset, executor);
  for (size_t k = 0; k < b.reference.size(); ++k) {
    INFO("output " << k << ", base offset " << offset);
    CHECK(Difference(b.reference[k], b.device[k]) == "");
  }
}

int64_t WorstDistance(const pr::Program& p, uint32_t seed) {
  const Both b = RunBoth(p, seed);
  int64_t worst = 0;
  size_t k = 0;
  for (const pr::BufferDecl& d : p.buffers) {
    if (d.role != pr::Role::kOutput) continue;
    const size_t size = pk::DataTypeSize(d.dtype);
    for (size_t i = 0; i < b.reference[k].size() / size; ++i) {
      if (size == 4) {
        float r, f;
        std::memcpy(&r, b.reference[k].data() + 4 * i, 4);
        std::memcpy(&f, b.device[k].data() + 4 * i, 4);
        worst = std::max(worst, Ulps(r, f));
      } else {
        uint16_t hr, hf;
        std::memcpy(&hr, b.reference[k].data() + 2 * i, 2);
        std::memcpy(&hf, b.device[k].data() + 2 * i, 2);
        // NaN on both (the sign of an invalid pow's or log10's NaN is the C library's choice)
        const uint16_t inf = d.dtype == DataType::kF16 ? 0x7C00 : 0x7F80;
        if ((hr & 0x7FFF) > inf && (hf & 0x7FFF) > inf) continue;
        worst = std::max<int64_t>(worst, hr > hf ? hr - hf : hf - hr);
      }
    }
    ++k;
  }
  return worst;
}

}  // namespace

TEST_CASE("without a device: programs validate, runs fail with the reason", "[nodevice]") {
  pr::ProgramBuilder b;
  auto x = b.Input("x", DataType::kF32, 8);
  auto y = b.Output("y", DataType::kBF16, 8);
  b.Cast(y, x);
  const pr::Program p = Built(b.Build());
  REQUIRE(pr::DeviceExecutor::Compile(p).ok());
  pr::Program bad = p;
  bad.steps[0].src1.base = 1;  // reads element 8 of 8
  const auto refused = pr::DeviceExecutor::Compile(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("'x'") != std::string::npos);

  auto e = pr::DeviceExecutor::Compile(p);
  std::vector<float> in(8, 1.5f);
  std::vector<uint8_t> out(16);
  const pr::ConstBytes i(reinterpret_cast<const uint8_t*>(in.data()), 32);
  const pr::MutableBytes o(out.data(), out.size());
  const absl::Status s = e->Run({&i, 1}, {&o, 1});
  REQUIRE_FALSE(s.ok());
  std::string why;
  if (!pr::DeviceAvailable(&why)) {
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message().find(why) != std::string::npos);
  } else {
    // A device is here: plain (pageable) host memory is refused, naming the buffer.
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("input 'x'") != std::string::npos);
  }
}

TEST_CASE("device: every op, cast pair and pipeline against the reference, bit for bit", "[gpu]") {
  RequireDevice();
  for (const auto& c : plexus::restructure::testing::CoverageCases()) {
    INFO(c.name);
    RequireSame(Built(c.program), c.seed, c.offset, c.executor_reference);
  }
  // Large enough for the grid to stride (a thread per point up to the launch's limit).
  pr::ProgramBuilder b;
  auto x = b.Input("x", DataType::kF32, 70001);
  auto y = b.Output("y", DataType::kBF16, 70001);
  b.Cast(y, x);
  RequireSame(Built(b.Build()), 70001, 1);
}

TEST_CASE("device: pow and log10 within their bounds", "[gpu]") {
  RequireDevice();
  const int64_t n = 100003;
  pr::ProgramBuilder b;
  auto x = b.Input("x", DataType::kF32, n);
  auto e = b.Input("e", DataType::kF32, n);
  auto p = b.Output("p", DataType::kF32, n);
  auto l = b.Output("l", DataType::kF32, n);
  b.Pow(p, x, e);
  b.Log10(l, x);
  const pr::Program prog = Built(b.Build());
  const Both r = RunBoth(prog, 5);
  int64_t worst_pow = 0, worst_log = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    float a, c;
    std::memcpy(&a, r.reference[0].data() + 4 * i, 4);
    std::memcpy(&c, r.device[0].data() + 4 * i, 4);
    if (std::isfinite(a) || std::isfinite(c)) worst_pow = std::max(worst_pow, Ulps(a, c));
    std::memcpy(&a, r.reference[1].data() + 4 * i, 4);
    std::memcpy(&c, r.device[1].data() + 4 * i, 4);
    worst_log = std::max(worst_log, Ulps(a, c));
  }
  INFO("pow worst " << worst_pow << " ulp, log10 worst " << worst_log << " ulp");
  CHECK(worst_pow <= pr::kDevicePowMaxUlp);
  CHECK(worst_log <= pr::kDeviceLog10MaxUlp);
}

TEST_CASE("device: sound detection's log10 within its bound", "[gpu]") {
  RequireDevice();
  // Then a division: twice the bound in f32, one step in 16-bit types.
  CHECK(WorstDistance(Built(pp::SoundDetection({81, 77, 1e-10f, 1.0f, DataType::kF16})), 9) <= 1);
  CHECK(WorstDistance(Built(pp::SoundDetection({64, 96, 1e-10f, 2.0f, DataType::kF32})), 10) <=
        2 * pr::kDeviceLog10MaxUlp);
}

// A device buffer restructured on its way out (DeviceOutputStream: the kernels write the staging
// memory the transport sends from) and a host-side unpack as it arrives; then the reverse, a
// host-side pack into a DeviceInputStream whose program writes device memory. Exact against the
// two programs run by the interpreter.
TEST_CASE("device streams fused with sends and receives over every backend", "[gpu]") {
  RequireDevice();
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kShm, pt::Backend::kTcp}) {
    for (int64_t n : {int64_t{1}, int64_t{4099}, int64_t{(1 << 20) + 7}}) {
      INFO(pt::BackendName(backend) << " n " << n);
      const pr::Program pack = Built(plexus::restructure::testing::PackBf16(n));
      const pr::Program unpack = Built(plexus::restructure::testing::UnpackBf16(n));
      const auto in = RandomInputs(pack, static_cast<uint32_t>(n));
      std::vector<uint8_t> wire(static_cast<size_t>(n) * 2), want(static_cast<size_t>(n) * 4);
      const pr::ConstBytes in0(in[0].data(), in[0].size());
      const pr::MutableBytes wire_span(wire.data(), wire.size());
      REQUIRE(pr::Interpret(pack, {&in0, 1}, {&wire_span, 1}).ok());
      const pr::ConstBytes wire_in(wire.data(), wire.size());
      const pr::MutableBytes want_span(want.data(), want.size());
      REQUIRE(pr::Interpret(unpack, {&wire_in, 1}, {&want_span, 1}).ok());

      // Device -> wire -> host.
      {
        auto dpack = pr::DeviceExecutor::Compile(pack);
        REQUIRE(dpack.ok());
        auto hunpack = pr::Executor::Compile(unpack);
        REQUIRE(hunpack.ok());
        const OnDevice dx = ToDevice(in[0], 0);
        auto send = pr::DeviceOutputStream::Create(*dpack, {pr::ConstBytes(dx.data(), dx.size)});
        INFO(send.status().ToString());
        REQUIRE(send.ok());
        std::vector<uint8_t> got(want.size(), 0xEE);
        auto recv = pr::InputStream::Create(*hunpack, 0, {}, {{got.data(), got.size()}});
        REQUIRE(recv.ok());
        const absl::Status moved = MoveProduced(
            backend, (*send)->bytes(),
            [&](size_t off, absl::Span<uint8_t> b) { return (*send)->Produce(off, b); },
            [&](size_t off, absl::Span<const uint8_t> b) { return (*recv)->Consume(off, b); });
        INFO(moved.ToString());
        REQUIRE(moved.ok());
        REQUIRE((*recv)->Finish().ok());
        CHECK(Difference(want, got) == "");
      }
      // Host -> wire -> device.
      {
        auto hpack = pr::Executor::Compile(pack);
        REQUIRE(hpack.ok());
        auto dunpack = pr::DeviceExecutor::Compile(unpack);
        REQUIRE(dunpack.ok());
        auto send = pr::OutputStream::Create(*hpack, {in0});
        REQUIRE(send.ok());
        OnDevice dy = ToDevice(std::vector<uint8_t>(want.size(), 0xEE), 0);
        auto recv = pr::DeviceInputStream::Create(*dunpack, 0, {}, {{dy.data(), dy.size}});
        REQUIRE(recv.ok());
        const absl::Status moved = MoveProduced(
            backend, (*send)->bytes(),
            [&](size_t off, absl::Span<uint8_t> b) { return (*send)->Produce(off, b); },
            [&](size_t off, absl::Span<const uint8_t> b) { return (*recv)->Consume(off, b); });
        INFO(moved.ToString());
        REQUIRE(moved.ok());
        const absl::Status finished = (*recv)->Finish();
        INFO(finished.ToString());
        REQUIRE(finished.ok());
        CHECK(Difference(want, FromDevice(dy)) == "");
      }
    }
  }
}
