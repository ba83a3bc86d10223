#include "plexus/rpc/channel.hpp"

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
#include "plexus/rpc/balance.hpp"
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

// Copies the encoded request's data segments into memory the call owns, points the gather list
// at that copy, and decodes the copy: content policies check the decoded copy, and the bytes sent
// are the same private bytes, so the application changing its request after StartCall returned
// (or from another thread while the chain runs) cannot change what was checked.
absl::StatusOr<const void*> PrivatizeRequest(const MessageDesc& desc, const CodecLimits& limits,
                                             CallState* call) {
  EncodedMessage& e = call->encoded;
  size_t total = 0;
  for (const Part& p : e.parts) total += p.size;
  call->private_bytes = std::make_unique<uint8_t[]>(std::max<size_t>(total, 1));
  std::vector<Part> parts;
  std::vector<absl::Span<const uint8_t>> segments;
  parts.reserve(e.segment_first.size());
  segments.reserve(e.segment_first.size());
  size_t at = 0;
  for (size_t i = 0; i < e.segment_first.size(); ++i) {
    const size_t begin = at;
    for (uint32_t k = 0; k < e.segment_parts[i]; ++k) {
      const Part& p = e.parts[e.segment_first[i] + k];
      if (p.size > 0) std::memcpy(call->private_bytes.get() + at, p.data, p.size);
      at += p.size;
    }
    parts.push_back(Part{call->private_bytes.get() + begin, at - begin});
    segments.emplace_back(call->private_bytes.get() + begin, at - begin);
    e.segment_first[i] = static_cast<uint32_t>(i);
    e.segment_parts[i] = 1;
  }
  e.parts = std::move(parts);
  call->private_arena = std::make_unique<Arena>(limits.max_arena_bytes);
  absl::StatusOr<void*> m =
      DecodeMessage(desc,
                    absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(e.structure.data()),
                                              e.structure.size()),
                    segments, *call->private_arena, limits);
  if (!m.ok()) {
    return absl::InternalError(
        absl::StrCat("private copy of a ", desc.full_name,
                     " request for a content policy: ", m.status().message()));
  }
  return static_cast<const void*>(*m);
}

RawResult WaitCall(CallState& call) {
  std::unique_lock<std::mutex> lock(call.mu);
  call.cv.wait(lock, [&] { return call.done; });
  if (call.taken) return absl::FailedPreconditionError("the call's result was already taken");
  call.taken = true;
  return std::move(call.result);
}

bool WaitCallFor(CallState& call, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(call.mu);
  return call.cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return call.done; });
}

void CancelCall(CallState& call) {
  std::shared_ptr<ChannelCore> ch = call.channel.lock();
  if (!ch) return;
  std::shared_ptr<CallState> self;
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(ch->mu);
    auto it = ch->calls.find(call.id);
    if (it == ch->calls.end() || it->second.get() != &call) return;
    self = it->second;
    ch->SendCancelLocked(call.id);
    ready = ch->SetResult(self, absl::CancelledError(absl::StrCat(
                                    "call ", self->info.service->full_name, "/",
                                    self->info.method->name, " cancelled by the client")));
  }
  if (ready) ChannelCore::Finalize(self);
}

}  // namespace internal

namespace {

// A dial's outcome: `refused` when the server answered the handshake with an error (a schema
// mismatch, a service it does not serve): redialling cannot help.
struct DialResult {
  absl::StatusOr<std::shared_ptr<internal::ChannelCore>> core = absl::UnknownError("");
  bool refused = false;
};

}  // namespace

struct Channel::Impl {
  struct Replica {
    std::string address;
    std::shared_ptr<internal::ChannelCore> core;  // null while not connected
    absl::Status last_error;                      // why the last dial or connection failed
    absl::Duration backoff;
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

