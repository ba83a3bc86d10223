// The insides of a Channel, shared by channel.cpp (calls, idempotent retry), channel_core.cpp
// (one connection: polling, batches, deadlines) and channel_connect.cpp (dialling, redialling,
// replicas): the call state, one connection (ChannelCore), and Channel::Impl.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "conn.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/rpc/balance.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "recycle.hpp"

namespace plexus::rpc {
namespace internal {

struct ChannelCore;
class ClientQos;

// One call of a Channel. Recycled (Recycler<CallState>, bounded): a call id is never reused, so
// a late response or cancel for an earlier call of the same object finds no entry in `calls`
// under its old id and is dropped.
class CallState {
 public:
  // Back to the state of a new call, keeping the capacity of its buffers.
  void Recycle();

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;      // the user sees the result
  bool taken = false;     // WaitCall moved it out
  bool promoted = false;  // a blocking caller waiting for the poller's role got it
  RawResult result = NotCompleted();
  Channel::RawCallback callback;
  std::weak_ptr<ChannelCore> channel;
  std::atomic<bool> finished{false};  // `done`, readable without the lock
  // An idempotent call the channel retries (channel.cpp): the user holds this state, each try is
  // a call of its own (`attempt`, under mu).
  std::weak_ptr<struct RetryState> retry;
  std::shared_ptr<CallState> attempt;
  std::atomic<bool> polling{false};  // its blocking caller polls the connection (the leader)

  // Owned by the channel's lock.
  uint64_t id = 0;
  bool has_result = false;
  bool sent = false;
  bool async = false;  // completes through a callback
  absl::Time deadline = absl::InfiniteFuture();
  EncodedMessage encoded;
  // What content policies check and the request is marshalled from (private_request.hpp), until
  // the request has left: the first bytes inline (a small request's copy needs no allocation),
  // the rest in an arena made when needed.
  alignas(std::max_align_t) unsigned char private_inline[128];
  std::unique_ptr<Arena> private_arena;
  OutFrame frame;
  CallInfo info;
  // Sent by a server forwarding a call to its peer replica (kFlagForwarded): the peer serves it
  // and never forwards it again.
  bool forwarded = false;
  EngineChain::Snapshot chain;
  // The runtime's QoS reorder point (client_qos.hpp) when the call went through it;
  // `qos_counted` while the call holds one of its slots (given back in Finalize).
  std::shared_ptr<ClientQos> qos;
  bool qos_counted = false;

  // The result before there is one: a code without a message, which absl keeps inline, so that
  // setting it (each recycled call) and replacing it (each result) allocate nothing and touch no
  // shared reference count. Nothing reads it: a result is read only once `has_result` is set.
  static absl::Status NotCompleted() { return absl::Status(absl::StatusCode::kUnknown, ""); }
};

// Blocks until the call completed and returns its result (once: it is moved out).
RawResult WaitCall(CallState& call);
bool WaitCallFor(CallState& call, absl::Duration timeout);
void CancelCall(CallState& call);

// Wraps a call state in the handle users hold, for the runtime (and tests linking
// plexus_rpc_internal).
struct CallAccess {
  static RawCall Make(std::shared_ptr<CallState> state) { return RawCall(std::move(state)); }
};

constexpr uint64_t kRecvBit = uint64_t{1} << 63;
constexpr uint64_t kControlBit = uint64_t{1} << 62;
constexpr uint64_t kSendBit = uint64_t{1} << 61;
// Pushed into the completion queue to interrupt a blocking caller that polls it (its call was
// completed by another thread).
constexpr uint64_t kWakeId = uint64_t{1} << 60;

// One connection to one replica. A Channel holds one per replica and replaces it when it died.
//
// Completions are handled run-to-completion by whichever thread polls the connection's queue:
// the connection's own thread (Run), or a blocking caller (WaitCall) that takes the poller's role
// (the leader) while it waits, so that a synchronous call needs no thread hop on either side.
// While a leader polls, Run parks; calls with callbacks that the leader completes are handed to
// Run (callbacks run on the channel's thread). Requests started on Run's thread during a round
// (from callbacks) queue in the outbox and leave in pieces (PieceFrames) and when the round ends.
struct ChannelCore : std::enable_shared_from_this<ChannelCore> {
  std::shared_ptr<transport::Device> device;
  std::unique_ptr<transport::CompletionQueue> cq;
  std::unique_ptr<transport::Connection> conn;
  ChannelOptions options;
  size_t window = 0;
  std::shared_ptr<BufferPool> pool;
  std::string peer;
  uint32_t replica = 0;
  // The channel's chain: it outlives the connections (engines stay attached across reconnects).
  std::shared_ptr<EngineChain> chain;
  CodecLimits codec;
  FrameLimits frame_limits;
  // What the server takes per message and whether it sends batches (from the handshake).
  BatchLimits peer_batch;
  bool batches_in = false;
  // Told once, from this connection's thread, when the connection failed (the channel redials).
  std::function<void()> on_break;
  std::atomic<bool> up{true};

