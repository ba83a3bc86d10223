// The shm frame decoder: round trips and the rejection of every malformed field.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "shm/frame.hpp"

namespace shm = plexus::transport::internal::shm;

namespace {

shm::FrameLimits Limits() { return shm::FrameLimits{size_t{1} << 20, size_t{1} << 30}; }

std::vector<uint8_t> Encode(const shm::FrameHeader& h) {
  std::vector<uint8_t> out(shm::kFrameHeaderBytes);
  shm::EncodeFrameHeader(h, out.data());
  return out;
}

absl::Status Decode(const shm::FrameHeader& h) {
  return shm::DecodeFrameHeader(Encode(h), Limits()).status();
}

shm::FrameHeader Message(uint64_t total, uint32_t payload) {
  shm::FrameHeader h;
  h.type = shm::FrameType::kMessage;
  h.total_bytes = total;
  h.payload_bytes = payload;
  return h;
}

shm::FrameHeader Write(uint64_t total, uint64_t offset, uint32_t payload) {
  shm::FrameHeader h;
  h.type = shm::FrameType::kWriteImm;
  h.total_bytes = total;
  h.offset = offset;
  h.payload_bytes = payload;
  h.region_id = 99;
  h.remote_offset = 4096;
  h.immediate = 0xfeed;
  return h;
}

}  // namespace

TEST_CASE("shm frame headers round-trip", "[shm]") {
  const shm::FrameHeader w = Write(1 << 20, 65536, 4096);
  auto back = shm::DecodeFrameHeader(Encode(w), Limits());
  REQUIRE(back.ok());
  CHECK(back->type == shm::FrameType::kWriteImm);
  CHECK(back->total_bytes == w.total_bytes);
  CHECK(back->offset == w.offset);
  CHECK(back->payload_bytes == w.payload_bytes);
  CHECK(back->region_id == 99);
  CHECK(back->remote_offset == 4096);
  CHECK(back->immediate == 0xfeed);
  CHECK(shm::DecodeFrameHeader(Encode(Message(0, 0)), Limits()).ok());
  CHECK(shm::FrameFootprint(1) == shm::kFrameHeaderBytes + 8);
  CHECK(shm::FrameFootprint(16) == shm::kFrameHeaderBytes + 16);
}

