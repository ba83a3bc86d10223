// The server side: a Server accepts connections on a transport Device and dispatches calls to
// registered services (generated `Foo::Service` subclasses).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/rpc/call.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policy.hpp"
#include "plexus/rpc/schema.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpc {

class ServerContext {
 public:
  virtual ~ServerContext() = default;
  virtual const MetadataView& metadata() const = 0;
  // InfiniteFuture when the client set none.
  virtual absl::Time deadline() const = 0;
  // The client cancelled the call, or the server is shutting down (its response will be dropped).
  virtual bool IsCancelled() const = 0;
  // Metadata sent back with the response.
  virtual void AddResponseMetadata(std::string key, std::string value) = 0;
  // Memory (uninitialized) that lives until the response is sent: back the response's views with it
  // (or with the request's views, which live as long).
  virtual void* Allocate(size_t bytes, size_t align = alignof(std::max_align_t)) = 0;
  std::string_view CopyString(std::string_view s);
  virtual std::string peer() const = 0;
};

class ServiceBase;

namespace internal {
class ServerCallState;
// A generated service's synchronous handler of one method, run for `call`; its status finishes it.
using SyncHandler = absl::Status (*)(ServiceBase* service, ServerCallState& call);

class ServerCallState {
 public:
  virtual ~ServerCallState() = default;
  virtual const void* request() const = 0;
  virtual void* response() = 0;
  virtual ServerContext& context() = 0;
  // Sends the response (status OK) or the error; once, from any thread.
  virtual void Finish(absl::Status status) = 0;
  // Runs `handler` and finishes the call with its status: on a handler thread
  // (ServerOptions::handler_threads), or at once on this thread for a method registered as never
  // blocking (Server::Register).
  virtual void RunSync(ServiceBase* service, SyncHandler handler) = 0;
};
struct ServerCallAccess;
}  // namespace internal

// One call as a handler sees it; copies share the call. Finish() exactly once.
template <typename Req, typename Resp>
class ServerCall {
 public:
  explicit ServerCall(std::shared_ptr<internal::ServerCallState> s) : s_(std::move(s)) {}
  const Req& request() const { return *static_cast<const Req*>(s_->request()); }
  Resp* response() { return static_cast<Resp*>(s_->response()); }
  ServerContext& context() { return s_->context(); }
  void Finish(absl::Status status) { s_->Finish(std::move(status)); }

 private:
  friend struct internal::ServerCallAccess;
  std::shared_ptr<internal::ServerCallState> s_;
};

namespace internal {
// What generated services reach of a ServerCall.
struct ServerCallAccess {
  template <typename Req, typename Resp>
  static ServerCallState& state(ServerCall<Req, Resp>& call) {
    return *call.s_;
  }
};
}  // namespace internal

class ServiceBase {
 public:
  virtual ~ServiceBase() = default;
  virtual const ServiceDesc& descriptor() const = 0;
  // Runs the handler of `method_id` (checked to be in range) for a decoded request.
  virtual void Dispatch(uint32_t method_id, std::shared_ptr<internal::ServerCallState> call) = 0;
};

