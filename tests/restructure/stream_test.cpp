// Programs run a piece at a time: output streams against Executor::Run in random pieces that
// split elements, input streams the same way, programs that cannot stream refused with the
// reason, and restructuring fused with sends and receives over inproc, shm and tcp (a sender
// packs f32 to bf16 as the transport fills its frames, the receiver unpacks and scales as the
// bytes arrive), exact against the two programs run in memory.
#include "plexus/restructure/stream.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "restructure/motion_support.hpp"
#include "transport/conformance_support.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pt = plexus::transport;
using plexus::kernels::DataType;

namespace {

pr::Executor Compiled(absl::StatusOr<pr::Program> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  auto e = pr::Executor::Compile(*p);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return *std::move(e);
}

std::vector<std::vector<uint8_t>> Inputs(const pr::Program& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> in;
  for (const pr::BufferDecl& b : p.buffers) {
    if (b.role != pr::Role::kInput) continue;
    std::vector<uint8_t> v(static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype));
    if (b.dtype == DataType::kF32) {
      std::uniform_real_distribution<float> d(0.01f, 5.0f);
      for (size_t i = 0; i < v.size() / 4; ++i) {
        const float x = d(rng);
        std::memcpy(v.data() + 4 * i, &x, 4);
      }
    } else {
      for (auto& x : v) x = static_cast<uint8_t>(rng() & 0x3f);
    }
    in.push_back(std::move(v));
  }
  return in;
}

std::vector<pr::ConstBytes> Spans(const std::vector<std::vector<uint8_t>>& v) {
  return std::vector<pr::ConstBytes>(v.begin(), v.end());
}

// The program's one output as Run makes it.
std::vector<uint8_t> RunWhole(const pr::Executor& e, const std::vector<std::vector<uint8_t>>& in) {
  size_t bytes = 0;
  for (const pr::BufferDecl& b : e.program().buffers) {
    if (b.role == pr::Role::kOutput) {
      bytes = static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype);
    }
  }
  std::vector<uint8_t> out(bytes);
  const pr::MutableBytes o[1] = {{out.data(), out.size()}};
  REQUIRE(e.Run(Spans(in), o).ok());
  return out;
}

}  // namespace

TEST_CASE("output streams make the output in pieces that split elements", "[restructure][stream]") {
  std::mt19937 rng(3);
  for (const pr::Executor& e :
       {Compiled(pp::SoundDetection({37, 41, 1e-10f, 1.0f, DataType::kF16})),
        Compiled(pp::BrainStimulation({5, 33, 8, 0.5f, DataType::kBF16})),
        Compiled(pp::DbHashJoin({3, 19, 17, DataType::kF32})),
        Compiled(pp::VideoSurveillance({26, 18, 3, 1.0f / 255, DataType::kF16}))}) {
    const auto in = Inputs(e.program(), 5);
    const std::vector<uint8_t> whole = RunWhole(e, in);
    auto s = pr::OutputStream::Create(e, Spans(in));
    INFO(e.Describe());
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE((*s)->bytes() == whole.size());
    std::vector<uint8_t> pieces(whole.size(), 0xAB);
    for (size_t at = 0; at < pieces.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 997, pieces.size() - at);
      REQUIRE((*s)->Produce(at, absl::MakeSpan(pieces.data() + at, n)).ok());
      at += n;
    }
    CHECK(pieces == whole);
    // Any order, too: the last bytes first.
    std::vector<uint8_t> again(whole.size());
    const size_t half = whole.size() / 2 + 1;
    REQUIRE((*s)->Produce(half, absl::MakeSpan(again.data() + half, again.size() - half)).ok());
    REQUIRE((*s)->Produce(0, absl::MakeSpan(again.data(), half)).ok());
    CHECK(again == whole);
    CHECK((*s)->Produce(whole.size(), absl::MakeSpan(again.data(), 1)).code() ==
          absl::StatusCode::kOutOfRange);
  }
}

