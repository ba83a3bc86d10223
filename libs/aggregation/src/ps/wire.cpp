#include "wire.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::aggregation::internal {
namespace {

template <typename T>
void Put(uint8_t*& p, T v) {
  base::StoreLittleEndian(p, v);
  p += sizeof(T);
}
template <typename T>
T Get(const uint8_t*& p) {
  const T v = base::LoadLittleEndian<T>(p);
  p += sizeof(T);
  return v;
}

// Self-contained (the fuzzer compiles this file alone): the wire types and their sizes.
bool WireType(uint8_t dtype) {
  using collectives::DataType;
  return dtype == static_cast<uint8_t>(DataType::kF32) ||
         dtype == static_cast<uint8_t>(DataType::kBF16) ||
         dtype == static_cast<uint8_t>(DataType::kF16);
}

}  // namespace

std::string FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kHelloAck:
      return "hello-ack";
    case FrameType::kInit:
      return "init";
    case FrameType::kInitAck:
      return "init-ack";
    case FrameType::kPush:
      return "push";
    case FrameType::kPull:
      return "pull";
    case FrameType::kValues:
      return "values";
    case FrameType::kError:
      return "error";
  }
  return absl::StrCat("type ", static_cast<int>(type));
}

void EncodeHeader(const FrameHeader& h, uint8_t* out) {
  uint8_t* p = out;
  Put<uint32_t>(p, kFrameMagic);
  Put<uint8_t>(p, kFrameVersion);
  Put<uint8_t>(p, static_cast<uint8_t>(h.type));
  Put<uint8_t>(p, static_cast<uint8_t>(h.dtype));
  Put<uint8_t>(p, h.code);
  Put<uint32_t>(p, h.ns);
  Put<uint32_t>(p, h.worker);
  Put<uint64_t>(p, h.nonce);
  Put<uint64_t>(p, h.key);
  Put<uint32_t>(p, h.chunk);
  Put<uint32_t>(p, h.payload_bytes);
  Put<uint64_t>(p, h.round);
}

absl::StatusOr<FrameView> DecodeFrame(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("aggregation frame of ", bytes.size(),
                                                   " bytes is shorter than its ", kHeaderBytes,
                                                   "-byte header"));
  }
  const uint8_t* p = bytes.data();
  if (Get<uint32_t>(p) != kFrameMagic) {
    return absl::InvalidArgumentError("aggregation frame: bad magic (not a parameter-server peer)");
  }
  if (const uint8_t v = Get<uint8_t>(p); v != kFrameVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregation frame: version ", v, ", this build speaks ", kFrameVersion));
  }
  FrameView f;
  FrameHeader& h = f.header;
  const uint8_t type = Get<uint8_t>(p);
  if (type < 1 || type > 8) {
    return absl::InvalidArgumentError(absl::StrCat("aggregation frame: unknown type ", type));
  }
  h.type = static_cast<FrameType>(type);
  const uint8_t dtype = Get<uint8_t>(p);
  if (!WireType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregation frame: dtype ", dtype, " is not f32, bf16 or f16"));
  }
  h.dtype = static_cast<collectives::DataType>(dtype);
  h.code = Get<uint8_t>(p);
  h.ns = Get<uint32_t>(p);
  h.worker = Get<uint32_t>(p);
  h.nonce = Get<uint64_t>(p);
  h.key = Get<uint64_t>(p);
  h.chunk = Get<uint32_t>(p);
  h.payload_bytes = Get<uint32_t>(p);
  h.round = Get<uint64_t>(p);
  if (h.payload_bytes != bytes.size() - kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregation ", FrameTypeName(h.type), " frame announces ", h.payload_bytes,
                     " payload bytes but carries ", bytes.size() - kHeaderBytes));
  }
  f.payload = bytes.subspan(kHeaderBytes);
  const size_t esize = h.dtype == collectives::DataType::kF32 ? 4 : 2;
  const size_t n = f.payload.size();
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregation ", FrameTypeName(h.type), " frame of key ", h.key, " chunk ",
                     h.chunk, ": ", std::string(why), " (payload ", n, " bytes)"));
  };
  switch (h.type) {
    case FrameType::kHello:
    case FrameType::kHelloAck:
      if (n != 8) return bad("payload must be 8 bytes");
      break;
    case FrameType::kInitAck:
    case FrameType::kPull:
      if (n != 0) return bad("payload must be empty");
      break;
    case FrameType::kInit:
      if (n <= kInitPrefixBytes || (n - kInitPrefixBytes) % esize != 0) {
        return bad("payload must be the 16-byte prefix and whole elements");
      }
      break;
    case FrameType::kPush:
    case FrameType::kValues:
      if (n == 0 || n % esize != 0) return bad("payload must be whole elements, at least one");
      break;
    case FrameType::kError:
      if (n > kMaxErrorBytes) return bad("error message too long");
      break;
  }
  return f;
}

}  // namespace plexus::aggregation::internal