  std::mutex mu;
  std::condition_variable window_cv;
  absl::Status broken;
  size_t in_flight = 0;
  uint64_t next_id = 1;
  uint64_t next_control = 1;
  uint64_t next_send = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<CallState>> calls;  // awaiting a result
  struct Sending {
    // One request (the common case, no vector to allocate), or a batch: `calls` and its gather
    // list `parts`.
    std::shared_ptr<CallState> one;
    std::vector<std::shared_ptr<CallState>> calls;
    std::vector<Part> parts;
    template <typename F>
    void ForEach(F&& f) const {
      if (one) f(one);
      for (const auto& c : calls) f(c);
    }
  };
  absl::flat_hash_map<uint64_t, Sending> sending;  // awaiting kSend
  std::vector<std::shared_ptr<CallState>> outbox;  // requests of Run's round, not sent yet
  size_t outbox_bytes = 0;
  // Run's thread only: frames per piece of its round (0: the round leaves whole) and whether
  // pieces pay (conn.hpp).
  size_t round_piece = 0;
  PiecesGate pieces;
  absl::flat_hash_map<uint64_t, BufferPool::Buffer> recvs;
  absl::flat_hash_map<uint64_t, std::unique_ptr<OutFrame>> controls;
  std::set<std::pair<absl::Time, uint64_t>> deadlines;
  // !deadlines.empty(), readable without the lock: a poller skips the lock when no call has a
  // deadline (written under mu; a stale read only delays an expiry to the next poll, as before).
  std::atomic<bool> has_deadlines{false};
  std::vector<uint32_t> load_reports;  // gossip from the server, delivered by Run
  uint64_t next_recv = 1;
  // The poller's role (see above), under mu.
  bool leader = false;
  std::vector<CallState*> followers;                // blocking callers waiting for the role
  std::vector<std::shared_ptr<CallState>> handoff;  // completed by the leader, with callbacks
  size_t async_in_flight = 0;                       // calls with callbacks not completed
  absl::Time leader_left = absl::InfinitePast();    // when the last leader gave the role up
  std::condition_variable run_cv;                   // Run parks on it while a leader polls
  base::AdaptiveSpin spin_{kThreadModeSpin};        // the poller's (one at a time); PollerSpin
  // The leader's list of calls to finalize (owned by the role, one thread at a time: its
  // capacity is kept across calls).
  std::vector<std::shared_ptr<CallState>> lead_ready;
  // Frames of one received message, under mu (capacity kept).
  std::vector<std::shared_ptr<Inbound>> frames_scratch;
  std::atomic<size_t> last_round_{0};  // completions the last poll handled

  std::atomic<bool> stop{false};
  std::thread thread;

  // Completes `call` for the user; without the lock.
  static void Finalize(const std::shared_ptr<CallState>& call);

  // With the lock: records the result; returns whether the call can be finalized now.
  bool SetResult(const std::shared_ptr<CallState>& call, RawResult r);
  bool ReleaseIfDone(const std::shared_ptr<CallState>& call);
  // With the lock: the request of `call` left (its buffers are free).
  static void SentLocked(CallState& call);
  absl::Status PostRecvLocked();
  void SendCancelLocked(uint64_t call_id);
  // With the lock: the connection is gone; fails every call waiting for a result.
  void BreakLocked(absl::Status why, std::vector<std::shared_ptr<CallState>>* ready);
  // With the lock: one completion.
  void HandleLocked(const transport::Completion& c, std::vector<std::shared_ptr<CallState>>* ready);
  void HandleFrame(const std::shared_ptr<Inbound>& in,
                   std::vector<std::shared_ptr<CallState>>* ready);
  void ExpireLocked(std::vector<std::shared_ptr<CallState>>* ready);
  // Sends the outbox (one request as is, several as a batch).
  void FlushLocked(std::vector<std::shared_ptr<CallState>>* ready);
  // Polls the queue once (waiting up to `wait`) and handles what came: completions, deadlines,
  // load reports. `ready` receives the calls to finalize. `after_pieces` (Run's, after a round
  // that left in pieces): first one pass of the transport, which tells `pieces` whether the
  // server answered while the round ran.
  void Poll(absl::Duration wait, std::vector<std::shared_ptr<CallState>>* ready,
            bool after_pieces = false);
  // The connection's thread.
  void Run();
  // A blocking caller polls the connection itself until `call` completes (it holds the role).
  void Lead(CallState& call);

  // Fails what is outstanding with Cancelled (unless the connection failed before), closes the
  // connection and joins the thread. Not from the connection's own thread.
  void Shutdown();

