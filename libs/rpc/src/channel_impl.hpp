// The insides of a Channel, shared by channel.cpp (calls) and channel_connect.cpp (dialling,
// redialling, replicas): the call state, one connection (ChannelCore), and Channel::Impl.
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

namespace plexus::rpc {
namespace internal {

struct ChannelCore;

class CallState {
 public:
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;   // the user sees the result
  bool taken = false;  // WaitCall moved it out
  RawResult result = absl::UnknownError("call not completed");
  Channel::RawCallback callback;
  std::weak_ptr<ChannelCore> channel;

  // Owned by the channel's lock.
  uint64_t id = 0;
  bool has_result = false;
  bool sent = false;
  absl::Time deadline = absl::InfiniteFuture();
  EncodedMessage encoded;
  // The private copy of the request's data segments and its decoded form (content policies).
  std::unique_ptr<uint8_t[]> private_bytes;
  std::unique_ptr<Arena> private_arena;
  OutFrame frame;
  CallInfo info;
  EngineChain::Snapshot chain;
};

constexpr uint64_t kRecvBit = uint64_t{1} << 63;
constexpr uint64_t kControlBit = uint64_t{1} << 62;

// One connection to one replica. A Channel holds one per replica and replaces it when it died.
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
  // Told once, from this connection's thread, when the connection failed (the channel redials).
  std::function<void()> on_break;
  std::atomic<bool> up{true};

  std::mutex mu;
  std::condition_variable window_cv;
  absl::Status broken;
  size_t in_flight = 0;
  uint64_t next_id = 1;
  uint64_t next_control = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<CallState>> calls;    // awaiting a result
  absl::flat_hash_map<uint64_t, std::shared_ptr<CallState>> sending;  // awaiting kSend
  absl::flat_hash_map<uint64_t, BufferPool::Buffer> recvs;
  absl::flat_hash_map<uint64_t, std::unique_ptr<OutFrame>> controls;
  std::set<std::pair<absl::Time, uint64_t>> deadlines;
  std::vector<uint32_t> load_reports;  // gossip from the server, delivered by Run
  uint64_t next_recv = 1;

  std::atomic<bool> stop{false};
  std::thread thread;

  // Completes `call` for the user; without the lock.
  static void Finalize(const std::shared_ptr<CallState>& call) {
    absl::Status st = call->result.ok() ? absl::OkStatus() : call->result.status();
    if (call->chain) {
      for (const auto& p : *call->chain) p->OnComplete(call->info, st);
    }
    Channel::RawCallback cb;
    {
      std::lock_guard<std::mutex> lock(call->mu);
      call->done = true;
      cb = std::move(call->callback);
      if (!cb) call->cv.notify_all();
    }
    if (cb) {
      RawResult r = std::move(call->result);
      call->taken = true;
      cb(std::move(r));
    }
  }

  // With the lock: records the result; returns whether the call can be finalized now.
  bool SetResult(const std::shared_ptr<CallState>& call, RawResult r) {
    if (call->has_result) return false;
    call->has_result = true;
    call->result = std::move(r);
    calls.erase(call->id);
    if (call->deadline != absl::InfiniteFuture()) deadlines.erase({call->deadline, call->id});
    return ReleaseIfDone(call);
  }
  bool ReleaseIfDone(const std::shared_ptr<CallState>& call) {
    if (!call->has_result || !call->sent) return false;
    --in_flight;
    window_cv.notify_one();
    return true;
  }

  absl::Status PostRecvLocked() {
    BufferPool::Buffer b = pool->Take();
    const uint64_t wr = kRecvBit | next_recv++;
    PLEXUS_RETURN_IF_ERROR(conn->PostRecv({b.get(), pool->bytes()}, wr));
    recvs.emplace(wr, std::move(b));
    return absl::OkStatus();
  }

  void SendCancelLocked(uint64_t call_id) {
    if (!broken.ok()) return;
    auto f = std::make_unique<OutFrame>();
    FrameHeader h;
    h.type = FrameType::kCancel;
    h.call_id = call_id;
    BuildFrame(h, "", {}, nullptr, f.get());
    const uint64_t wr = kControlBit | next_control++;
    if (conn->PostSend(f->parts, wr).ok()) controls.emplace(wr, std::move(f));
  }

  // With the lock: the connection is gone; fails every call waiting for a result.
  void BreakLocked(absl::Status why, std::vector<std::shared_ptr<CallState>>* ready) {
    if (broken.ok()) broken = why;
    up = false;
    std::vector<std::shared_ptr<CallState>> waiting;
    for (auto& [id, c] : calls) waiting.push_back(c);
    for (auto& c : waiting) {
      if (SetResult(c, broken)) ready->push_back(c);
    }
    window_cv.notify_all();
  }

