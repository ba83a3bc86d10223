#include "plexus/rpc/channel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "conn.hpp"
#include "plexus/base/status.hpp"

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

struct ChannelCore : std::enable_shared_from_this<ChannelCore> {
  std::shared_ptr<transport::Device> device;
  std::unique_ptr<transport::CompletionQueue> cq;
  std::unique_ptr<transport::Connection> conn;
  ChannelOptions options;
  size_t window = 0;
  std::shared_ptr<BufferPool> pool;
  std::string peer;
  EngineChain chain;
  absl::flat_hash_map<uint32_t, const ServiceDesc*> services;
  CodecLimits codec;
  FrameLimits frame_limits;

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
      if (st.ok() && in->frame().header.type != FrameType::kResponse) {
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
      auto call_it = calls.find(h.call_id);
      if (call_it == calls.end()) return;  // cancelled or expired: dropped
      std::shared_ptr<CallState> call = call_it->second;
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
    transport::Completion batch[16];
    absl::Time drain_until = absl::InfiniteFuture();
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
      }
      for (auto& call : ready) Finalize(call);
      ready.clear();
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

struct Channel::Impl {
  std::shared_ptr<internal::ChannelCore> core;
};

Channel::Channel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Channel::~Channel() { Close(); }

void Channel::Close() {
  auto& core = impl_->core;
  if (!core->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->broken.ok()) core->broken = absl::CancelledError("rpc channel closed");
    core->conn->Close();
    core->stop = true;
  }
  core->thread.join();
}

EngineChain& Channel::engines() { return impl_->core->chain; }

absl::Status Channel::status() const {
  std::lock_guard<std::mutex> lock(impl_->core->mu);
  return impl_->core->broken;
}

std::string Channel::peer() const { return impl_->core->peer; }

