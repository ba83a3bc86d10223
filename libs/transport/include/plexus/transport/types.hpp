// Basic vocabulary of the transport layer: backends and buffer views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace plexus::transport {

// A transport implementation. Every backend honours the same contract (docs/architecture.md).
enum class Backend : uint8_t {
  kInproc = 0,  // threads of one process
  kShm = 1,     // processes on one host: shared-memory rings, cross-memory attach for bulk
  kTcp = 2,     // sockets, any host
  kVerbs = 3,   // RDMA reliable-connected queue pairs (libibverbs / librdmacm)
};

std::string_view BackendName(Backend backend);
// Parses "inproc", "shm", "tcp" or "verbs".
absl::StatusOr<Backend> ParseBackend(std::string_view name);

// A read-only view of bytes to send. The bytes must stay valid until the operation completes.
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};

// A writable view of bytes to receive into. Must stay valid until the operation completes.
struct MutableBuffer {
  void* data = nullptr;
  size_t size = 0;
};

}  // namespace plexus::transport
