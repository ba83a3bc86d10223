// Codegen round trips for every supported field kind, and malformed messages -> errors naming the
// field (the frame and message decoders of libs/rpc/src).
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "codec.hpp"
#include "frame.hpp"
#include "kinds.plexus.hpp"

namespace pr = plexus::rpc;
namespace pi = plexus::rpc::internal;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Color;
using plexus::rpctest::Inner;

namespace {

// Flattens a frame into an 8-aligned buffer, as the transport delivers it.
struct Wire {
  std::vector<uint64_t> storage;
  size_t size = 0;
  absl::Span<const uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t*>(storage.data()), size};
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(storage.data()); }
};

Wire Flatten(const pi::OutFrame& f) {
  Wire w;
  w.storage.resize(f.bytes / 8 + 1);
  for (const auto& p : f.parts) {
    if (p.size) std::memcpy(w.data() + w.size, p.data, p.size);
    w.size += p.size;
  }
  REQUIRE(w.size == f.bytes);
  return w;
}

Wire Encode(const pr::MessageDesc& desc, const void* msg, pr::Metadata md = {}) {
  pi::EncodedMessage enc;
  REQUIRE(pi::EncodeMessage(desc, msg, &enc).ok());
  pi::OutFrame f;
  pi::FrameHeader h;
  h.call_id = 42;
  h.service_id = 7;
  h.method_id = 1;
  pi::BuildFrame(h, "", md, &enc, &f);
  return Flatten(f);
}

absl::StatusOr<const AllKinds*> Decode(const Wire& w, pi::Arena& arena,
                                       pi::CodecLimits limits = {}) {
  auto frame = pi::ParseFrame(w.bytes());
  if (!frame.ok()) return frame.status();
  auto m =
      pi::DecodeMessage(AllKinds::Descriptor(), frame->structure, frame->segments, arena, limits);
  if (!m.ok()) return m.status();
  return static_cast<const AllKinds*>(*m);
}

}  // namespace

