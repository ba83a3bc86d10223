// The insides of a Server, shared by server.cpp (connections, frames, calls) and forward.cpp
// (server-side Daronpon forwarding): a connection, the server core, and one call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "conn.hpp"
#include "plexus/rpc/balance.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "qos_queue.hpp"
#include "recycle.hpp"

namespace plexus::rpc::internal {

struct ServerCore;
class ServerCallImpl;

struct ServerConn {
  ServerCore* server = nullptr;
  std::string peer;
  std::mutex mu;
  bool hello_done = false;
  bool dead = false;
  bool close_after_ack = false;
  bool wants_load = false;  // the client balances across replicas: piggyback and gossip loads
  bool refused = false;     // over ServerOptions::max_connections: refused in the handshake
  BatchLimits peer_batch;   // what the client takes per message (its hello)
  uint64_t next_wr = 1;
  // The window: receives posted plus requests received whose response has not left stay below
  // the server's window (a batch may take the requests held up to twice the window: its frames
  // are limited to the window).
  size_t posted = 0;
  size_t held = 0;
  // Receives kept posted, at most the window: one until the client has requests in flight, then
  // grown to what it keeps in flight (a posted receive cannot be taken back), so that a
  // connection idle since its handshake owns one receive buffer, not a window of them.
  size_t want = 1;
  // Requests received so far; the sweep (ServerCore::Sweep) notes when it last changed.
  uint64_t requests = 0;
  uint64_t requests_seen = 0;
  absl::Time accepted;
  absl::Time quiet_since;  // no request since
  absl::flat_hash_map<uint64_t, BufferPool::Buffer> recvs;
  // Responses being sent, per send: one response (no vector to allocate), or a batch (`calls`
  // and its gather list `parts`).
  struct Sending {
    std::shared_ptr<ServerCallImpl> one;
    std::vector<std::shared_ptr<ServerCallImpl>> calls;
    std::vector<Part> parts;
    size_t size() const { return (one ? 1 : 0) + calls.size(); }
    template <typename F>
    void ForEach(F&& f) const {
      if (one) f(one);
      for (const auto& c : calls) f(c);
    }
  };
  absl::flat_hash_map<uint64_t, Sending> sending;
  // Responses finished during the dispatcher's round, sent in pieces of the batch of requests
  // being handled (conn.hpp, PieceFrames) and when the round ends.
  std::vector<std::shared_ptr<ServerCallImpl>> outbox;
  size_t outbox_bytes = 0;
  bool in_flush_list = false;  // ServerCore::flush_list holds this connection (once a round)
  // Frames per piece of the batch being handled (0: not in pieces): the dispatcher's thread only
  // (written before it runs the batch's handlers, read by the responses they finish there).
  size_t round_piece = 0;
  absl::flat_hash_map<uint64_t, std::weak_ptr<ServerCallImpl>> active;
  std::unique_ptr<OutFrame> ack;
  absl::flat_hash_map<uint64_t, std::unique_ptr<OutFrame>> controls;  // load reports being sent
  // Declared last: destroyed first, so that no buffer above is freed under the transport.
  std::unique_ptr<transport::Connection> conn;

  // Posts receives while the window has room. The transport refuses a post only on a failed
  // connection, whose failure may already have completed every earlier receive: then no
  // completion will ever tell the server, so the refusal is returned (OK otherwise) and the
  // caller kills the connection once it has let go of `mu`.
  absl::Status RefillLocked();
  absl::Status PostRecvLocked();
  // `n` responses left (their send completed, or left within FlushLocked): their requests leave
  // the window and receives are refilled (RefillLocked's result).
  absl::Status ResponsesLeftLocked(size_t n);
  // Sends the outbox (one frame as is, several as a batch). The calls whose response ended here
  // are added to `ended` (the caller runs Sent() on them outside `mu`): all of them when the
  // send left whole within the call (no completion follows; the receives are refilled) or when
  // the connection refused it (the error is returned). An error after a send that left is the
  // refill's, which the caller treats as a refusal (it kills the connection).
  using Ended = absl::InlinedVector<std::shared_ptr<ServerCallImpl>, 2>;
  absl::Status FlushLocked(Ended* ended);
  // A closed connection's responses still being sent or waiting to be: no completion reaches it
  // any more (it left ServerCore::conns), and each holds the connection as it holds them, so they
  // are let go here (the caller runs Sent() on them, outside `mu`).
  std::vector<std::shared_ptr<ServerCallImpl>> TakeUnsentLocked();
};

// The threads that run synchronous handlers (ServerOptions::handler_threads; handler_pool.cpp):
// a FIFO of calls, bounded, and threads started as the calls need them, up to the limit.
class HandlerPool {
 public:
  HandlerPool(size_t max_threads, size_t max_waiting)
      : max_threads_(max_threads), max_waiting_(max_waiting) {}
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;
  ~HandlerPool() { Stop(); }
  // Queues `handler` for `call`; a full queue or a stopped pool finishes the call at once
  // (ResourceExhausted, Unavailable).
  void Push(std::shared_ptr<ServerCallImpl> call, ServiceBase* service, SyncHandler handler);
  // Fails the calls still queued (Unavailable) without running them, waits for the handlers
  // running to return and joins the threads.
  void Stop();

