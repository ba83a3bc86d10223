// The server side of the parameter server (PHub/PBox): a Service owns `cores` threads, each with
// its own listener, completion queue and chunks. A chunk is summed over every worker on the one
// core that owns it (tall aggregation: no locks on the data path), optimized there as soon as
// the last gradient arrives, and the new values go straight back to every worker (pull
// elision). Several jobs share a service through namespaces, each with its own nonce.
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
#include "plexus/aggregation/optimizer.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::aggregation {

struct ServiceOptions {
  transport::Backend backend = transport::Backend::kTcp;
  // One listen address per core (tcp "ip:port", "" = 127.0.0.1 on a free port; shm a name, ""
  // = a fresh one); empty = `cores` free addresses.
  std::vector<std::string> listen_addresses;
  int cores = 1;
  // Bytes of merge buffers, weights, optimizer state and send buffers all namespaces may
  // allocate; Init beyond it is refused (ResourceExhausted).
  size_t memory_budget_bytes = size_t{1} << 30;
  // A round that started (first gradient of a chunk arrived) and misses a worker's gradient for
  // this long fails, naming the workers it waited for.
  absl::Duration round_timeout = absl::Seconds(30);
  // Largest NamespaceOptions::chunk_bytes a namespace may use (at most 4 MiB); each connection
  // keeps 8 receive buffers of this size (plus 64 bytes).
  size_t max_chunk_bytes = size_t{256} << 10;
  // The transport's per-operation timeout: a silent peer's connection fails after it.
  absl::Duration op_timeout = absl::Seconds(30);
  // The tcp backend's settings (loopback congestion control, sockets per connection).
  transport::TcpOptions tcp = {};
};

struct NamespaceOptions {
  std::string name;  // for messages
  int workers = 1;
  UpdateRule optimizer;
  size_t chunk_bytes = kDefaultChunkBytes;
  StorePolicy store_policy = StorePolicy::kAuto;
};

// What a job's workers need to join its namespace (hand it to them out of band: a launcher's
// environment, a store).
struct NamespaceInfo {
  uint32_t id = 0;
  uint64_t nonce = 0;  // random; a frame with another nonce is refused
};

class Service {
 public:
  static absl::StatusOr<std::unique_ptr<Service>> Create(const ServiceOptions& options);
  virtual ~Service() = default;

  // Addresses workers connect to, one per core (Client::Connect takes them all).
  virtual std::vector<std::string> addresses() const = 0;
  virtual absl::StatusOr<NamespaceInfo> CreateNamespace(const NamespaceOptions& options) = 0;
  // Bytes allocated so far against the memory budget.
  virtual size_t memory_used() const = 0;
  // Stops the cores and closes every connection (workers see their operations fail).
  virtual void Shutdown() = 0;
};

}  // namespace plexus::aggregation
