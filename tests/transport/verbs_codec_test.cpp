// The verbs backend's pieces that need no peer: the slot table, the wire encodings (chunk
// headers, the handshake hello, addresses, immediates) and the run-time probe. The protocol
// engines over a simulated queue pair are in verbs_protocol_test.cpp.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "plexus/transport/device.hpp"
#include "verbs/protocol.hpp"
#include "verbs/slot_table.hpp"

namespace plexus::transport::verbs {
namespace {

// ---- Slot table -------------------------------------------------------------------------------

TEST_CASE("slot table maps handles to entries and rejects stale ones", "[verbs]") {
  SlotTable<std::string> table(4);
  const uint32_t a = *table.Insert("a");
  const uint32_t b = *table.Insert("b");
  CHECK(a != 0);
  CHECK(b != 0);
  CHECK(a != b);
  REQUIRE(table.Find(a) != nullptr);
  CHECK(*table.Find(a) == "a");
  CHECK(*table.Take(b) == "b");
  CHECK(table.Find(b) == nullptr);
  CHECK_FALSE(table.Take(b).has_value());
  // The freed slot is reused with a new generation: the old handle stays dead.
  const uint32_t c = *table.Insert("c");
  CHECK((c & SlotTable<std::string>::kIndexMask) == (b & SlotTable<std::string>::kIndexMask));
  CHECK(c != b);
  CHECK(table.Find(b) == nullptr);
  CHECK(*table.Find(c) == "c");
  CHECK(table.size() == 2);
  CHECK(table.Find(0) == nullptr);
  CHECK(table.Find(0xFFFFFFFFu) == nullptr);
}

TEST_CASE("slot table enforces its capacity and survives generation wrap-around", "[verbs]") {
  SlotTable<int> table(2);
  REQUIRE(table.Insert(1).has_value());
  REQUIRE(table.Insert(2).has_value());
  CHECK_FALSE(table.Insert(3).has_value());

  SlotTable<int> one(1);
  uint32_t previous = *one.Insert(0);
  for (int i = 1; i < 10000; ++i) {  // more reuses than there are generations
    REQUIRE(one.Take(previous).has_value());
    const uint32_t next = *one.Insert(i);
    REQUIRE(next != 0);
    REQUIRE(next != previous);
    REQUIRE(one.Find(previous) == nullptr);
    previous = next;
  }
  int visited = 0;
  one.ForEach([&](uint32_t handle, int& value) {
    CHECK(handle == previous);
    CHECK(value == 9999);
    ++visited;
  });
  CHECK(visited == 1);
}

// ---- Encodings --------------------------------------------------------------------------------

TEST_CASE("chunk headers round-trip and malformed ones are rejected", "[verbs]") {
  ChunkHeader h;
  h.type = ChunkType::kData;
  h.flags = kFirstChunk | kLastChunk;
  h.credits = 7;
  h.total_bytes = (uint64_t{1} << 33) + 5;
  uint8_t buf[kChunkHeaderBytes];
  EncodeChunkHeader(h, buf);
  absl::StatusOr<ChunkHeader> back = DecodeChunkHeader(buf);
  REQUIRE(back.ok());
  CHECK(back->type == ChunkType::kData);
  CHECK(back->flags == (kFirstChunk | kLastChunk));
  CHECK(back->credits == 7);
  CHECK(back->total_bytes == h.total_bytes);

  CHECK(DecodeChunkHeader(absl::MakeConstSpan(buf, kChunkHeaderBytes - 1)).status().code() ==
        absl::StatusCode::kDataLoss);
  uint8_t bad[kChunkHeaderBytes];
  std::memcpy(bad, buf, sizeof bad);
  bad[0] ^= 0xFF;
  CHECK_FALSE(DecodeChunkHeader(bad).ok());
  std::memcpy(bad, buf, sizeof bad);
  bad[1] = 9;  // unknown type
  CHECK_FALSE(DecodeChunkHeader(bad).ok());
  std::memcpy(bad, buf, sizeof bad);
  bad[2] = 0x80;  // unknown flag
  CHECK_FALSE(DecodeChunkHeader(bad).ok());
  std::memcpy(bad, buf, sizeof bad);
  bad[3] = 1;  // reserved
  CHECK_FALSE(DecodeChunkHeader(bad).ok());

  ChunkHeader credit;
  credit.type = ChunkType::kCredit;
  credit.credits = 3;
  EncodeChunkHeader(credit, buf);
  REQUIRE(DecodeChunkHeader(buf).ok());
  credit.total_bytes = 1;  // a credit chunk never describes a message
  EncodeChunkHeader(credit, buf);
  CHECK_FALSE(DecodeChunkHeader(buf).ok());
}

TEST_CASE("the handshake hello round-trips, tolerates CM padding, rejects the rest", "[verbs]") {
  const std::array<uint8_t, kHelloBytes> bytes = EncodeHello({32, 32768});
  absl::StatusOr<Hello> hello = DecodeHello(bytes);
  REQUIRE(hello.ok());
  CHECK(hello->recv_slots == 32);
  CHECK(hello->slot_bytes == 32768);

  std::vector<uint8_t> padded(bytes.begin(), bytes.end());
  padded.resize(56, 0);  // InfiniBand CM pads REQ/REP private data
  CHECK(DecodeHello(padded).ok());

  CHECK_FALSE(DecodeHello(absl::MakeConstSpan(bytes.data(), kHelloBytes - 1)).ok());
  std::array<uint8_t, kHelloBytes> bad = bytes;
  bad[0] ^= 1;
  CHECK_FALSE(DecodeHello(bad).ok());
  bad = bytes;
  bad[4] = 99;  // version
  CHECK_FALSE(DecodeHello(bad).ok());
  CHECK_FALSE(DecodeHello(EncodeHello({3, 4096})).ok());  // too few slots
  CHECK_FALSE(DecodeHello(EncodeHello({kMaxSlots + 1, 4096})).ok());
  CHECK_FALSE(DecodeHello(EncodeHello({4, 8})).ok());  // slot smaller than a header
  CHECK_FALSE(DecodeHello(EncodeHello({4, kMaxSlotBytes + 1})).ok());
}

TEST_CASE("addresses parse as ip:port and [ipv6]:port", "[verbs]") {
  absl::StatusOr<HostPort> v4 = ParseHostPort("10.1.2.3:7000");
  REQUIRE(v4.ok());
  CHECK(v4->host == "10.1.2.3");
  CHECK(v4->port == 7000);
  absl::StatusOr<HostPort> v6 = ParseHostPort("[fe80::1]:0");
  REQUIRE(v6.ok());
  CHECK(v6->host == "fe80::1");
  CHECK(v6->port == 0);
  CHECK(FormatHostPort("fe80::1", 5) == "[fe80::1]:5");
  CHECK(FormatHostPort("10.0.0.1", 5) == "10.0.0.1:5");
  for (const char* bad : {"", "10.0.0.1", "10.0.0.1:", ":80", "10.0.0.1:65536", "10.0.0.1:8x",
                          "fe80::1:80", "[fe80::1]80", "[fe80::1", "10.0.0.1:-1"}) {
    INFO(bad);
    absl::StatusOr<HostPort> parsed = ParseHostPort(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("immediates travel big-endian", "[verbs]") {
  const uint32_t wire = ImmediateToWire(0x01020304u);
  uint8_t bytes[4];
  std::memcpy(bytes, &wire, 4);
  CHECK(bytes[0] == 1);
  CHECK(bytes[3] == 4);
  CHECK(ImmediateFromWire(wire) == 0x01020304u);
}

// ---- The run-time probe -------------------------------------------------------------------------

TEST_CASE("Available and Create agree, and the reason is printed when verbs is absent", "[verbs]") {
  std::string why;
  const bool available = Device::Available(Backend::kVerbs, &why);
  DeviceOptions options;
  options.backend = Backend::kVerbs;
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Create(options);
  if (available) {
    // A device exists: Create may still fail for a reason it states, never silently.
    if (!device.ok()) CHECK_FALSE(device.status().message().empty());
    if (device.ok()) CHECK((*device)->backend() == Backend::kVerbs);
  } else {
    std::printf("verbs unavailable here: %s\n", why.c_str());
    CHECK_FALSE(why.empty());
    REQUIRE_FALSE(device.ok());
    CHECK(device.status().code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(device.status().message()) == why);
  }
}

}  // namespace
}  // namespace plexus::transport::verbs