  void Handle(const transport::Completion& c, std::vector<std::shared_ptr<CallState>>* ready) {
    std::unique_lock<std::mutex> lock(mu);
    if (c.wr_id & kRecvBit) {
      auto it = recvs.find(c.wr_id);
      if (it == recvs.end()) return;
      BufferPool::Buffer buf = std::move(it->second);
      recvs.erase(it);
      if (!c.status.ok()) {
        BreakLocked(absl::UnavailableError(
                        absl::StrCat("rpc connection to ", peer, " failed: ", c.status.message())),
                    ready);
        return;
      }
      auto in = std::make_shared<Inbound>(pool, std::move(buf), c.bytes);
      absl::Status st = in->Parse(frame_limits);
      if (st.ok() && in->frame().header.type != FrameType::kResponse &&
          in->frame().header.type != FrameType::kLoad) {
        st = absl::InvalidArgumentError("malformed rpc frame: type: a server sent a non-response");
      }
      if (!st.ok()) {
        conn->Close();
        BreakLocked(absl::InternalError(absl::StrCat("rpc server ", peer, ": ", st.message())),
                    ready);
        return;
      }
      if (absl::Status rs = PostRecvLocked(); !rs.ok()) {
        BreakLocked(
            absl::UnavailableError(absl::StrCat("rpc connection to ", peer, ": ", rs.message())),
            ready);
      }
      const FrameHeader& h = in->frame().header;
      if (h.type == FrameType::kLoad) {
        load_reports.push_back(h.load);
        return;
      }
      auto call_it = calls.find(h.call_id);
      if (call_it == calls.end()) return;  // cancelled or expired: dropped
      std::shared_ptr<CallState> call = call_it->second;
      if (h.flags & kFlagLoad) call->info.replica_load = h.load;
      RawResult r = absl::UnknownError("");
      if (h.status_code != 0) {
        r = absl::Status(static_cast<absl::StatusCode>(h.status_code),
                         std::string(in->frame().status_message));
      } else {
        call->info.response_bytes = c.bytes;
        absl::Status ds = in->Decode(*call->info.method->response(), codec);
        if (ds.ok()) {
          r = std::shared_ptr<const InboundMessage>(std::move(in));
        } else {
          r = absl::InternalError(absl::StrCat("response of ", call->info.service->full_name, "/",
                                               call->info.method->name, " from ", peer, ": ",
                                               ds.message()));
        }
      }
      if (SetResult(call, std::move(r))) ready->push_back(call);
      return;
    }
    if (c.wr_id & kControlBit) {
      controls.erase(c.wr_id);
      return;
    }
    auto it = sending.find(c.wr_id);
    if (it == sending.end()) return;
    std::shared_ptr<CallState> call = it->second;
    sending.erase(it);
    call->sent = true;
    call->encoded.Clear();
    call->private_bytes.reset();
    call->private_arena.reset();
    if (!c.status.ok() && !call->has_result) {
      BreakLocked(absl::UnavailableError(
                      absl::StrCat("rpc connection to ", peer, " failed: ", c.status.message())),
                  ready);
    }
    if (ReleaseIfDone(call)) ready->push_back(call);
  }

  void ExpireLocked(std::vector<std::shared_ptr<CallState>>* ready) {
    const absl::Time now = absl::Now();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      const uint64_t id = deadlines.begin()->second;
      auto it = calls.find(id);
      if (it == calls.end()) {
        deadlines.erase(deadlines.begin());
        continue;
      }
      std::shared_ptr<CallState> call = it->second;
      SendCancelLocked(id);
      if (SetResult(call, absl::DeadlineExceededError(absl::StrCat(
                              "deadline exceeded: ", call->info.service->full_name, "/",
                              call->info.method->name, " to ", peer, " got no response within ",
                              absl::FormatDuration(call->deadline - call->info.start))))) {
        ready->push_back(call);
      }
    }
  }