  // Sends an encoded call whose chain passed: waits for a window slot within its deadline.
  // Returns the error to fail the call with (the call is then not registered).
  absl::Status Submit(const std::shared_ptr<CallState>& call, const CallOptions& options);
  // Submit without waiting (the QoS reorder point, client_qos.hpp): nullopt, and nothing done,
  // while the window is full.
  std::optional<absl::Status> TrySubmit(const std::shared_ptr<CallState>& call,
                                        const CallOptions& options);
  // Submit's send, with mu held by `lock` (released on return).
  absl::Status SendLocked(const std::shared_ptr<CallState>& call, const CallOptions& options,
                          std::unique_lock<std::mutex>& lock);
  // Calls of this connection waiting in the runtime's QoS reorder point: while there are any, a
  // call that no engine classifies queues behind them (FIFO, as bulk) instead of overtaking.
  std::atomic<uint32_t> qos_queued{0};
};

// What a retried call needs to start another try (the request stays valid until it completes).
struct RetryState {
  std::shared_ptr<CallState> outer;  // what the user holds
  const ServiceDesc* service = nullptr;
  const MethodDesc* method = nullptr;
  const void* request = nullptr;
  CallOptions options;
  int attempts = 0;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> completed{false};
  Channel::Impl* impl = nullptr;
  absl::Status last;  // the last try's Unavailable
};

// A dial's outcome: `refused` when the server answered the handshake with an error that
// redialling cannot help (a schema mismatch, a service it does not serve; not its connection
// limit).
struct DialResult {
  absl::StatusOr<std::shared_ptr<internal::ChannelCore>> core = absl::UnknownError("");
  bool refused = false;
};

}  // namespace internal

struct Channel::Impl {
  // The insides of `channel` (tests look at the recycled call states).
  static Impl& Of(Channel& channel) { return *channel.impl_; }

  struct Replica {
    std::string address;
    std::shared_ptr<internal::ChannelCore> core;  // null while not connected
    absl::Status last_error;                      // why the last dial or connection failed
    // Redial delays: options.reconnect_backoff, doubling up to max_reconnect_backoff while dials
    // fail; reset by a successful one.
    base::Backoff backoff{absl::ZeroDuration(), absl::ZeroDuration()};
    absl::Time next_attempt = absl::InfinitePast();
    uint64_t connections = 0;
  };

  std::shared_ptr<transport::Device> device;
  std::vector<const ServiceDesc*> services;
  absl::flat_hash_map<uint32_t, const ServiceDesc*> service_ids;
  ChannelOptions options;
  size_t window = 0;
  size_t max_bytes = 0;
  internal::CodecLimits codec;
  std::shared_ptr<EngineChain> chain = std::make_shared<EngineChain>();
  // The client QoS reorder point of the channels on `device` (client_qos.hpp).
  std::shared_ptr<internal::ClientQos> qos;
  // Call states, recycled (bounded by the window: more are freed).
  std::shared_ptr<internal::Recycler<internal::CallState>> call_states;

  mutable std::mutex mu;
  std::condition_variable cv;  // the connector's wake-ups; wait_for_ready callers
  bool closed = false;
  std::vector<Replica> replicas;
  std::thread connector;
  std::atomic<uint64_t> rotate{0};

  // Idempotent calls waiting for a connection to try again (channel.cpp), under mu.
  std::vector<std::shared_ptr<internal::RetryState>> retries;

  internal::DialResult Dial(uint32_t r, const std::string& address);
  // One try of a call (Channel::StartCall without the retry). `forwarded`: a server forwarding
  // the call to its peer replica (forward.cpp) sends it flagged, tried once.
  std::shared_ptr<internal::CallState> StartOnce(Channel& channel, const ServiceDesc& service,
                                                 const MethodDesc& method, const void* request,
                                                 const CallOptions& options,
                                                 Channel::RawCallback done, bool forwarded = false);
  // Starts the next try of `retry`, or completes its call (deadline, attempts, closed).
  void Attempt(Channel& channel, const std::shared_ptr<internal::RetryState>& retry);
  // A try ended: completes the call, or queues it for the connector to try again.
  void OnAttempt(const std::shared_ptr<internal::RetryState>& retry, RawResult r);
  static void Complete(const std::shared_ptr<internal::RetryState>& retry, RawResult r);
  // The connector: starts the queued tries once a replica is connected; fails those whose
  // deadline passed. Returns when it should look again. With mu held (released meanwhile).
  absl::Time RunRetries(std::unique_lock<std::mutex>& lock);
  Channel* self = nullptr;
  void Connector();
  // From a connection's thread: the connection of replica `r` failed.
  void OnBreak(uint32_t r) {
    std::lock_guard<std::mutex> lock(mu);
    Replica& rep = replicas[r];
    rep.next_attempt = absl::Now() + rep.backoff.delay();
    cv.notify_all();
  }
  static absl::StatusOr<std::shared_ptr<Channel>> Open(std::shared_ptr<transport::Device> device,
                                                       std::vector<std::string> addresses,
                                                       std::vector<const ServiceDesc*> services,
                                                       ChannelOptions options, bool single);
};

}  // namespace plexus::rpc