 private:
  struct Job {
    std::shared_ptr<ServerCallImpl> call;
    ServiceBase* service = nullptr;
    SyncHandler handler = nullptr;
  };
  void Run();

  const size_t max_threads_;
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t running_ = 0;  // jobs taken from the queue whose handler has not returned
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Server-side Daronpon (forward.cpp): channels to the peer replicas and the balancer that decides,
// per call, whether a peer's load + delta is below this server's own.
struct Forwarding {
  std::vector<std::string> addresses;
  std::vector<std::shared_ptr<Channel>> peers;  // peer p is the balancer's replica p + 1
  std::unique_ptr<Balancer> balancer;           // replica 0: this server (local, exact)
  size_t window = 0;                            // calls in flight per peer channel
  // Under ServerCore::load_mu.
  uint64_t forwarded = 0;      // calls sent on to a peer
  uint64_t received = 0;       // forwarded calls received from a peer (served here)
  uint64_t peer_unusable = 0;  // Daronpon chose a peer that was down or full: served here
  std::vector<uint64_t> per_peer;
};

struct ServerCore {
  std::shared_ptr<transport::Device> device;
  std::unique_ptr<transport::CompletionQueue> cq;
  // Closed by Shutdown, as soon as no more connections are accepted: a client dialing meanwhile is
  // refused at once instead of waiting for a handshake nobody answers.
  std::unique_ptr<transport::Listener> listener;
  std::string address;   // the listener's (kept after Shutdown)
  bool started = false;  // Start succeeded
  ServerOptions options;
  size_t window = 0;
  std::shared_ptr<BufferPool> pool;
  CodecLimits codec;
  FrameLimits frame_limits;
  EngineChain chain;
  struct Served {
    ServiceBase* service = nullptr;
    std::vector<bool> never_block;  // per method: run on the dispatcher (Server::Register)
  };
  absl::flat_hash_map<uint32_t, Served> services;
  std::map<std::string, ServiceBase*, std::less<>> by_name;

  std::mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ServerConn>> conns;
  // Bumped (under mu) whenever a connection leaves `conns`: the dispatcher's cache of the
  // connection it looked up last (below) is valid while this is unchanged, so the common case
  // (completions of one connection in a row) takes no lock for the lookup.
  std::atomic<uint64_t> conns_epoch{0};
  uint64_t cached_id = 0;  // the dispatcher's thread only, like the two below
  uint64_t cached_epoch = ~uint64_t{0};
  std::shared_ptr<ServerConn> cached_conn;
  size_t admitted = 0;  // connections in `conns` not refused (ServerOptions::max_connections)
  std::atomic<bool> stop{false};
  std::thread accept_thread;
  std::thread dispatch_thread;

  // Closing connections and the timeouts run on their own thread (Reap), off the dispatcher:
  // Kill hands a connection over to be closed, in bounded batches, and every `SweepEvery()` the
  // idle and trickling connections are found (Sweep).
  std::mutex reap_mu;
  std::condition_variable reap_cv;
  std::vector<std::shared_ptr<ServerConn>> to_close;
  bool reap_stop = false;
  std::thread reap_thread;
  void Reap();
  absl::Duration SweepEvery() const;
  void Sweep(absl::Time now);

  // Calls being handled here across every connection (the load the balancing clients see; not
  // the calls forwarded to a peer), and the logarithmic trigger that decides when to gossip it.
  std::mutex load_mu;
  uint32_t load = 0;
  GossipTrigger trigger;

  // The global QoS reorder point (used while a chain's engine classifies calls).
  QosQueue qos;
  // Synchronous handlers' threads (null when ServerOptions::handler_threads is 0).
  std::unique_ptr<HandlerPool> handlers;

  // Set once by Server::ForwardTo; read by the dispatcher and the peer channels' threads.
  std::unique_ptr<Forwarding> forwarding_owner;
  std::atomic<Forwarding*> forwarding{nullptr};

  // Adds `delta` to the load; gossips it to the balancing clients when the trigger fires.
  // Returns the new load. Without a connection's lock.
  uint32_t ChangeLoad(int delta);
  uint32_t CurrentLoad();
  void BroadcastLoad(uint32_t value);

