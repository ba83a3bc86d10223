// Fuzzes RegionHandle::Decode, which reads handles that peers send through the store or a
// message: no input may crash it, and an accepted handle must round-trip.
#include <cstdint>
#include <cstring>

#include "plexus/transport/memory.hpp"

namespace pt = plexus::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto handle = pt::RegionHandle::Decode(absl::MakeConstSpan(data, size));
  if (handle.ok()) {
    auto again = pt::RegionHandle::Decode(handle->Encode());
    if (!again.ok() || again->id != handle->id || again->length != handle->length) {
      __builtin_trap();
    }
  }
  return 0;
}
