// Dialling a Channel's replicas, the handshake, and redialling a connection that died.
#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "channel_impl.hpp"
#include "client_qos.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/balance.hpp"
#include "plexus/rpc/policies.hpp"

namespace plexus::rpc {

using internal::DialResult;

DialResult Channel::Impl::Dial(uint32_t r, const std::string& address) {
  DialResult out;
  auto core = std::make_shared<internal::ChannelCore>();
  core->window = window;
  core->options = options;
  core->codec = codec;
  core->pool = std::make_shared<internal::BufferPool>(max_bytes, window * 2 + 2);
  core->device = device;
  core->spin_ = base::AdaptiveSpin(internal::PollerSpin(*device));
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
  if (replicas.size() > 1 || options.load_reports) h.flags = internal::kFlagLoad;
  // We take batches of responses up to our receive buffer; the server says whether it does.
  h.flags |= internal::kFlagBatch;
  h.deadline_us = static_cast<uint32_t>(std::min<size_t>(core->pool->bytes(), UINT32_MAX));
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
    // A server at its connection limit may take the next dial: only other refusals are final.
    out.refused = in.frame().header.status_code !=
                  static_cast<uint32_t>(absl::StatusCode::kResourceExhausted);
    return fail(absl::Status(static_cast<absl::StatusCode>(in.frame().header.status_code),
                             absl::StrCat("rpc handshake with ", address,
                                          " refused: ", std::string(in.frame().status_message))));
  }
  if (in.frame().header.flags & internal::kFlagBatch) {
    for (const auto& [key, value] : in.frame().metadata) {
      if (key != internal::kBatchLimitsKey) continue;
      const std::string text(value);
      std::pair<std::string, std::string> fb = absl::StrSplit(text, absl::MaxSplits(' ', 1));
      uint64_t frames = 0, bytes = 0;
      if (!absl::SimpleAtoi(fb.first, &frames) || !absl::SimpleAtoi(fb.second, &bytes) ||
          frames < 1 || bytes < internal::kFixedHeaderBytes) {
        out.refused = true;
        return fail(absl::InternalError(absl::StrCat("rpc handshake with ", address, ": malformed ",
                                                     std::string(internal::kBatchLimitsKey), " \"",
                                                     text, "\" (want \"<frames> <bytes>\")")));
      }
      core->peer_batch = {static_cast<size_t>(frames), static_cast<size_t>(bytes)};
      core->batches_in = true;
    }
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
    absl::Time wake = RunRetries(lock);
    if (closed) break;
    const absl::Time now = absl::Now();
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
      again.backoff.Reset();
      again.next_attempt = absl::InfinitePast();
      ++again.connections;
      cv.notify_all();
    } else {
      again.last_error = d.core.status();
      again.next_attempt = absl::Now() + again.backoff.Next();
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
  impl->call_states =
      std::make_shared<internal::Recycler<internal::CallState>>(std::max<size_t>(impl->window, 8));
  PLEXUS_ASSIGN_OR_RETURN(impl->max_bytes,
                          internal::ResolveMaxMessageBytes(options.max_message_bytes));
  impl->codec.max_depth = options.max_depth;
  impl->options = options;
  impl->device = std::move(device);
  impl->qos = internal::ClientQos::ForDevice(impl->device);
  impl->services = std::move(services);
  for (const ServiceDesc* s : impl->services) impl->service_ids[s->id] = s;
  for (std::string& a : addresses) {
    Replica r;
    r.address = std::move(a);
    r.backoff = base::Backoff(options.reconnect_backoff, options.max_reconnect_backoff);
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
    rep.next_attempt = absl::Now() + rep.backoff.delay();
    if (first_error.ok()) first_error = d.core.status();
  }
  if (connected == 0) {
    return base::Annotate(first_error,
                          absl::StrCat("rpc channel: none of the ", impl->replicas.size(),
                                       " replicas is reachable; first"));
  }
  Impl* raw = impl.get();
  auto channel = std::shared_ptr<Channel>(new Channel(std::move(impl)));
  raw->self = channel.get();
  if (options.reconnect) raw->connector = std::thread([raw] { raw->Connector(); });
  return channel;
}

}  // namespace plexus::rpc