  DialResult Dial(uint32_t r, const std::string& address);
  void Connector();
  // From a connection's thread: the connection of replica `r` failed.
  void OnBreak(uint32_t r) {
    std::lock_guard<std::mutex> lock(mu);
    Replica& rep = replicas[r];
    rep.next_attempt = absl::Now() + rep.backoff;
    cv.notify_all();
  }
  static absl::StatusOr<std::shared_ptr<Channel>> Open(std::shared_ptr<transport::Device> device,
                                                       std::vector<std::string> addresses,
                                                       std::vector<const ServiceDesc*> services,
                                                       ChannelOptions options, bool single);
};

DialResult Channel::Impl::Dial(uint32_t r, const std::string& address) {
  DialResult out;
  auto core = std::make_shared<internal::ChannelCore>();
  core->window = window;
  core->options = options;
  core->codec = codec;
  core->pool = std::make_shared<internal::BufferPool>(max_bytes, window * 2 + 2);
  core->device = device;
  core->peer = address;
  core->replica = r;
  core->chain = chain;
  core->cq = device->CreateCompletionQueue();
  auto conn = device->Connect(address, core->cq.get());
  if (!conn.ok()) {
    out.core = conn.status();
    return out;
  }
  core->conn = std::move(*conn);

  // Handshake: the schema hash of every service, answered by the server's verdict.
  internal::OutFrame hello;
  internal::FrameHeader h;
  h.type = internal::FrameType::kHello;
  // Several replicas: ask for the server's load reports (the balancing engines use them).
  if (replicas.size() > 1) h.flags = internal::kFlagLoad;
  Metadata md;
  for (const ServiceDesc* s : services) {
    md.emplace_back(s->full_name, absl::StrFormat("%016x", s->schema_hash));
  }
  internal::BuildFrame(h, "", md, nullptr, &hello);
  internal::BufferPool::Buffer ack = core->pool->Take();
  auto fail = [&](absl::Status st) {
    core->conn->Close();
    out.core = std::move(st);
    return out;
  };
  if (absl::Status st = core->conn->PostRecv({ack.get(), core->pool->bytes()}, 1); !st.ok()) {
    return fail(st);
  }
  if (absl::Status st = core->conn->PostSend(hello.parts, 2); !st.ok()) return fail(st);
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  bool sent = false, received = false;
  size_t ack_bytes = 0;
  while (!(sent && received)) {
    auto c = core->cq->Wait(std::max(give_up - absl::Now(), absl::ZeroDuration()));
    if (!c.ok()) {
      return fail(absl::DeadlineExceededError(
          absl::StrCat("rpc handshake with ", address, ": no answer within ",
                       absl::FormatDuration(options.connect_timeout))));
    }
    if (!c->status.ok()) {
      return fail(absl::UnavailableError(
          absl::StrCat("rpc handshake with ", address, " failed: ", c->status.message())));
    }
    if (c->wr_id == 2) sent = true;
    if (c->wr_id == 1) {
      received = true;
      ack_bytes = c->bytes;
    }
  }
  internal::Inbound in(core->pool, std::move(ack), ack_bytes);
  absl::Status st = in.Parse(core->frame_limits);
  if (st.ok() && in.frame().header.type != internal::FrameType::kHelloAck) {
    st = absl::InvalidArgumentError("malformed rpc frame: type: expected the handshake answer");
  }
  if (!st.ok()) {
    out.refused = true;
    return fail(
        absl::InternalError(absl::StrCat("rpc handshake with ", address, ": ", st.message())));
  }
  if (in.frame().header.status_code != 0) {
    out.refused = true;
    return fail(absl::Status(static_cast<absl::StatusCode>(in.frame().header.status_code),
                             absl::StrCat("rpc handshake with ", address,
                                          " refused: ", std::string(in.frame().status_message))));
  }
  {
    std::lock_guard<std::mutex> lock(core->mu);
    for (size_t i = 0; i < window + 1; ++i) {
      if (absl::Status ps = core->PostRecvLocked(); !ps.ok()) return fail(ps);
    }
  }
  if (options.reconnect) core->on_break = [this, r] { OnBreak(r); };
  core->thread = std::thread([c = core.get()] { c->Run(); });
  out.core = std::move(core);
  return out;
}

// Redials every replica whose connection is down once its backoff passed, one at a time.
void Channel::Impl::Connector() {
  std::unique_lock<std::mutex> lock(mu);
  while (!closed) {
    const absl::Time now = absl::Now();
    absl::Time wake = absl::InfiniteFuture();
    std::optional<uint32_t> due;
    for (uint32_t r = 0; r < replicas.size(); ++r) {
      const Replica& rep = replicas[r];
      if (rep.core != nullptr && rep.core->up.load()) continue;
      if (rep.core != nullptr && rep.next_attempt == absl::InfinitePast()) continue;  // not told
      if (rep.next_attempt <= now) {
        due = r;
        break;
      }
      wake = std::min(wake, rep.next_attempt);
    }
    if (!due) {
      if (wake == absl::InfiniteFuture()) {
        cv.wait(lock);
      } else {
        cv.wait_until(lock, absl::ToChronoTime(wake));
      }
      continue;
    }
    Replica& rep = replicas[*due];
    std::shared_ptr<internal::ChannelCore> old = std::move(rep.core);
    if (old != nullptr) {
      std::lock_guard<std::mutex> cl(old->mu);
      rep.last_error = old->broken;
    }
    const std::string address = rep.address;
    lock.unlock();
    if (old != nullptr) old->Shutdown();  // its calls already failed with Unavailable
    DialResult d = Dial(*due, address);
    lock.lock();
    Replica& again = replicas[*due];
    if (d.core.ok()) {
      if (closed) {
        lock.unlock();
        (*d.core)->Shutdown();
        lock.lock();
        break;
      }
      again.core = std::move(*d.core);
      again.last_error = absl::OkStatus();
      again.backoff = options.reconnect_backoff;
      again.next_attempt = absl::InfinitePast();
      ++again.connections;
      cv.notify_all();
    } else {
      again.last_error = d.core.status();
      again.next_attempt = absl::Now() + again.backoff;
      again.backoff = std::min(again.backoff * 2, options.max_reconnect_backoff);
    }
  }
}

absl::StatusOr<std::shared_ptr<Channel>> Channel::Impl::Open(
    std::shared_ptr<transport::Device> device, std::vector<std::string> addresses,
    std::vector<const ServiceDesc*> services, ChannelOptions options, bool single) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("rpc channel: no replica address given");
  }
  if (options.reconnect && (options.reconnect_backoff <= absl::ZeroDuration() ||
                            options.max_reconnect_backoff < options.reconnect_backoff)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc channel: reconnect_backoff (", absl::FormatDuration(options.reconnect_backoff),
        ") must be > 0 and <= max_reconnect_backoff (",
        absl::FormatDuration(options.max_reconnect_backoff), ")"));
  }
  auto impl = std::make_unique<Impl>();
  PLEXUS_ASSIGN_OR_RETURN(impl->window, internal::ResolveWindow(options.max_in_flight));
  PLEXUS_ASSIGN_OR_RETURN(impl->max_bytes,
                          internal::ResolveMaxMessageBytes(options.max_message_bytes));
  impl->codec.max_depth = options.max_depth;
  impl->options = options;
  impl->device = std::move(device);
  impl->services = std::move(services);
  for (const ServiceDesc* s : impl->services) impl->service_ids[s->id] = s;
  for (std::string& a : addresses) {
    Replica r;
    r.address = std::move(a);
    r.backoff = options.reconnect_backoff;
    impl->replicas.push_back(std::move(r));
  }
  if (!single && !options.balance.empty()) {
    PLEXUS_ASSIGN_OR_RETURN(BalancePolicy policy, ParseBalancePolicy(options.balance));
    PLEXUS_ASSIGN_OR_RETURN(auto lb, LoadBalancePolicy::Create("balance", {.policy = policy}));
    PLEXUS_RETURN_IF_ERROR(impl->chain->Attach(std::move(lb)));
  }
  // Dial every replica; the Impl lives at a stable address from here (the connections' on_break
  // point at it).
  size_t connected = 0;
  absl::Status first_error;
  for (uint32_t r = 0; r < impl->replicas.size(); ++r) {
    DialResult d = impl->Dial(r, impl->replicas[r].address);
    Replica& rep = impl->replicas[r];
    if (d.core.ok()) {
      rep.core = std::move(*d.core);
      rep.connections = 1;
      ++connected;
      continue;
    }
    if (single || d.refused) {
      for (Replica& other : impl->replicas) {
        if (other.core) other.core->Shutdown();
      }
      if (single) return d.core.status();
      return base::Annotate(d.core.status(), absl::StrCat("replica ", r, " (", rep.address, ")"));
    }
    rep.last_error = d.core.status();
    rep.next_attempt = absl::Now() + rep.backoff;
    if (first_error.ok()) first_error = d.core.status();
  }
  if (connected == 0) {
    return base::Annotate(first_error,
                          absl::StrCat("rpc channel: none of the ", impl->replicas.size(),
                                       " replicas is reachable; first"));
  }
  if (options.reconnect) {
    Impl* raw = impl.get();
    impl->connector = std::thread([raw] { raw->Connector(); });
  }
  return std::shared_ptr<Channel>(new Channel(std::move(impl)));
}