TEST_CASE("shm frame decoder rejects malformed headers", "[shm]") {
  std::vector<uint8_t> bytes = Encode(Message(10, 10));
  SECTION("truncated") {
    auto s = shm::DecodeFrameHeader(absl::MakeConstSpan(bytes.data(), 20), Limits()).status();
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(s.message()).find("truncated") != std::string::npos);
  }
  SECTION("bad magic") {
    bytes[0] ^= 0x55;
    CHECK_FALSE(shm::DecodeFrameHeader(bytes, Limits()).ok());
  }
  SECTION("unknown type") {
    for (uint8_t t : {0, 8, 200}) {
      bytes[2] = t;
      auto s = shm::DecodeFrameHeader(bytes, Limits()).status();
      CHECK(std::string(s.message()).find("unknown frame type") != std::string::npos);
    }
  }
  SECTION("unknown flags and reserved bits") {
    bytes[3] = 0x80;
    CHECK_FALSE(shm::DecodeFrameHeader(bytes, Limits()).ok());
    bytes = Encode(Message(10, 10));
    bytes[47] = 1;
    CHECK_FALSE(shm::DecodeFrameHeader(bytes, Limits()).ok());
  }
  SECTION("lengths over the limits") {
    CHECK_FALSE(Decode(Message((1 << 20) + 1, (1 << 20) + 1)).ok());  // payload over ring limit
    CHECK_FALSE(Decode(Message(uint64_t{1} << 31, 16)).ok());         // over max_message_bytes
    CHECK_FALSE(Decode(Message(10, 11)).ok());                        // payload over total
  }
  SECTION("message parts") {
    shm::FrameHeader h = Message(100, 10);
    h.offset = 5;
    CHECK_FALSE(Decode(h).ok());  // a first frame starts at 0
    h.type = shm::FrameType::kMessagePart;
    h.offset = 95;
    CHECK_FALSE(Decode(h).ok());  // 95 + 10 > 100
    h.offset = 90;
    CHECK(Decode(h).ok());
    h.offset = 0;
    CHECK_FALSE(Decode(h).ok());  // a part continues a message
    h = Message(10, 10);
    h.region_id = 3;
    CHECK_FALSE(Decode(h).ok());
  }
  SECTION("writes") {
    CHECK(Decode(Write(100, 90, 10)).ok());
    CHECK_FALSE(Decode(Write(100, 91, 10)).ok());
    CHECK_FALSE(Decode(Write(100, ~uint64_t{0}, 10)).ok());  // offset overflow
    shm::FrameHeader h = Write(100, 0, 10);
    h.region_id = 0;
    CHECK_FALSE(Decode(h).ok());
    h = Write(100, 0, 10);
    h.remote_offset = ~uint64_t{0} - 50;
    CHECK_FALSE(Decode(h).ok());  // range wraps
    h = Write(100, 0, 10);
    h.type = shm::FrameType::kWrite;
    CHECK_FALSE(Decode(h).ok());  // immediate in a plain write
  }
  SECTION("close") {
    shm::FrameHeader h;
    h.type = shm::FrameType::kClose;
    h.payload_bytes = 12;
    h.flags = shm::kFlagError;
    CHECK(Decode(h).ok());
    h.payload_bytes = shm::kMaxCloseReasonBytes + 1;
    CHECK_FALSE(Decode(h).ok());
    h.payload_bytes = 0;
    h.total_bytes = 1;
    CHECK_FALSE(Decode(h).ok());
  }
  SECTION("cross-memory frames") {
    shm::FrameHeader h;
    h.type = shm::FrameType::kMessageCma;
    h.total_bytes = 300;
    h.payload_bytes = 2 * shm::kCmaSegmentBytes;
    REQUIRE(Decode(h).ok());
    h.payload_bytes = 17;
    CHECK_FALSE(Decode(h).ok());
    h.payload_bytes = 0;
    CHECK_FALSE(Decode(h).ok());
    h.payload_bytes = (shm::kMaxCmaSegments + 1) * shm::kCmaSegmentBytes;
    CHECK_FALSE(Decode(h).ok());
    h.type = shm::FrameType::kWriteCma;
    h.payload_bytes = shm::kCmaSegmentBytes;
    h.region_id = 5;
    h.immediate = 3;
    CHECK_FALSE(Decode(h).ok());  // immediate without its flag
    h.flags = shm::kFlagImmediate;
    CHECK(Decode(h).ok());
  }
}

TEST_CASE("shm cross-memory segment lists are validated", "[shm]") {
  shm::FrameHeader h;
  h.type = shm::FrameType::kMessageCma;
  h.total_bytes = 300;
  const shm::CmaSegment segs[2] = {{0x1000, 100}, {0x9000, 200}};
  std::vector<uint8_t> payload(2 * shm::kCmaSegmentBytes);
  shm::EncodeCmaSegments(segs, payload.data());
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  auto back = shm::DecodeCmaSegments(payload, h);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[1].address == 0x9000);
  CHECK((*back)[1].length == 200);

  h.total_bytes = 299;
  CHECK_FALSE(shm::DecodeCmaSegments(payload, h).ok());  // more than announced
  h.total_bytes = 301;
  CHECK_FALSE(shm::DecodeCmaSegments(payload, h).ok());  // less than announced
  h.total_bytes = 300;
  CHECK_FALSE(shm::DecodeCmaSegments(absl::MakeConstSpan(payload.data(), 16), h).ok());
  const shm::CmaSegment wrap[1] = {{~uint64_t{0} - 10, 300}};
  shm::EncodeCmaSegments(wrap, payload.data());
  h.payload_bytes = shm::kCmaSegmentBytes;
  CHECK_FALSE(shm::DecodeCmaSegments(absl::MakeConstSpan(payload.data(), 16), h).ok());
}