  void Accept();
  void Dispatch();
  void Handle(const transport::Completion& c);
  void HandleFrame(const std::shared_ptr<ServerConn>& sc, std::shared_ptr<Inbound> in);
  // The dispatcher's round: responses finished on its thread meanwhile queue per connection
  // (`flush_list`) and leave batched when the round ends (EndRound).
  bool InRound() const;
  void EndRound();
  std::vector<std::shared_ptr<ServerConn>> flush_list;  // the dispatcher's thread only
  PiecesGate pieces;  // the dispatcher's: whether its rounds go in pieces (conn.hpp)
  // The dispatcher's scratch lists (capacity kept across rounds).
  std::vector<std::shared_ptr<ServerConn>> flushing;
  std::vector<std::shared_ptr<Inbound>> frames_scratch;
  // Calls, recycled (bounded: more are freed). Each handed-out call holds it.
  std::shared_ptr<Recycler<ServerCallImpl>> call_pool;
  // After the chain passed: forwards the call, queues it for QoS, or runs its handler.
  void Route(const std::shared_ptr<ServerCallImpl>& call, ServiceBase* service, uint32_t method_id,
             bool forwarded_to_us, const std::optional<QosVerdict>& verdict);
  void Kill(const std::shared_ptr<ServerConn>& sc, const absl::Status& why);

  // forward.cpp: the peer to forward a call to (counted there), or nullopt to serve it here (a
  // call that was forwarded to us always is).
  std::optional<uint32_t> ForwardTarget(bool forwarded_to_us);
  // forward.cpp: sends `call` to peer `p` and relays its response.
  void Forward(const std::shared_ptr<ServerCallImpl>& call, uint32_t p);
  void StopForwarding();
};

// One call on the server. Recycled through ServerCore::call_pool: Start() begins a call, Recycle()
// (when the last holder let go) drops it and keeps the buffers' capacity.
class ServerCallImpl : public ServerCallState,
                       public ServerContext,
                       public std::enable_shared_from_this<ServerCallImpl> {
 public:
  // The request frame `in` arrived on `conn`.
  void Start(std::shared_ptr<ServerConn> conn, std::shared_ptr<Inbound> in);
  void Recycle();
  // Reads the clock for the call's start (a deadline or an engine needs it), once.
  void StampStart();

  // Sets the method and builds a default response.
  void Bind(const ServiceDesc* s, const MethodDesc* m);
  // The call counts in the server's load from now until Finish (forwarded calls never do).
  void Count();
  // The QoS queue handed the call to its handler: Finish frees that slot.
  void HoldsQosSlot() { qos_slot_ = true; }
  // Its synchronous handler runs on the thread that dispatches it, not on a handler thread.
  void set_runs_inline(bool runs_inline) { runs_inline_ = runs_inline; }
  // A call cancelled, or past its deadline, while it waited (`waiting`: for what) is not worth a
  // handler: finishes it (Cancelled, DeadlineExceeded) and returns true.
  bool FinishIfStale(const char* waiting);

  const void* request() const override { return in_->message(); }
  void* response() override { return response_; }
  ServerContext& context() override { return *this; }
  const MetadataView& metadata() const override { return in_->metadata(); }
  absl::Time deadline() const override { return deadline_; }
  bool IsCancelled() const override { return cancelled_.load(); }
  void Cancel() { cancelled_ = true; }
  void AddResponseMetadata(std::string key, std::string value) override;
  void* Allocate(size_t bytes, size_t align) override;
  std::string peer() const override { return conn_->peer; }
  void set_chain(EngineChain::Snapshot chain) { chain_ = std::move(chain); }
  void set_request_for_policies(const void* request, uint64_t connection_id);
  const CallInfo& info() const { return info_; }
  const ServerConn& conn() const { return *conn_; }

  void Finish(absl::Status status) override;
  void RunSync(ServiceBase* service, SyncHandler handler) override;
  // A forwarded call's result from the peer: its response (kept alive until sent) or its error.
  void Relay(RawResult result);
  // The response left: policies see the end of the call.
  void Sent();
  const OutFrame& frame() const { return frame_; }

 private:
  std::shared_ptr<ServerConn> conn_;
  std::shared_ptr<Inbound> in_;
  uint64_t call_id_ = 0;
  CallInfo info_;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
  bool counted_ = false;
  bool wants_load_ = false;  // the client takes the server's load on each response
  bool qos_slot_ = false;
  bool runs_inline_ = false;
  std::mutex md_mu_;
  Metadata response_md_;
  Arena arena_;
  void* response_ = nullptr;
  std::shared_ptr<const InboundMessage> reply_;  // a forwarded call's response from the peer
  EncodedMessage encoded_;
  OutFrame frame_;
  absl::Status status_;
  EngineChain::Snapshot chain_;
};

}  // namespace plexus::rpc::internal

namespace plexus::rpc {
struct Server::Impl {
  internal::ServerCore core;
};
}  // namespace plexus::rpc
