// The client side: a Channel is a connection to a Server over a transport Device (inproc, shm,
// tcp, verbs), or one connection to each replica of a service with a balancing engine choosing
// among them. It redials a connection that died. Generated stubs call it; use it directly only
// for untyped calls.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/rpc/call.hpp"
#include "plexus/rpc/policy.hpp"
#include "plexus/rpc/schema.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpc {

struct ChannelOptions {
  // Calls in flight on the connection; a further call waits for a slot (within its deadline), so
  // a slow server bounds the client's memory. 0: PLEXUS_RPC_WINDOW (default 64).
  size_t max_in_flight = 0;
  // Largest response accepted (each posted receive is this big). 0: PLEXUS_RPC_MAX_MESSAGE_BYTES
  // (default 4 MiB).
  size_t max_message_bytes = 0;
  absl::Duration connect_timeout = absl::Seconds(10);
  // The thread polling a connection (the channel's, or a blocking caller) spins on its queue
  // instead of sleeping when idle: lower latency for a busy CPU. false: it spins up to 50 us (20
  // us when a device thread moves the bytes, ProgressMode::kThread) before it sleeps, and only
  // while that pays (base::AdaptiveSpin).
  bool poll = false;
  int max_depth = 32;  // nesting of a response's messages
  // Redial a connection that died (server restart, peer death) in the background, after
  // `reconnect_backoff`, doubling up to `max_reconnect_backoff` while dials fail. Calls
  // outstanding on the connection when it died fail with Unavailable and are never re-sent (the
  // channel cannot know whether the server ran them; retrying is the caller's decision). A call
  // started while its replica is not connected fails at once with Unavailable, unless it sets
  // CallOptions::wait_for_ready. false: a dead connection stays dead (calls fail with Unavailable).
  bool reconnect = true;
  // With `reconnect`: a call of a method the .proto marks idempotent (`option idempotency_level
  // = IDEMPOTENT` or NO_SIDE_EFFECTS) that fails with Unavailable (its connection died, or no
  // replica was connected) is started again once a replica is connected, within its deadline,
  // at most `max_attempts` times in all; other methods are never retried.
  bool retry_idempotent = true;
  int max_attempts = 5;
  absl::Duration reconnect_backoff = absl::Milliseconds(100);
  absl::Duration max_reconnect_backoff = absl::Seconds(5);
  // ConnectReplicas: the balancing engine attached as "balance" right after "frontend"
  // (LoadBalancePolicy in plexus/rpc/policies.hpp): "round_robin", "random", "po2" or "daronpon";
  // "" attaches none (the channel then rotates over the connected replicas).
  std::string balance = "daronpon";
  // Ask the server for its load (piggybacked on responses, CallInfo::replica_load, and gossiped,
  // Policy::OnLoadReport) also with one replica; ConnectReplicas over several always does.
  bool load_reports = false;
};

class Channel {
 public:
  using RawCallback = absl::AnyInvocable<void(RawResult)>;

  // Connects to a Server's address and runs the handshake for `services` (every service this
  // channel will call): FailedPrecondition naming the service and both schema hashes when the
  // server's schema differs, NotFound when it does not serve one of them.
  static absl::StatusOr<std::shared_ptr<Channel>> Connect(std::shared_ptr<transport::Device> device,
                                                          std::string_view address,
                                                          std::vector<const ServiceDesc*> services,
                                                          ChannelOptions options = {});
  // One connection per replica of the same service(s), each with its own window; every call
  // goes to one replica, chosen by the chain's balancing engine (options.balance). A replica
  // that refuses the handshake fails the whole connect (the error names it); an unreachable one is
  // dialled again in the background and avoided until then (Unavailable when none is reachable).
  static absl::StatusOr<std::shared_ptr<Channel>> ConnectReplicas(
      std::shared_ptr<transport::Device> device, std::vector<std::string> addresses,
      std::vector<const ServiceDesc*> services, ChannelOptions options = {});
  // Fails the calls still outstanding with Cancelled and closes the connections.
  ~Channel();

  // Starts an untyped call (generated stubs wrap it in their typed forms); `done` (may be empty)
  // runs on the channel's thread when it completes. Waits while the window is full. The request
  // must stay valid until the call completes.
  RawCall StartCall(const ServiceDesc& service, const MethodDesc& method, const void* request,
                    const CallOptions& options, RawCallback done);

  // Policies of this connection.
  EngineChain& engines();
  // OK while some replica is connected; otherwise why the (last) connection is down.
  absl::Status status() const;
  // The address, or the replicas' addresses joined by ','.
  std::string peer() const;
  struct ReplicaInfo {
    std::string address;
    absl::Status status;       // OK while connected
    size_t in_flight = 0;      // calls on its connection
    uint64_t connections = 0;  // successful dials (1 + reconnects)
  };
  std::vector<ReplicaInfo> Replicas() const;
  // The client QoS reorder point this channel shares with the other channels of its transport
  // Device (a "qos" engine in a chain sends the calls through it; docs/rpc_engines.md,
  // "Global QoS").
  QosStats qos() const;
  void Close();

  struct Impl;

 private:
  explicit Channel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::rpc