absl::StatusOr<std::shared_ptr<Channel>> Channel::Connect(std::shared_ptr<transport::Device> device,
                                                          std::string_view address,
                                                          std::vector<const ServiceDesc*> services,
                                                          ChannelOptions options) {
  auto core = std::make_shared<internal::ChannelCore>();
  PLEXUS_ASSIGN_OR_RETURN(core->window, internal::ResolveWindow(options.max_in_flight));
  PLEXUS_ASSIGN_OR_RETURN(size_t max_bytes,
                          internal::ResolveMaxMessageBytes(options.max_message_bytes));
  core->options = options;
  core->codec.max_depth = options.max_depth;
  core->pool = std::make_shared<internal::BufferPool>(max_bytes, core->window * 2 + 2);
  core->device = device;
  core->peer = std::string(address);
  core->cq = device->CreateCompletionQueue();
  PLEXUS_ASSIGN_OR_RETURN(core->conn, device->Connect(address, core->cq.get()));
  for (const ServiceDesc* s : services) core->services[s->id] = s;

  // Handshake: the schema hash of every service, answered by the server's verdict.
  internal::OutFrame hello;
  internal::FrameHeader h;
  h.type = internal::FrameType::kHello;
  Metadata md;
  for (const ServiceDesc* s : services) {
    md.emplace_back(s->full_name, absl::StrFormat("%016x", s->schema_hash));
  }
  internal::BuildFrame(h, "", md, nullptr, &hello);
  internal::BufferPool::Buffer ack = core->pool->Take();
  PLEXUS_RETURN_IF_ERROR(core->conn->PostRecv({ack.get(), core->pool->bytes()}, 1));
  PLEXUS_RETURN_IF_ERROR(core->conn->PostSend(hello.parts, 2));
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  bool sent = false, received = false;
  size_t ack_bytes = 0;
  while (!(sent && received)) {
    auto c = core->cq->Wait(std::max(give_up - absl::Now(), absl::ZeroDuration()));
    if (!c.ok()) {
      core->conn->Close();
      return absl::DeadlineExceededError(
          absl::StrCat("rpc handshake with ", core->peer, ": no answer within ",
                       absl::FormatDuration(options.connect_timeout)));
    }
    if (!c->status.ok()) {
      core->conn->Close();
      return absl::UnavailableError(
          absl::StrCat("rpc handshake with ", core->peer, " failed: ", c->status.message()));
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
    core->conn->Close();
    return absl::InternalError(absl::StrCat("rpc handshake with ", core->peer, ": ", st.message()));
  }
  if (in.frame().header.status_code != 0) {
    core->conn->Close();
    return absl::Status(static_cast<absl::StatusCode>(in.frame().header.status_code),
                        absl::StrCat("rpc handshake with ", core->peer,
                                     " refused: ", std::string(in.frame().status_message)));
  }
  {
    std::lock_guard<std::mutex> lock(core->mu);
    for (size_t i = 0; i < core->window + 1; ++i) PLEXUS_RETURN_IF_ERROR(core->PostRecvLocked());
  }
  core->thread = std::thread([c = core.get()] { c->Run(); });
  return std::shared_ptr<Channel>(new Channel(std::make_unique<Impl>(Impl{std::move(core)})));
}

std::shared_ptr<internal::CallState> Channel::StartCall(const ServiceDesc& service,
                                                        const MethodDesc& method,
                                                        const void* request,
                                                        const CallOptions& options,
                                                        RawCallback done) {
  auto& core = impl_->core;
  auto call = std::make_shared<internal::CallState>();
  call->callback = std::move(done);
  call->channel = core;
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
  if (!core->services.contains(service.id)) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("service ", service.full_name, " was not named when the channel to ",
                     core->peer, " was connected (its handshake checks each service's schema)")));
  }
  absl::Status st =
      internal::EncodeMessage(*method.request(), request, &call->encoded, core->codec);
  if (!st.ok()) return fail(st);
  call->chain = core->chain.snapshot();
  call->info.deadline = call->deadline;
  call->info.request = request;
  if (std::any_of(call->chain->begin(), call->chain->end(),
                  [](const auto& p) { return p->inspects_content(); })) {
    absl::StatusOr<const void*> copy =
        internal::PrivatizeRequest(*method.request(), core->codec, call.get());
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
  std::unique_lock<std::mutex> lock(core->mu);
  auto has_room = [&] { return core->in_flight < core->window || !core->broken.ok(); };
  if (call->deadline == absl::InfiniteFuture()) {
    core->window_cv.wait(lock, has_room);
  } else if (!core->window_cv.wait_until(lock, absl::ToChronoTime(call->deadline), has_room)) {
    lock.unlock();
    return fail(absl::DeadlineExceededError(
        absl::StrCat("deadline exceeded: ", service.full_name, "/", method.name, " to ", core->peer,
                     " waited for a window slot (", core->window, " calls in flight)")));
  }
  if (!core->broken.ok()) {
    absl::Status b = core->broken;
    lock.unlock();
    return fail(absl::UnavailableError(b.message()));
  }
  call->id = core->next_id++;
  call->info.call_id = call->id;
  internal::FrameHeader h;
  h.type = internal::FrameType::kRequest;
  h.call_id = call->id;
  h.service_id = service.id;
  h.method_id = method.id;
  h.deadline_us = internal::DeadlineBudgetUs(call->deadline);
  internal::BuildFrame(h, "", options.metadata, &call->encoded, &call->frame);
  call->info.request_bytes = call->frame.bytes;
  if (absl::Status ps = core->conn->PostSend(call->frame.parts, call->id); !ps.ok()) {
    lock.unlock();
    return fail(
        absl::UnavailableError(absl::StrCat("rpc connection to ", core->peer, ": ", ps.message())));
  }
  ++core->in_flight;
  core->calls.emplace(call->id, call);
  core->sending.emplace(call->id, call);
  if (call->deadline != absl::InfiniteFuture()) core->deadlines.emplace(call->deadline, call->id);
  return call;
}

}  // namespace plexus::rpc