Channel::Channel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Channel::~Channel() { Close(); }

void Channel::Close() {
  Impl& impl = *impl_;
  std::vector<std::shared_ptr<internal::ChannelCore>> cores;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    if (impl.closed) return;
    impl.closed = true;
    impl.cv.notify_all();
  }
  if (impl.connector.joinable()) impl.connector.join();
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    for (auto& r : impl.replicas) {
      if (r.core) cores.push_back(r.core);
    }
  }
  for (auto& c : cores) c->Shutdown();
}

EngineChain& Channel::engines() { return *impl_->chain; }

absl::Status Channel::status() const {
  std::vector<std::shared_ptr<internal::ChannelCore>> cores;
  absl::Status why;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& r : impl_->replicas) {
      if (r.core != nullptr && r.core->up.load()) return absl::OkStatus();
      if (r.core != nullptr) cores.push_back(r.core);
      if (why.ok()) why = r.last_error;
    }
  }
  for (const auto& c : cores) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (!c->broken.ok()) return c->broken;
  }
  return why.ok() ? absl::UnavailableError("rpc channel: not connected") : why;
}

std::string Channel::peer() const {
  std::string out;
  for (const auto& r : impl_->replicas) absl::StrAppend(&out, out.empty() ? "" : ",", r.address);
  return out;
}

