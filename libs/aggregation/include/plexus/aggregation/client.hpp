// The worker side of the parameter server, in the spirit of ps-lite's KVWorker and BytePS:
// per-key Init, Push, Pull and the fused PushPull, synchronous or asynchronous with a handle.
// Keys are cut into chunks (NamespaceOptions::chunk_bytes) and the chunks spread over the
// connections by LPT in Init order, so that every worker computes the same mapping: every worker
// must Init the same keys, with the same sizes and types, in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/aggregation/mapping.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/collectives/types.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::aggregation {

struct ClientOptions {
  transport::Backend backend = transport::Backend::kTcp;
  std::vector<std::string> addresses;  // Service::addresses()
  NamespaceInfo ns;
  int worker = 0;  // this worker's rank in [0, NamespaceOptions::workers)
  // Connections to the service; connection q goes to addresses[q % addresses.size()]. 0 = one
  // per address.
  int connections = 0;
  size_t chunk_bytes = kDefaultChunkBytes;  // must equal the namespace's
  // Bound on every wait: Connect, Init, and a handle's Wait without its own timeout.
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration op_timeout = absl::Seconds(30);
  // The tcp backend's settings (loopback congestion control, sockets per connection).
  transport::TcpOptions tcp = {};
};

class Client {
 public:
  // An operation in flight; Wait() on it once.
  using Handle = uint64_t;

  // Connects to every address and authenticates (namespace id and nonce) on each connection.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // Declares `key` with its element type (f32, bf16 or f16) and size; the first worker's values
  // become the initial weights (the server keeps f32 master weights). Blocks until the server
  // has allocated the key's chunks.
  virtual absl::Status Init(uint64_t key, collectives::DataType dtype, const void* values,
                            size_t elements) = 0;

  // Sends this worker's gradient for the key's next round; `grad` must stay valid until the
  // handle is waited for. The new values come back without a pull request (pull elision).
  virtual absl::StatusOr<Handle> PushAsync(uint64_t key, const void* grad, size_t elements) = 0;
  // The key's values: those of the last Push (waiting for its round to end) or, without one, the
  // server's current values. `out` must stay valid until the handle is waited for.
  virtual absl::StatusOr<Handle> PullAsync(uint64_t key, void* out, size_t elements) = 0;
  // Push, then the new values into `out` once every worker has pushed and the optimizer ran.
  virtual absl::StatusOr<Handle> PushPullAsync(uint64_t key, const void* grad, void* out,
                                               size_t elements) = 0;
  // Waits for a handle: the operation's status (an error names the key, chunk and cause, e.g.
  // the worker the round waited for). InfiniteDuration() = ClientOptions::timeout. After a
  // DeadlineExceeded, a send still queued may read `grad` until it completes or the client is
  // destroyed; replies that arrive late are dropped.
  virtual absl::Status Wait(Handle handle, absl::Duration timeout = absl::InfiniteDuration()) = 0;

  absl::Status Push(uint64_t key, const void* grad, size_t elements);
  absl::Status Pull(uint64_t key, void* out, size_t elements);
  absl::Status PushPull(uint64_t key, const void* grad, void* out, size_t elements);

  virtual int worker() const = 0;
};

}  // namespace plexus::aggregation
