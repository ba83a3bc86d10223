// The parameter server's frame decoder (libs/aggregation/src/ps/wire.cpp) on arbitrary bytes:
// never crashes, and whatever it accepts re-encodes to the same header bytes with a payload that
// matches the announced length.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ps/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace pai = plexus::aggregation::internal;
  auto frame = pai::DecodeFrame(absl::MakeConstSpan(data, size));
  if (!frame.ok()) return 0;
  if (frame->payload.size() != frame->header.payload_bytes) __builtin_trap();
  if (frame->payload.data() != data + pai::kHeaderBytes) __builtin_trap();
  uint8_t again[pai::kHeaderBytes];
  pai::EncodeHeader(frame->header, again);
  if (std::memcmp(again, data, pai::kHeaderBytes) != 0) __builtin_trap();
  return 0;
}