TEST_CASE("every field kind survives a round trip", "[rpc][codec]") {
  Inner child_a{"a", 1, {}, nullptr};
  Inner child_b{"bee", 2, {}, nullptr};
  std::vector<Inner> children{child_a, child_b};
  Inner next{"next", 9, {}, nullptr};
  Inner inner{"inner", 5, pr::Repeated<Inner>(children.data(), children.size()), &next};
  std::vector<int32_t> ints{1, -2, 300000};
  std::vector<double> doubles{0.5, -1e300};
  bool flags[] = {true, false, true};
  std::vector<Color> colors{Color::RED, Color::BLUE};
  std::vector<std::string_view> names{"x", "", "zed"};
  std::string blob1 = "\x01\x02", blob2(1000, 'q');
  std::vector<pr::Bytes> blobs{pr::AsBytes(blob1), pr::AsBytes(blob2)};
  std::string big_text(5000, 't');
  AllKinds::Nested nested;
  nested.mode = AllKinds::Nested::Mode::MODE_ON;

  AllKinds m;
  m.b = true;
  m.i32 = -7;
  m.s32 = -8;
  m.u32 = 4000000000u;
  m.f32 = 12;
  m.i64 = -(int64_t{1} << 40);
  m.u64 = ~uint64_t{0};
  m.sf64 = -3;
  m.f = 1.5f;
  m.d = 2.25;
  m.color = Color::GREEN;
  m.text = big_text;
  m.blob = pr::AsBytes(blob1);
  m.ints = pr::Repeated<int32_t>(ints.data(), ints.size());
  m.doubles = pr::Repeated<double>(doubles.data(), doubles.size());
  m.flags = pr::Repeated<bool>(flags, 3);
  m.colors = pr::Repeated<Color>(colors.data(), colors.size());
  m.names = pr::Repeated<std::string_view>(names.data(), names.size());
  m.blobs = pr::Repeated<pr::Bytes>(blobs.data(), blobs.size());
  m.inner = &inner;
  m.inners = pr::Repeated<Inner>(children.data(), children.size());
  m.maybe_int = 0;  // set, to zero: presence survives
  m.nested = &nested;

  Wire w = Encode(AllKinds::Descriptor(), &m, {{"k", "v"}, {"trace", "abc"}});
  pi::Arena arena;
  auto got = Decode(w, arena);
  REQUIRE(got.ok());
  const AllKinds& r = **got;
  CHECK(r.b);
  CHECK(r.i32 == -7);
  CHECK(r.s32 == -8);
  CHECK(r.u32 == 4000000000u);
  CHECK(r.f32 == 12);
  CHECK(r.i64 == -(int64_t{1} << 40));
  CHECK(r.u64 == ~uint64_t{0});
  CHECK(r.sf64 == -3);
  CHECK(r.f == 1.5f);
  CHECK(r.d == 2.25);
  CHECK(r.color == Color::GREEN);
  CHECK(r.text == big_text);
  CHECK(std::string(reinterpret_cast<const char*>(r.blob.data()), r.blob.size()) == blob1);
  CHECK(std::vector<int32_t>(r.ints.begin(), r.ints.end()) == ints);
  CHECK(std::vector<double>(r.doubles.begin(), r.doubles.end()) == doubles);
  REQUIRE(r.flags.size() == 3);
  CHECK((r.flags[0] && !r.flags[1] && r.flags[2]));
  CHECK(std::vector<Color>(r.colors.begin(), r.colors.end()) == colors);
  REQUIRE(r.names.size() == 3);
  CHECK(r.names[0] == "x");
  CHECK(r.names[1] == "");
  CHECK(r.names[2] == "zed");
  REQUIRE(r.blobs.size() == 2);
  CHECK(r.blobs[1].size() == 1000);
  CHECK(r.blobs[1][999] == 'q');
  REQUIRE(r.inner != nullptr);
  CHECK(r.inner->name == "inner");
  CHECK(r.inner->id == 5);
  REQUIRE(r.inner->children.size() == 2);
  CHECK(r.inner->children[1].name == "bee");
  REQUIRE(r.inner->next != nullptr);
  CHECK(r.inner->next->id == 9);
  CHECK(r.inners.size() == 2);
  CHECK(r.maybe_int.has);
  CHECK(r.maybe_int.value == 0);
  CHECK_FALSE(r.maybe_text.has);
  REQUIRE(r.nested != nullptr);
  CHECK(r.nested->mode == AllKinds::Nested::Mode::MODE_ON);
  // Zero copy on receive: the big string is a view into the frame buffer.
  const uint8_t* begin = w.bytes().data();
  CHECK(reinterpret_cast<const uint8_t*>(r.text.data()) >= begin);
  CHECK(reinterpret_cast<const uint8_t*>(r.text.data()) < begin + w.size);
  // Metadata and header fields.
  auto frame = pi::ParseFrame(w.bytes());
  REQUIRE(frame.ok());
  CHECK(frame->header.call_id == 42);
  REQUIRE(frame->metadata.size() == 2);
  CHECK(frame->metadata[1].first == "trace");
  CHECK(frame->metadata[1].second == "abc");
}

TEST_CASE("an empty message and defaults round trip", "[rpc][codec]") {
  AllKinds m;
  Wire w = Encode(AllKinds::Descriptor(), &m);
  pi::Arena arena;
  auto got = Decode(w, arena);
  REQUIRE(got.ok());
  CHECK((*got)->text.empty());
  CHECK((*got)->inner == nullptr);
  CHECK((*got)->ints.empty());
  CHECK_FALSE((*got)->maybe_int.has);
}

TEST_CASE("the builder owns what it is given", "[rpc][codec]") {
  AllKinds::Builder b;
  b.set_text(std::string("hello")).set_ints({4, 5}).set_names({"p", "q"}).set_i32(3);
  {
    Inner tmp{"tmp", 1, {}, nullptr};
    b.set_inner(tmp);
  }
  Wire w = Encode(AllKinds::Descriptor(), &b.message());
  pi::Arena arena;
  auto got = Decode(w, arena);
  REQUIRE(got.ok());
  CHECK((*got)->text == "hello");
  CHECK((*got)->ints.size() == 2);
  CHECK((*got)->names[1] == "q");
  CHECK((*got)->inner->name == "tmp");
}

namespace {
// Structure offset of the first byte of field `color` in a default AllKinds (2-byte field count,
// then b(1) i32 s32 u32 f32 (4 each) i64 u64 sf64 (8 each) f(4) d(8)).
constexpr size_t kColorOffset = 2 + 1 + 4 * 4 + 3 * 8 + 4 + 8;

void Patch(Wire& w, size_t structure_offset, const void* bytes, size_t n) {
  auto frame = pi::ParseFrame(w.bytes());
  REQUIRE(frame.ok());
  const size_t at = static_cast<size_t>(frame->structure.data() - w.bytes().data());
  std::memcpy(w.data() + at + structure_offset, bytes, n);
}
}  // namespace