struct ServerOptions {
  std::string address;  // "" picks a free one (tcp: an ephemeral port)
  // Requests being handled per connection; later ones wait in the transport (bounded by its held
  // bytes, then the client blocks). 0: PLEXUS_RPC_WINDOW (default 64).
  size_t max_in_flight_per_connection = 0;
  // Largest request accepted. 0: PLEXUS_RPC_MAX_MESSAGE_BYTES (default 4 MiB).
  size_t max_message_bytes = 0;
  int max_depth = 32;
  // Clients balancing across replicas (Channel::ConnectReplicas) learn this server's load (its
  // calls being handled, all connections together) from every response, and from a gossip
  // message sent when the load crosses a power of two (GossipTrigger, plexus/rpc/balance.hpp)
  // at or above this floor.
  uint32_t load_gossip_floor = 4;
  // Connections served at once. A client beyond it is refused in the handshake: its Connect
  // fails with ResourceExhausted naming this limit, and the server logs the refusal. 0: none.
  size_t max_connections = 1024;
  // A connection with no call in flight (none being handled or answered) and no request for this
  // long is closed, with a log line. InfiniteDuration: never.
  absl::Duration idle_timeout = absl::Minutes(5);
  // A new connection must send its handshake, and a message the server is ready to receive must
  // arrive whole (tcp: from its first byte), within this long; else the connection is closed,
  // with a log line. InfiniteDuration: never.
  absl::Duration frame_timeout = absl::Seconds(30);
  // Threads that run synchronous handlers (the generated `Method(ctx, req, resp)` form), so that a
  // handler that blocks holds up only its own call, not the dispatcher thread that serves every
  // connection. Started as calls need them, up to this many. A call waits for a free thread in one
  // FIFO queue, all connections together, that is bounded: beyond `handler_queue` calls waiting, a
  // call is refused at once with ResourceExhausted naming its method and these options. A call
  // whose deadline passed or that was cancelled while it waited is answered so (DeadlineExceeded,
  // Cancelled) without running its handler. 0: synchronous handlers run on the dispatcher thread.
  // Unaffected: methods registered as never blocking (Server::Register), which run to completion
  // on the dispatcher thread, and asynchronous handlers (`MethodAsync(ServerCall)`), which run
  // there too and must return at once.
  size_t handler_threads = 4;
  size_t handler_queue = 1024;  // calls waiting for a handler thread, at most
};

// Server-side Daronpon forwarding (Server::ForwardTo).
struct ForwardOptions {
  // A call goes to the least loaded peer when that peer's load + delta < this server's own.
  uint32_t delta = 1;
  // The channels to the peers (their window bounds the calls forwarded to each; reconnect on).
  ChannelOptions channel;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(std::shared_ptr<transport::Device> device,
                                                        ServerOptions options = {});
  ~Server();
  // Before Start; the service must outlive the server. AlreadyExists for a second one of a name.
  // `never_block`: methods of the service (their .proto names, e.g. "Add") whose synchronous
  // handlers never block (no I/O, no lock held elsewhere, no blocking rpc) and are short: they
  // run to completion on the dispatcher thread, their responses batched with the round's others,
  // instead of on a handler thread (ServerOptions::handler_threads). InvalidArgument for a name
  // the service does not have.
  absl::Status Register(ServiceBase* service, std::vector<std::string> never_block = {});
  // Listens and starts the accept and dispatch threads.
  absl::Status Start();
  std::string address() const;
  // Closes every connection, cancels the calls being handled (ServerContext::IsCancelled), fails
  // those waiting for a handler thread without running them, waits for the synchronous handlers
  // running to return, and stops the threads (asynchronous handlers finishing later are dropped).
  void Shutdown();
  // Policies run on every call of every connection.
  EngineChain& engines();

  // Server-side Daronpon (seed 003): this server and `peer_addresses` are replicas of the same
  // services. After ForwardTo, a new call goes one hop to the least loaded peer when that
  // peer's load + delta < the calls being handled here (peers' loads: piggybacked on their
  // responses and gossiped, as the clients learn them), through the same Balancer as
  // ConnectReplicas' channels. A forwarded call carries a flag: its peer serves it and never
  // forwards it again. The peer's response or error (Unavailable when it died) is relayed to
  // the caller once; a peer that is down or whose window is full is skipped (served here).
  // After Start, once. Errors: a peer refusing the handshake (names it), a second call.
  absl::Status ForwardTo(std::vector<std::string> peer_addresses, ForwardOptions options = {});
  struct ForwardStats {
    uint64_t forwarded = 0;      // calls this server sent on
    uint64_t received = 0;       // forwarded calls it served for a peer
    uint64_t peer_unusable = 0;  // a peer was chosen but down or full: served here instead
    std::vector<uint64_t> per_peer;
    std::vector<uint32_t> peer_load;  // the load Daronpon sees for each peer now
    uint32_t local_load = 0;
  };
  ForwardStats forwarding() const;

  // The global QoS reorder point (a "qos" engine in the chain, plexus/rpc/qos.hpp).
  using QosStats = rpc::QosStats;
  QosStats qos() const;

  struct ConnectionInfo {
    uint64_t id = 0;  // the transport's connection id (CallInfo::connection_id)
    std::string peer;
    size_t active_calls = 0;  // requests received and not answered yet
  };
  // The open connections, by id.
  std::vector<ConnectionInfo> Connections() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::rpc