std::vector<Channel::ReplicaInfo> Channel::Replicas() const {
  std::vector<ReplicaInfo> out;
  std::vector<std::shared_ptr<internal::ChannelCore>> cores;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& r : impl_->replicas) {
      out.push_back({r.address, r.last_error, 0, r.connections});
      cores.push_back(r.core);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (cores[i] == nullptr) {
      if (out[i].status.ok()) out[i].status = absl::UnavailableError("not connected");
      continue;
    }
    std::lock_guard<std::mutex> lock(cores[i]->mu);
    out[i].in_flight = cores[i]->in_flight;
    out[i].status = cores[i]->broken;
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Channel>> Channel::Connect(std::shared_ptr<transport::Device> device,
                                                          std::string_view address,
                                                          std::vector<const ServiceDesc*> services,
                                                          ChannelOptions options) {
  return Impl::Open(std::move(device), {std::string(address)}, std::move(services),
                    std::move(options), /*single=*/true);
}

absl::StatusOr<std::shared_ptr<Channel>> Channel::ConnectReplicas(
    std::shared_ptr<transport::Device> device, std::vector<std::string> addresses,
    std::vector<const ServiceDesc*> services, ChannelOptions options) {
  return Impl::Open(std::move(device), std::move(addresses), std::move(services),
                    std::move(options), /*single=*/false);
}

std::shared_ptr<internal::CallState> Channel::StartCall(const ServiceDesc& service,
                                                        const MethodDesc& method,
                                                        const void* request,
                                                        const CallOptions& options,
                                                        RawCallback done) {
  Impl& impl = *impl_;
  auto call = std::make_shared<internal::CallState>();
  call->callback = std::move(done);
  call->info.service = &service;
  call->info.method = &method;
  call->info.start = absl::Now();
  if (options.timeout != absl::InfiniteDuration()) {
    call->deadline = call->info.start + options.timeout;
  }
  auto fail = [&](absl::Status st) {
    call->has_result = true;
    call->sent = true;
    call->result = std::move(st);
    internal::ChannelCore::Finalize(call);
    return call;
  };
  if (!impl.service_ids.contains(service.id)) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("service ", service.full_name, " was not named when the channel to ", peer(),
                     " was connected (its handshake checks each service's schema)")));
  }
  absl::Status st = internal::EncodeMessage(*method.request(), request, &call->encoded, impl.codec);
  if (!st.ok()) return fail(st);
  call->chain = impl.chain->snapshot();
  call->info.deadline = call->deadline;
  call->info.request = request;
  if (std::any_of(call->chain->begin(), call->chain->end(),
                  [](const auto& p) { return p->inspects_content(); })) {
    absl::StatusOr<const void*> copy =
        internal::PrivatizeRequest(*method.request(), impl.codec, call.get());
    if (!copy.ok()) return fail(copy.status());
    call->info.request = *copy;
  }
  for (const auto& p : *call->chain) {
    if (absl::Status ps = p->OnRequest(call->info); !ps.ok()) {
      call->info.request = nullptr;
      return fail(ps);
    }
  }
  call->info.request = nullptr;

  // The replicas' connections as of now; wait_for_ready waits (within the deadline) for one.
  const uint32_t n = static_cast<uint32_t>(impl.replicas.size());
  std::vector<std::shared_ptr<internal::ChannelCore>> cores(n);
  std::vector<bool> usable(n);
  {
    std::unique_lock<std::mutex> lock(impl.mu);
    auto snapshot = [&] {
      bool any = false;
      for (uint32_t r = 0; r < n; ++r) {
        cores[r] = impl.replicas[r].core;
        usable[r] = cores[r] != nullptr && cores[r]->up.load();
        any = any || usable[r];
      }
      return any || impl.closed;
    };
    if (!snapshot() && options.wait_for_ready && impl.options.reconnect) {
      if (call->deadline == absl::InfiniteFuture()) {
        impl.cv.wait(lock, snapshot);
      } else if (!impl.cv.wait_until(lock, absl::ToChronoTime(call->deadline), snapshot)) {
        lock.unlock();
        return fail(absl::DeadlineExceededError(
            absl::StrCat("deadline exceeded: ", service.full_name, "/", method.name, " to ", peer(),
                         " waited for a connection (wait_for_ready)")));
      }
    }
  }
  uint32_t r = 0;
  if (n > 1) {
    bool routed = false;
    for (const auto& p : *call->chain) {
      if (std::optional<uint32_t> to = p->Route(call->info, usable)) {
        r = *to;
        call->info.route_engine = p->name();
        routed = true;
        break;
      }
    }
    if (!routed) {
      const uint32_t from = static_cast<uint32_t>(impl.rotate.fetch_add(1) % n);
      r = from;
      for (uint32_t k = 0; k < n; ++k) {
        if (usable[(from + k) % n]) {
          r = (from + k) % n;
          break;
        }
      }
    } else if (r >= n) {
      return fail(absl::InternalError(absl::StrCat("engine '", call->info.route_engine,
                                                   "' routed a call to replica ", r, " of ", n)));
    }
  }
  call->info.replica = r;
  if (!usable[r]) {
    absl::Status why;
    if (cores[r] != nullptr) {
      std::lock_guard<std::mutex> lock(cores[r]->mu);
      why = cores[r]->broken;
    } else {
      std::lock_guard<std::mutex> lock(impl.mu);
      why = impl.replicas[r].last_error;
    }
    return fail(absl::UnavailableError(
        absl::StrCat("rpc channel to ", impl.replicas[r].address, " is not connected",
                     impl.options.reconnect ? " (reconnecting)" : "", ": ", why.message())));
  }
  if (absl::Status ss = cores[r]->Submit(call, options); !ss.ok()) return fail(ss);
  return call;
}

}  // namespace plexus::rpc
