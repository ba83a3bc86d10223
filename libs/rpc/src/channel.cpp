#include "plexus/rpc/channel.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "channel_impl.hpp"
#include "client_qos.hpp"
#include "plexus/base/clock.hpp"
#include "private_request.hpp"

namespace plexus::rpc {
namespace internal {

void CallState::Recycle() {
  done = false;
  taken = false;
  promoted = false;
  result = NotCompleted();
  callback = nullptr;
  channel.reset();
  finished.store(false, std::memory_order_relaxed);
  retry.reset();
  attempt.reset();
  polling.store(false, std::memory_order_relaxed);
  id = 0;
  has_result = false;
  sent = false;
  async = false;
  deadline = absl::InfiniteFuture();
  encoded.Clear();
  private_arena.reset();
  frame.parts.clear();  // the head keeps its capacity (BuildFrame resizes it)
  frame.bytes = 0;
  info = CallInfo();
  forwarded = false;
  chain.reset();
  qos.reset();
  qos_counted = false;
}

}  // namespace internal

RawResult RawCall::Get() { return internal::WaitCall(*state_); }
bool RawCall::WaitFor(absl::Duration timeout) { return internal::WaitCallFor(*state_, timeout); }
void RawCall::Cancel() { internal::CancelCall(*state_); }

namespace internal {

RawResult WaitCall(CallState& call) {
  // The caller polls the connection itself (run-to-completion, no thread hop) when no other
  // blocking caller does; otherwise it waits for its result or for the role.
  std::shared_ptr<ChannelCore> ch = call.channel.lock();
  bool registered = false;
  while (ch != nullptr) {
    // `finished` is set (release) with `done`, under call.mu: no lock needed to see it.
    if (call.finished.load(std::memory_order_acquire)) break;
    bool lead = false;
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      if (!ch->leader && !ch->stop.load()) {
        ch->leader = true;
        lead = true;
        if (registered) {
          std::erase(ch->followers, &call);
          registered = false;
        }
      } else if (!registered) {
        ch->followers.push_back(&call);
        registered = true;
      }
    }
    if (lead) {
      ch->Lead(call);
      continue;
    }
    std::unique_lock<std::mutex> lock(call.mu);
    call.cv.wait(lock, [&] { return call.done || call.promoted; });
    if (call.done) break;
    call.promoted = false;  // taken: try for the role
  }
  if (registered) {
    std::lock_guard<std::mutex> lock(ch->mu);
    std::erase(ch->followers, &call);
  }
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
  if (call.qos != nullptr && call.qos->Cancel(call)) return;  // waiting in the QoS queue
  if (std::shared_ptr<RetryState> retry = call.retry.lock()) {
    // A retried call: no further try, and the one in flight (if any) is cancelled.
    retry->cancelled = true;
    std::shared_ptr<CallState> attempt;
    {
      std::lock_guard<std::mutex> lock(call.mu);
      attempt = call.attempt;
    }
    if (attempt != nullptr) CancelCall(*attempt);
    std::lock_guard<std::mutex> lock(retry->impl->mu);
    retry->impl->cv.notify_all();  // the connector completes it if it waits for a connection
    return;
  }
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
  // Its calls still queued for QoS fail now (their connections are closed).
  if (impl.qos) impl.qos->Kick();
  // Idempotent calls that waited to be tried again: the channel is gone.
  std::vector<std::shared_ptr<internal::RetryState>> retries;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    retries.swap(impl.retries);
  }
  for (auto& r : retries) Impl::Complete(r, absl::CancelledError("rpc channel closed"));
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

QosStats Channel::qos() const { return impl_->qos->stats(); }

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

RawCall Channel::StartCall(const ServiceDesc& service, const MethodDesc& method,
                           const void* request, const CallOptions& options, RawCallback done) {
  Impl& impl = *impl_;
  if (!method.idempotent || !impl.options.retry_idempotent || !impl.options.reconnect) {
    return internal::CallAccess::Make(
        impl.StartOnce(*this, service, method, request, options, std::move(done)));
  }
  // An idempotent method: the user holds `outer`; every try is a call of its own whose result
  // completes `outer`, or (Unavailable) goes back to the connector to be tried again.
  std::shared_ptr<internal::CallState> outer = impl.call_states->Take();
  outer->callback = std::move(done);
  outer->info.service = &service;
  outer->info.method = &method;
  outer->info.start = absl::Now();
  if (options.timeout != absl::InfiniteDuration()) {
    outer->deadline = outer->info.start + options.timeout;
  }
  auto retry = std::make_shared<internal::RetryState>();
  retry->outer = outer;
  retry->service = &service;
  retry->method = &method;
  retry->request = request;
  retry->options = options;
  retry->impl = &impl;
  outer->retry = retry;
  impl.Attempt(*this, retry);
  return internal::CallAccess::Make(std::move(outer));
}

void Channel::Impl::Complete(const std::shared_ptr<internal::RetryState>& retry, RawResult r) {
  if (retry->completed.exchange(true)) return;
  const std::shared_ptr<internal::CallState>& outer = retry->outer;
  outer->has_result = true;
  outer->sent = true;
  outer->result = std::move(r);
  internal::ChannelCore::Finalize(outer);
}

void Channel::Impl::Attempt(Channel& channel, const std::shared_ptr<internal::RetryState>& retry) {
  const std::shared_ptr<internal::CallState>& outer = retry->outer;
  if (retry->cancelled.load()) {
    Complete(retry,
             absl::CancelledError(absl::StrCat("call ", retry->service->full_name, "/",
                                               retry->method->name, " cancelled by the client")));
    return;
  }
  CallOptions o = retry->options;
  if (retry->attempts > 0) o.wait_for_ready = false;  // tried once a replica is connected
  if (outer->deadline != absl::InfiniteFuture()) {
    o.timeout = outer->deadline - absl::Now();
    if (o.timeout <= absl::ZeroDuration()) {
      Complete(retry, absl::DeadlineExceededError(absl::StrCat(
                          "deadline exceeded: ", retry->service->full_name, "/",
                          retry->method->name, " to ", channel.peer(), " after ", retry->attempts,
                          " tries (idempotent, retried on: ", retry->last.message(), ")")));
      return;
    }
  }
  ++retry->attempts;
  auto attempt = StartOnce(channel, *retry->service, *retry->method, retry->request, o,
                           [this, retry](RawResult r) { OnAttempt(retry, std::move(r)); });
  std::lock_guard<std::mutex> lock(outer->mu);
  if (!outer->done) outer->attempt = std::move(attempt);
}

void Channel::Impl::OnAttempt(const std::shared_ptr<internal::RetryState>& retry, RawResult r) {
  const absl::Time deadline = retry->outer->deadline;
  if (!r.ok() && r.status().code() == absl::StatusCode::kUnavailable && !retry->cancelled.load() &&
      retry->attempts < options.max_attempts &&
      (deadline == absl::InfiniteFuture() || absl::Now() < deadline)) {
    std::lock_guard<std::mutex> lock(mu);
    if (!closed) {
      retry->last = r.status();
      retries.push_back(retry);
      cv.notify_all();
      return;
    }
  }
  Complete(retry, std::move(r));
}

absl::Time Channel::Impl::RunRetries(std::unique_lock<std::mutex>& lock) {
  absl::Time wake = absl::InfiniteFuture();
  if (retries.empty()) return wake;
  bool any_up = false;
  for (const Replica& r : replicas) any_up = any_up || (r.core != nullptr && r.core->up.load());
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<internal::RetryState>> start, keep, expired;
  for (auto& r : retries) {
    if (r->cancelled.load() || r->outer->deadline <= now || any_up) {
      (any_up && !r->cancelled.load() && r->outer->deadline > now ? start : expired)
          .push_back(std::move(r));
    } else {
      wake = std::min(wake, r->outer->deadline);
      keep.push_back(std::move(r));
    }
  }
  retries.swap(keep);
  lock.unlock();
  // Attempt() completes the cancelled and expired ones with the right status.
  for (auto& r : expired) Attempt(*self, r);
  for (auto& r : start) Attempt(*self, r);
  lock.lock();
  return wake;
}

std::shared_ptr<internal::CallState> Channel::Impl::StartOnce(
    Channel& channel, const ServiceDesc& service, const MethodDesc& method, const void* request,
    const CallOptions& options, RawCallback done, bool forwarded) {
  Impl& impl = *this;
  std::shared_ptr<internal::CallState> call = impl.call_states->Take();
  call->callback = std::move(done);
  call->forwarded = forwarded;
  call->info.service = &service;
  call->info.method = &method;
  // The clock is read only when a deadline or an engine needs the start (below).
  if (options.timeout != absl::InfiniteDuration()) {
    call->info.start = base::WallNow();
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
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "service ", service.full_name, " was not named when the channel to ", channel.peer(),
        " was connected (its handshake checks each service's schema)")));
  }
  call->chain = impl.chain->snapshot();
  // What the engines take part in, read where it decides (an upgrade may change it meanwhile):
  // the clock and the classification cost per call and are skipped when no engine needs them.
  auto chain_hooks = [&] {
    uint32_t hooks = 0;
    for (const auto& p : *call->chain) hooks |= p->hooks();
    return hooks;
  };
  if (call->info.start == absl::Time() && (chain_hooks() & kReadsStart)) {
    call->info.start = base::WallNow();
  }
  call->info.deadline = call->deadline;
  call->info.request = request;
  // A content policy reads a private copy, made when the first one is reached and holding what
  // each reads (private_request.hpp); the request is marshalled from that copy once the chain
  // passed, so the bytes checked are the bytes sent.
  std::optional<internal::PrivateRequest> copy;
  if (!call->chain->empty()) {
    copy.emplace(*method.request(), request,
                 absl::MakeSpan(call->private_inline, sizeof call->private_inline),
                 &call->private_arena, impl.codec);
    for (const auto& p : *call->chain) {
      if (absl::Status ps = p->OnRequest(call->info, *copy); !ps.ok()) {
        call->info.request = nullptr;
        return fail(ps);
      }
    }
  }
  call->info.request = nullptr;
  absl::Status st = internal::EncodeMessage(*method.request(), copy ? copy->message() : request,
                                            &call->encoded, impl.codec);
  if (!st.ok()) return fail(st);
  // A scheduling engine's class for the QoS reorder point (the same rule as on a Server: the
  // metadata, the method, the size: here the encoded message and the fixed header).
  std::optional<QosVerdict> verdict;
  if (!call->chain->empty()) {
    call->info.request_bytes = internal::kFixedHeaderBytes + call->encoded.structure.size();
    for (uint64_t b : call->encoded.segment_bytes) call->info.request_bytes += b;
  }
  if (chain_hooks() & kHookClassify) {
    MetadataView md;
    if (!options.metadata.empty()) {
      for (const auto& [k, v] : options.metadata) md.emplace_back(k, v);
      call->info.metadata = &md;
    }
    for (const auto& p : *call->chain) {
      if ((verdict = p->Classify(call->info))) break;
    }
    call->info.metadata = nullptr;
  }

  // The replicas' connections as of now; wait_for_ready waits (within the deadline) for one.
  const uint32_t n = static_cast<uint32_t>(impl.replicas.size());
  // Inline for a few replicas: no allocation per call.
  absl::InlinedVector<std::shared_ptr<internal::ChannelCore>, 4> cores(n);
  absl::InlinedVector<bool, 4> usable(n);
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
            absl::StrCat("deadline exceeded: ", service.full_name, "/", method.name, " to ",
                         channel.peer(), " waited for a connection (wait_for_ready)")));
      }
    }
  }
  uint32_t r = 0;
  if (n > 1) {
    bool routed = false;
    const std::vector<bool> routable(usable.begin(), usable.end());  // the engines' type
    for (const auto& p : *call->chain) {
      if (std::optional<uint32_t> to = p->Route(call->info, routable)) {
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
  if (verdict || cores[r]->qos_queued.load(std::memory_order_relaxed) > 0) {
    if (absl::Status ss =
            impl.qos->Submit(call, cores[r], options, verdict ? verdict->cls : QosClass::kBulk,
                             verdict ? &verdict->schedule : nullptr);
        !ss.ok()) {
      return fail(ss);
    }
    return call;
  }
  if (absl::Status ss = cores[r]->Submit(call, options); !ss.ok()) return fail(ss);
  return call;
}

}  // namespace plexus::rpc