  void Run() {
    std::vector<std::shared_ptr<CallState>> ready;
    std::vector<uint32_t> loads;
    transport::Completion batch[16];
    absl::Time drain_until = absl::InfiniteFuture();
    bool told = false;
    while (true) {
      absl::Duration wait = absl::Milliseconds(5);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop.load()) {
          if (drain_until == absl::InfiniteFuture()) drain_until = absl::Now() + absl::Seconds(2);
          if ((sending.empty() && recvs.empty() && controls.empty()) || absl::Now() > drain_until) {
            break;
          }
        }
        if (!deadlines.empty()) {
          wait = std::clamp(deadlines.begin()->first - absl::Now(), absl::ZeroDuration(), wait);
        }
      }
      size_t n = cq->Poll(absl::MakeSpan(batch));
      if (n == 0) {
        auto c = cq->Wait(wait, options.poll ? wait : absl::Microseconds(20));
        if (c.ok()) {
          batch[0] = std::move(*c);
          n = 1;
        }
      }
      for (size_t i = 0; i < n; ++i) Handle(batch[i], &ready);
      {
        std::lock_guard<std::mutex> lock(mu);
        ExpireLocked(&ready);
        loads.swap(load_reports);
      }
      if (!loads.empty()) {
        EngineChain::Snapshot engines = chain->snapshot();
        for (uint32_t load : loads) {
          for (const auto& p : *engines) p->OnLoadReport(replica, load);
        }
        loads.clear();
      }
      for (auto& call : ready) Finalize(call);
      ready.clear();
      if (!told && !up.load() && !stop.load()) {
        told = true;
        if (on_break) on_break();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    BreakLocked(absl::CancelledError("rpc channel closed"), &ready);
    for (auto& [wr, call] : sending) {
      call->sent = true;
      if (ReleaseIfDone(call)) ready.push_back(call);
    }
    sending.clear();
    for (auto& call : ready) Finalize(call);
  }

  // Fails what is outstanding with Cancelled (unless the connection failed before), closes the
  // connection and joins the thread. Not from the connection's own thread.
  void Shutdown() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken.ok()) broken = absl::CancelledError("rpc channel closed");
      up = false;
      conn->Close();
      stop = true;
    }
    thread.join();
  }

  // Sends an encoded call whose chain passed: waits for a window slot within its deadline.
  // Returns the error to fail the call with (the call is then not registered).
  absl::Status Submit(const std::shared_ptr<CallState>& call, const CallOptions& options) {
    call->channel = weak_from_this();
    const ServiceDesc& service = *call->info.service;
    const MethodDesc& method = *call->info.method;
    std::unique_lock<std::mutex> lock(mu);
    auto has_room = [&] { return in_flight < window || !broken.ok(); };
    if (call->deadline == absl::InfiniteFuture()) {
      window_cv.wait(lock, has_room);
    } else if (!window_cv.wait_until(lock, absl::ToChronoTime(call->deadline), has_room)) {
      return absl::DeadlineExceededError(
          absl::StrCat("deadline exceeded: ", service.full_name, "/", method.name, " to ", peer,
                       " waited for a window slot (", window, " calls in flight)"));
    }
    if (!broken.ok()) return absl::UnavailableError(broken.message());
    call->id = next_id++;
    call->info.call_id = call->id;
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.call_id = call->id;
    h.service_id = service.id;
    h.method_id = method.id;
    h.deadline_us = DeadlineBudgetUs(call->deadline);
    if (options.forwarded) h.flags |= kFlagForwarded;
    BuildFrame(h, "", options.metadata, &call->encoded, &call->frame);
    call->info.request_bytes = call->frame.bytes;
    if (absl::Status ps = conn->PostSend(call->frame.parts, call->id); !ps.ok()) {
      return absl::UnavailableError(absl::StrCat("rpc connection to ", peer, ": ", ps.message()));
    }
    ++in_flight;
    calls.emplace(call->id, call);
    sending.emplace(call->id, call);
    if (call->deadline != absl::InfiniteFuture()) deadlines.emplace(call->deadline, call->id);
    return absl::OkStatus();
  }
};

// Copies the encoded request's data segments into memory the call owns and decodes the copy
// (content policies check exactly the bytes sent); see channel.cpp.
absl::StatusOr<const void*> PrivatizeRequest(const MessageDesc& desc, const CodecLimits& limits,
                                             CallState* call);

// A dial's outcome: `refused` when the server answered the handshake with an error (a schema
// mismatch, a service it does not serve): redialling cannot help.
struct DialResult {
  absl::StatusOr<std::shared_ptr<internal::ChannelCore>> core = absl::UnknownError("");
  bool refused = false;
};

}  // namespace internal

struct Channel::Impl {
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

  mutable std::mutex mu;
  std::condition_variable cv;  // the connector's wake-ups; wait_for_ready callers
  bool closed = false;
  std::vector<Replica> replicas;
  std::thread connector;
  std::atomic<uint64_t> rotate{0};

  internal::DialResult Dial(uint32_t r, const std::string& address);
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
