// The caps on bytes held for early messages as the Plexus backends configure their Matcher
// (plexus/transport/matcher.hpp): resolved from DeviceOptions and the environment, and the spare
// buffers a connection keeps.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "plexus/transport/device.hpp"
#include "plexus/transport/matcher.hpp"

namespace plexus::transport::internal {

// Buffers of delivered held messages a connection keeps for reuse, at most (and at most half
// its cap): a fresh allocation per large message costs page faults and zeroing each time
// (a visible share of a 4-rank allreduce's CPU time over tcp; docs/measurements/collectives.md,
// "What made the difference").
inline constexpr size_t kMaxSpareHeldBytes = size_t{64} << 20;
inline size_t SpareBytesFor(size_t connection_cap) {
  return connection_cap / 2 < kMaxSpareHeldBytes ? connection_cap / 2 : kMaxSpareHeldBytes;
}

struct HoldLimits {
  size_t per_connection = kDefaultHeldBytesPerConnection;
  size_t per_device = kDefaultHeldBytesPerDevice;
};
// DeviceOptions::max_held_bytes_per_{connection,device}: a non-zero option beats
// PLEXUS_MAX_HELD_BYTES_PER_{CONNECTION,DEVICE}, which beats the default. InvalidArgument for an
// unparsable variable or a zero cap.
absl::StatusOr<HoldLimits> ResolveHoldLimits(const DeviceOptions& options);

}  // namespace plexus::transport::internal