TEST_CASE("malformed messages fail with the field's name", "[rpc][codec]") {
  pi::Arena arena;
  SECTION("enum value out of range") {
    AllKinds m;
    Wire w = Encode(AllKinds::Descriptor(), &m);
    int32_t bad = 3;
    Patch(w, kColorOffset, &bad, 4);
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(got.status().message()) ==
          "malformed message: field plexus.rpctest.AllKinds.color holds 3, not a value of enum "
          "plexus.rpctest.Color");
  }
  SECTION("bool not 0 or 1") {
    AllKinds m;
    Wire w = Encode(AllKinds::Descriptor(), &m);
    uint8_t bad = 2;
    Patch(w, 2, &bad, 1);
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message()) ==
          "malformed message: field plexus.rpctest.AllKinds.b is a bool holding 2");
  }
  SECTION("repeated enum element out of range") {
    std::vector<Color> colors{Color::RED, static_cast<Color>(99)};
    AllKinds m;
    m.colors = pr::Repeated<Color>(colors.data(), colors.size());
    Wire w = Encode(AllKinds::Descriptor(), &m);
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message()) ==
          "malformed message: field plexus.rpctest.AllKinds.colors[1] holds 99, not a value of "
          "enum plexus.rpctest.Color");
  }
  SECTION("string length disagrees with its segment") {
    AllKinds m;
    m.text = "hello";
    Wire w = Encode(AllKinds::Descriptor(), &m);
    uint32_t bad = 4;
    Patch(w, kColorOffset + 4, &bad, 4);
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message()) ==
          "malformed message: field plexus.rpctest.AllKinds.text says 4 bytes but its data "
          "segment 1 has 5");
  }
  SECTION("nesting deeper than the limit") {
    std::vector<Inner> chain(10);
    for (size_t i = 0; i + 1 < chain.size(); ++i) chain[i].next = &chain[i + 1];
    AllKinds m;
    m.inner = &chain[0];
    Wire w = Encode(AllKinds::Descriptor(), &m);
    pi::CodecLimits limits;
    limits.max_depth = 4;
    auto got = Decode(w, arena, limits);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message()) ==
          "malformed message: field plexus.rpctest.AllKinds.inner.next.next.next.next nests "
          "deeper than 4 levels");
  }
  SECTION("truncated frame") {
    AllKinds m;
    m.text = "hello";
    Wire w = Encode(AllKinds::Descriptor(), &m);
    w.size -= 1;
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message()).find("malformed rpc frame: segment 1: 5 bytes") !=
          std::string::npos);
  }
  SECTION("repeated message count larger than the structure can hold") {
    AllKinds m;
    Wire w = Encode(AllKinds::Descriptor(), &m);
    // inners' count sits after ... ints(4) doubles(4) flags(4) colors(4) names(4) blobs(4)
    // inner presence(1): text(4) and blob(4) first.
    const size_t inners = kColorOffset + 4 + 4 + 4 + 6 * 4 + 1;
    uint32_t huge = 1u << 30;
    Patch(w, inners, &huge, 4);
    auto got = Decode(w, arena);
    REQUIRE_FALSE(got.ok());
    CHECK(std::string(got.status().message())
              .find("field plexus.rpctest.AllKinds.inners count 1073741824 exceeds") !=
          std::string::npos);
  }
}

TEST_CASE("frame header checks", "[rpc][frame]") {
  pi::OutFrame f;
  pi::FrameHeader h;
  pi::BuildFrame(h, "", {}, nullptr, &f);
  Wire w = Flatten(f);
  SECTION("valid") { CHECK(pi::ParseFrame(w.bytes()).ok()); }
  SECTION("bad magic") {
    w.data()[0] = 'X';
    CHECK(std::string(pi::ParseFrame(w.bytes()).status().message()) ==
          "malformed rpc frame: magic: not a plexus rpc frame");
  }
  SECTION("status code beyond gRPC's") {
    uint32_t code = 17;
    std::memcpy(w.data() + 24, &code, 4);
    CHECK(std::string(pi::ParseFrame(w.bytes()).status().message()) ==
          "malformed rpc frame: status code: 17 is not a gRPC code");
  }
  SECTION("segment count over the limit") {
    uint32_t n = 1u << 20;
    std::memcpy(w.data() + 40, &n, 4);
    CHECK(std::string(pi::ParseFrame(w.bytes()).status().message()) ==
          "malformed rpc frame: segment count: 1048576 over the limit of 65536");
  }
}
