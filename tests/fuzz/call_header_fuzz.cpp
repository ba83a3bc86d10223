// Fuzzes the collectives' call header decoder (libs/collectives/src/wire.cpp): the first message
// of every call on a connection starts with it, from a peer that may be another build, another
// program or hostile. No input may crash Decode or Describe; whatever decodes must encode and
// decode again to the same fields (the configuration epoch included).
#include <cstdint>
#include <cstring>

#include "wire.hpp"

namespace pi = plexus::collectives::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = pi::CallHeader::Decode(absl::MakeConstSpan(data, size));
  if (!decoded.ok()) return 0;
  (void)decoded->Describe();
  uint8_t again[pi::CallHeader::kEncodedSize];
  decoded->Encode(again);
  auto back = pi::CallHeader::Decode(absl::MakeConstSpan(again, sizeof again));
  if (!back.ok() || !back->SameCall(*decoded) || back->sender != decoded->sender ||
      back->extra != decoded->extra || back->epoch != decoded->epoch) {
    __builtin_trap();
  }
  // Every field the decoder accepted sits where the encoder puts it.
  if (std::memcmp(again, data, 10) != 0 || std::memcmp(again + 12, data + 12, 8) != 0 ||
      std::memcmp(again + 24, data + 24, 40) != 0) {
    __builtin_trap();
  }
  return 0;
}