TEST_CASE("input streams restructure each piece's whole elements", "[restructure][stream]") {
  std::mt19937 rng(4);
  for (const pr::Executor& e :
       {Compiled(pp::SoundDetection({37, 41, 1e-10f, 1.0f, DataType::kF16})),
        Compiled(pp::BrainStimulation({5, 33, 8, 0.5f, DataType::kBF16}))}) {
    const auto in = Inputs(e.program(), 6);
    const std::vector<uint8_t> whole = RunWhole(e, in);
    std::vector<uint8_t> out(whole.size(), 0xCD);
    auto s = pr::InputStream::Create(e, 0, {Spans(in)[1]}, {{out.data(), out.size()}});
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE((*s)->bytes() == in[0].size());
    CHECK((*s)->Finish().code() == absl::StatusCode::kFailedPrecondition);
    for (size_t at = 0; at < in[0].size();) {
      const size_t n = std::min<size_t>(1 + rng() % 501, in[0].size() - at);
      REQUIRE((*s)->Consume(at, absl::MakeConstSpan(in[0].data() + at, n)).ok());
      at += n;
    }
    REQUIRE((*s)->Finish().ok());
    CHECK(out == whole);
    CHECK((*s)->Consume(0, absl::MakeConstSpan(in[0].data(), 1)).code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("programs that cannot stream are refused with the reason", "[restructure][stream]") {
  const pr::Executor pii = Compiled(pp::PiiRedaction({2, 4, 5, 0}));
  const auto in = Inputs(pii.program(), 1);
  auto s = pr::OutputStream::Create(pii, Spans(in));
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.status().message().find("'text'") != std::string::npos);
  const pr::Executor video = Compiled(pp::VideoSurveillance({4, 4, 1, 1.0f, DataType::kF32}));
  std::vector<uint8_t> out(4 * 4);
  auto i = pr::InputStream::Create(video, 0, {}, {{out.data(), out.size()}});
  REQUIRE_FALSE(i.ok());
  CHECK(i.status().message().find("passes") != std::string::npos);
}

// A sender that packs f32 values to bf16 (scaled) as the transport asks for bytes, a receiver
// that unpacks and scales them back as they arrive: the wire carries what a collective with a
// bf16 wire type carries, and no buffer of the message's size exists on either side.
TEST_CASE("restructuring fused with sends and receives over every backend",
          "[restructure][stream]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kShm, pt::Backend::kTcp}) {
    for (int64_t n : {int64_t{1}, int64_t{4099}, int64_t{(1 << 20) + 7}}) {
      const pr::Executor pack = Compiled(plexus::restructure::testing::PackBf16(n));
      const pr::Executor unpack = Compiled(plexus::restructure::testing::UnpackBf16(n));
      const auto in = Inputs(pack.program(), static_cast<uint32_t>(n));
      // The reference: both programs in memory.
      const std::vector<uint8_t> wire = RunWhole(pack, in);
      const std::vector<uint8_t> want = RunWhole(unpack, {wire});

      auto send = pr::OutputStream::Create(pack, Spans(in));
      REQUIRE(send.ok());
      std::vector<uint8_t> got(want.size(), 0xEE);
      auto recv = pr::InputStream::Create(unpack, 0, {}, {{got.data(), got.size()}});
      REQUIRE(recv.ok());
      size_t largest_piece = 0;
      const absl::Status moved = plexus::restructure::testing::MoveProduced(
          backend, (*send)->bytes(),
          [&](size_t off, absl::Span<uint8_t> b) { return (*send)->Produce(off, b); },
          [&](size_t off, absl::Span<const uint8_t> b) { return (*recv)->Consume(off, b); },
          &largest_piece);
      INFO(pt::BackendName(backend) << " n " << n << ": " << moved.ToString());
      REQUIRE(moved.ok());
      INFO(pt::BackendName(backend) << " n " << n);
      REQUIRE((*recv)->Finish().ok());
      CHECK(got == want);
      if (backend != pt::Backend::kInproc && n > (1 << 20)) {
        CHECK(largest_piece < wire.size());  // it came in pieces, not as one staged message
      }
    }
  }
}
