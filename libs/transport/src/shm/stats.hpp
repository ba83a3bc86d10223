// Introspection of shm connections for tests and diagnostics (not part of the public API).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "plexus/transport/connection.hpp"

namespace plexus::transport::internal::shm {

struct ConnectionStats {
  bool peer_can_pull = false;       // this side's bulk sends and writes use cross-memory attach
  uint64_t cma_bytes_sent = 0;      // bytes the peer pulled from this side
  uint64_t cma_bytes_received = 0;  // bytes this side pulled from the peer
  uint64_t ring_bytes_sent = 0;     // payload bytes this side streamed through its ring
  uint64_t ring_bytes_received = 0;
  // Messages this side copied into held memory because no receive was posted for them (and
  // they could not wait in the ring).
  uint64_t held_messages = 0;
};

// InvalidArgument when `connection` is not an shm connection.
absl::StatusOr<ConnectionStats> GetConnectionStats(const Connection& connection);

}  // namespace plexus::transport::internal::shm
