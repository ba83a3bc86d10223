// Basic vocabulary of the transport layer: backends and buffer views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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

// Produced sends and consumed receives (Connection::PostSendProduced, PostRecvConsumed): the
// message's bytes are made or taken by a callback while the transport moves them, instead of
// sitting whole in a caller buffer. The contract is written at those declarations.
//
// Fills `out` with bytes [offset, offset + out.size()) of the message being sent.
using Producer = absl::AnyInvocable<absl::Status(size_t offset, absl::Span<uint8_t> out)>;
// Takes bytes [offset, offset + in.size()) of the message being received; `in` is valid only
// during the call.
using Consumer = absl::AnyInvocable<absl::Status(size_t offset, absl::Span<const uint8_t> in)>;
// No Producer or Consumer call covers more bytes than this: what a backend stages for one is
// cache-sized and does not grow with the message.
inline constexpr size_t kMaxProduceConsumeBytes = size_t{256} << 10;

}  // namespace plexus::transport
