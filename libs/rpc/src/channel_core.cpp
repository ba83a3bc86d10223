// One connection of a Channel (ChannelCore): completions handled run-to-completion by the thread
// that polls the connection (Run, or a blocking caller leading), batched sends, deadlines.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "channel_impl.hpp"
#include "client_qos.hpp"

namespace plexus::rpc::internal {
namespace {

// The connection whose Run thread is in a round on this thread: its requests wait in the outbox.
thread_local const ChannelCore* round_of = nullptr;
// Longest a parked Run thread sleeps before it looks again (a leader that left without telling
// it, because nothing needed it then).
constexpr absl::Duration kParkSlice = absl::Milliseconds(5);

}  // namespace

void ChannelCore::Finalize(const std::shared_ptr<CallState>& call) {
  if (call->qos_counted) {  // sent by the QoS reorder point: its slot is free
    call->qos_counted = false;
    call->qos->Done();
  }
  absl::Status st = call->result.ok() ? absl::OkStatus() : call->result.status();
  if (call->chain) {
    for (const auto& p : *call->chain) p->OnComplete(call->info, st);
  }
  Channel::RawCallback cb;
  bool wake_leader = false;
  {
    std::lock_guard<std::mutex> lock(call->mu);
    call->done = true;
    call->finished.store(true, std::memory_order_release);
    cb = std::move(call->callback);
    if (!cb) {
      call->cv.notify_all();
      wake_leader = call->polling.load(std::memory_order_acquire);
    }
  }
  if (wake_leader) {
    // Its caller polls the queue and was not the thread that completed it: interrupt its wait.
    if (std::shared_ptr<ChannelCore> ch = call->channel.lock()) {
      transport::Completion wake;
      wake.wr_id = kWakeId;
      ch->cq->Push(std::move(wake));
    }
  }
  if (cb) {
    RawResult r = std::move(call->result);
    call->taken = true;
    cb(std::move(r));
  }
}

bool ChannelCore::SetResult(const std::shared_ptr<CallState>& call, RawResult r) {
  if (call->has_result) return false;
  call->has_result = true;
  call->result = std::move(r);
  if (call->async) --async_in_flight;
  calls.erase(call->id);
  if (call->deadline != absl::InfiniteFuture()) {
    deadlines.erase({call->deadline, call->id});
    has_deadlines.store(!deadlines.empty(), std::memory_order_relaxed);
  }
  return ReleaseIfDone(call);
}

bool ChannelCore::ReleaseIfDone(const std::shared_ptr<CallState>& call) {
  if (!call->has_result || !call->sent) return false;
  --in_flight;
  window_cv.notify_one();
  return true;
}

void ChannelCore::SentLocked(CallState& call) {
  call.sent = true;
  call.encoded.Clear();
  call.private_arena.reset();
}

absl::Status ChannelCore::PostRecvLocked() {
  BufferPool::Buffer b = pool->Take();
  const uint64_t wr = kRecvBit | next_recv++;
  PLEXUS_RETURN_IF_ERROR(conn->PostRecv({b.get(), pool->bytes()}, wr));
  recvs.emplace(wr, std::move(b));
  return absl::OkStatus();
}

void ChannelCore::SendCancelLocked(uint64_t call_id) {
  if (!broken.ok()) return;
  auto f = std::make_unique<OutFrame>();
  FrameHeader h;
  h.type = FrameType::kCancel;
  h.call_id = call_id;
  BuildFrame(h, "", {}, nullptr, f.get());
  const uint64_t wr = kControlBit | next_control++;
  if (conn->PostSend(f->parts, wr).ok()) controls.emplace(wr, std::move(f));
}

void ChannelCore::BreakLocked(absl::Status why, std::vector<std::shared_ptr<CallState>>* ready) {
  if (broken.ok()) broken = why;
  up = false;
  std::vector<std::shared_ptr<CallState>> waiting;
  for (auto& [id, c] : calls) waiting.push_back(c);
  for (auto& c : waiting) {
    if (SetResult(c, broken)) ready->push_back(c);
  }
  window_cv.notify_all();
  run_cv.notify_all();
}

void ChannelCore::HandleFrame(const std::shared_ptr<Inbound>& in,
                              std::vector<std::shared_ptr<CallState>>* ready) {
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
    call->info.response_bytes = in->bytes().size();
    absl::Status ds = in->Decode(*call->info.method->response(), codec);
    if (ds.ok()) {
      r = std::shared_ptr<const InboundMessage>(in);
    } else {
      r = absl::InternalError(absl::StrCat("response of ", call->info.service->full_name, "/",
                                           call->info.method->name, " from ", peer, ": ",
                                           ds.message()));
    }
  }
  if (SetResult(call, std::move(r))) ready->push_back(call);
}

void ChannelCore::HandleLocked(const transport::Completion& c,
                               std::vector<std::shared_ptr<CallState>>* ready) {
  if (c.wr_id == kWakeId) return;
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
    // Every frame of the message (a batch of responses) is parsed in place in the buffer.
    std::vector<std::shared_ptr<Inbound>>& frames = frames_scratch;
    frames.clear();
    absl::Status st = SplitFrames(std::make_shared<RecvBuffer>(pool, std::move(buf), c.bytes),
                                  batches_in, frame_limits, &frames);
    for (const auto& in : frames) {
      if (st.ok() && in->frame().header.type != FrameType::kResponse &&
          in->frame().header.type != FrameType::kLoad) {
        st = absl::InvalidArgumentError("malformed rpc frame: type: a server sent a non-response");
      }
    }
    if (!st.ok()) {
      frames.clear();
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
    for (const auto& in : frames) HandleFrame(in, ready);
    frames.clear();
    return;
  }
  if (c.wr_id & kControlBit) {
    controls.erase(c.wr_id);
    return;
  }
  auto it = sending.find(c.wr_id);
  if (it == sending.end()) return;
  Sending sent = std::move(it->second);
  sending.erase(it);
  sent.ForEach([&](const std::shared_ptr<CallState>& call) {
    SentLocked(*call);
    if (!c.status.ok() && !call->has_result) {
      BreakLocked(absl::UnavailableError(
                      absl::StrCat("rpc connection to ", peer, " failed: ", c.status.message())),
                  ready);
    }
    if (ReleaseIfDone(call)) ready->push_back(call);
  });
}

void ChannelCore::ExpireLocked(std::vector<std::shared_ptr<CallState>>* ready) {
  if (deadlines.empty()) return;
  const absl::Time now = absl::Now();
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    const uint64_t id = deadlines.begin()->second;
    auto it = calls.find(id);
    if (it == calls.end()) {
      deadlines.erase(deadlines.begin());
      has_deadlines.store(!deadlines.empty(), std::memory_order_relaxed);
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

void ChannelCore::FlushLocked(std::vector<std::shared_ptr<CallState>>* ready) {
  if (outbox.empty()) return;
  Sending batch;
  outbox_bytes = 0;
  absl::Span<const Part> parts;
  if (outbox.size() == 1) {
    batch.one = std::move(outbox[0]);
    outbox.clear();  // keeps its capacity for the next round
    parts = batch.one->frame.parts;
  } else {
    batch.calls.swap(outbox);
    size_t bytes = 0;
    for (const auto& c : batch.calls) AppendToBatch(c->frame, &batch.parts, &bytes);
    parts = batch.parts;
  }
  const uint64_t wr = kSendBit | next_send++;
  absl::StatusOr<bool> st = conn->SendNowOrPost(parts, wr);
  if (!st.ok()) {
    // Refused only when the connection is down: its calls fail with the connection.
    batch.ForEach([](const std::shared_ptr<CallState>& c) { c->sent = true; });
    BreakLocked(absl::UnavailableError(
                    absl::StrCat("rpc connection to ", peer, ": ", st.status().message())),
                ready);
    batch.ForEach([&](const std::shared_ptr<CallState>& c) {
      if (ReleaseIfDone(c)) ready->push_back(c);
    });
    return;
  }
  if (*st) {  // left whole: no completion follows
    batch.ForEach([&](const std::shared_ptr<CallState>& c) {
      SentLocked(*c);
      if (ReleaseIfDone(c)) ready->push_back(c);
    });
    return;
  }
  sending.emplace(wr, std::move(batch));
}

void ChannelCore::Poll(absl::Duration wait, std::vector<std::shared_ptr<CallState>>* ready,
                       bool after_pieces) {
  // Per thread, not per poll: 64 completions (each with a Status) built and destroyed on every
  // poll were a visible share of a small call. Poll is not re-entered on a thread (no user code
  // runs inside it).
  thread_local transport::Completion batch[64];
  size_t n = 0;
  // A busy connection (the last round handled several completions): take what is there first.
  // One call at a time: wait at once (in ProgressMode::kCaller one system call per message).
  // Completions queued already (our own sends) are taken without driving the transport.
  if (after_pieces) {
    // A round that left in pieces paid when the server's answer to an early piece is here now
    // (it ran beside this thread); with the server on this CPU nothing can be here yet.
    n = cq->Poll(absl::MakeSpan(batch));
    pieces.Learn(std::any_of(batch, batch + n, [](const transport::Completion& c) {
      return c.wr_id != kWakeId && (c.wr_id & kRecvBit) != 0;
    }));
  } else if (const size_t queued = cq->size(); queued > 0) {
    n = cq->Poll(absl::MakeSpan(batch, std::min<size_t>(queued, 64)));
  } else if (last_round_.load(std::memory_order_relaxed) > 1) {
    n = cq->Poll(absl::MakeSpan(batch));
  }
  // Nothing but our own sends' completions (a request's, a cancel's): no call can complete from
  // them alone (a call completes once its response came too), so wait for the next completion
  // and handle them all in one round, in order: one lock and one pass of the caller's loop per
  // call instead of two. A wake-up or a receive among them returns at once, as before.
  const bool only_sends = n > 0 && n < 64 && std::all_of(batch, batch + n, [](const auto& c) {
                            return c.wr_id != kWakeId && (c.wr_id & kRecvBit) == 0;
                          });
  if ((n == 0 || only_sends) && wait > absl::ZeroDuration()) {
    // Spin first only while that pays (not when the server shares this CPU: it cannot answer
    // while we spin).
    const absl::Duration spin = options.poll ? wait : spin_.spin();
    const bool timed = !options.poll && spin > absl::ZeroDuration();  // what AdaptiveSpin learns
    const absl::Span<transport::Completion> room(batch + n, 64 - n);
    size_t got = 0;
    // Before a spin, one pass for what is there already: a response that came while this thread
    // was descheduled (its server shares the CPU and ran meanwhile) says nothing about spinning,
    // and counting it as a hit kept the spin on where it cannot pay (see docs/rpc.md).
    if (timed) got = cq->Poll(room);
    if (got == 0) {
      const absl::Time start = timed ? absl::Now() : absl::InfinitePast();
      auto c = cq->Wait(wait, spin);
      if (c.ok()) {
        if (timed) spin_.Record(spin, absl::Now() - start);
        room[0] = std::move(*c);
        got = 1;
        // And what is queued already, without driving the transport again.
        if (const size_t more = std::min<size_t>(cq->size(), room.size() - 1); more > 0) {
          got += cq->Poll(room.subspan(1, more));
        }
      }
    }
    n += got;
  } else if (n == 0) {
    n = cq->Poll(absl::MakeSpan(batch));  // wait 0: one pass
  }
  last_round_.store(n, std::memory_order_relaxed);
  // One lock for the whole round (completions, expiry, load reports); none when nothing came and
  // no call has a deadline.
  std::vector<uint32_t> loads;
  if (n > 0 || has_deadlines.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < n; ++i) HandleLocked(batch[i], ready);
    ExpireLocked(ready);
    if (!load_reports.empty()) loads.swap(load_reports);
  }
  if (!loads.empty()) {
    EngineChain::Snapshot engines = chain->snapshot();
    for (uint32_t load : loads) {
      for (const auto& p : *engines) p->OnLoadReport(replica, load);
    }
  }
}

void ChannelCore::Run() {
  std::vector<std::shared_ptr<CallState>> ready;
  absl::Time drain_until = absl::InfiniteFuture();
  bool told = false;
  while (true) {
    absl::Duration wait = absl::Milliseconds(5);
    {
      std::unique_lock<std::mutex> lock(mu);
      // A blocking caller polls the connection: stay out of its way (two pollers of one queue
      // would take each other's completions), and run the callbacks it hands over.
      // It also stays parked a while after a leader left while no callback waits: the next
      // blocking call of the same caller comes soon.
      auto parked = [&] {
        return !stop.load() && handoff.empty() && up.load() &&
               (leader || (async_in_flight == 0 && absl::Now() - leader_left < kParkSlice));
      };
      while (parked()) run_cv.wait_for(lock, absl::ToChronoNanoseconds(kParkSlice));
      ready.swap(handoff);
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
    // Run to completion: the callbacks of this round start their next calls into the outbox,
    // which leaves in pieces of a quarter of the round (conn.hpp, PieceFrames) and when the
    // round ends.
    round_of = this;
    const bool after_pieces = pieces.TakePieced();
    if (ready.empty()) Poll(wait, &ready, after_pieces);
    pieces.StartRound();
    round_piece = pieces.PieceFor(ready.size());
    for (auto& call : ready) Finalize(call);
    round_of = nullptr;
    ready.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      FlushLocked(&ready);
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
  for (auto& [wr, batch] : sending) {
    batch.ForEach([&](const std::shared_ptr<CallState>& call) {
      call->sent = true;
      if (ReleaseIfDone(call)) ready.push_back(call);
    });
  }
  sending.clear();
  for (auto& call : outbox) {
    call->sent = true;
    if (ReleaseIfDone(call)) ready.push_back(call);
  }
  outbox.clear();
  ready.insert(ready.end(), handoff.begin(), handoff.end());
  handoff.clear();
  for (auto& call : ready) Finalize(call);
}

void ChannelCore::Lead(CallState& call) {
  call.polling.store(true, std::memory_order_release);
  std::vector<std::shared_ptr<CallState>>& ready = lead_ready;  // the role's: one thread
  if (round_of == this) {
    // A blocking call made from a callback (on Run's thread, in its round) waits in the outbox
    // with the round's other requests: send them now, the round will not end before it returns.
    // (Called from any other thread, the outbox is Run's, which sends it when its round ends.)
    std::lock_guard<std::mutex> lock(mu);
    FlushLocked(&ready);
  }
  // Calls with callbacks that this leader completed go to Run (callbacks run on the channel's
  // thread); the others are finalized here. `async` was set by Submit under mu, before the call
  // could complete, and does not change: read without a lock.
  auto finalize = [&] {
    bool wake_run = false;
    for (const auto& c : ready) wake_run = wake_run || c->async;
    if (wake_run) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& c : ready) {
        if (c->async) handoff.push_back(std::move(c));
      }
    }
    if (wake_run) run_cv.notify_one();
    for (auto& c : ready) {
      if (c == nullptr) continue;                                                  // handed off
      if (c.get() == &call) call.polling.store(false, std::memory_order_release);  // no wake-up
      Finalize(c);
    }
    ready.clear();
  };
  while (!call.finished.load(std::memory_order_acquire) && !stop.load()) {
    absl::Duration wait = absl::Milliseconds(50);
    if (has_deadlines.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(mu);
      if (!deadlines.empty()) {
        wait = std::clamp(deadlines.begin()->first - absl::Now(), absl::ZeroDuration(), wait);
      }
    }
    Poll(wait, &ready);
    finalize();
  }
  finalize();  // what the flush above failed, when the call had completed meanwhile
  call.polling.store(false, std::memory_order_release);
  // Hand the role on: to a blocking caller still waiting, else back to Run (woken when it has
  // work: callbacks outstanding; otherwise it looks again within kParkSlice).
  std::lock_guard<std::mutex> lock(mu);
  leader = false;
  leader_left = absl::Now();
  for (CallState* f : followers) {
    std::lock_guard<std::mutex> fl(f->mu);
    if (f->done) continue;
    f->promoted = true;
    f->cv.notify_all();
    return;
  }
  if (async_in_flight > 0 || !handoff.empty() || !up.load()) run_cv.notify_one();
}

void ChannelCore::Shutdown() {
  if (!thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.ok()) broken = absl::CancelledError("rpc channel closed");
    up = false;
    conn->Close();
    stop = true;
    run_cv.notify_all();
  }
  thread.join();
}

absl::Status ChannelCore::Submit(const std::shared_ptr<CallState>& call,
                                 const CallOptions& options) {
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
  return SendLocked(call, options, lock);
}

std::optional<absl::Status> ChannelCore::TrySubmit(const std::shared_ptr<CallState>& call,
                                                   const CallOptions& options) {
  call->channel = weak_from_this();
  std::unique_lock<std::mutex> lock(mu);
  if (!broken.ok()) return absl::UnavailableError(broken.message());
  if (in_flight >= window) return std::nullopt;
  return SendLocked(call, options, lock);
}

absl::Status ChannelCore::SendLocked(const std::shared_ptr<CallState>& call,
                                     const CallOptions& options,
                                     std::unique_lock<std::mutex>& lock) {
  const ServiceDesc& service = *call->info.service;
  const MethodDesc& method = *call->info.method;
  std::vector<std::shared_ptr<CallState>> ready;
  call->id = next_id++;
  call->info.call_id = call->id;
  FrameHeader h;
  h.type = FrameType::kRequest;
  h.call_id = call->id;
  h.service_id = service.id;
  h.method_id = method.id;
  h.deadline_us = DeadlineBudgetUs(call->deadline);
  if (call->forwarded) h.flags |= kFlagForwarded;
  BuildFrame(h, "", options.metadata, &call->encoded, &call->frame);
  call->info.request_bytes = call->frame.bytes;
  const bool has_callback = static_cast<bool>(call->callback);
  bool piece_full = false;  // the outbox holds a piece of the round: it leaves now
  if (round_of == this && peer_batch.frames > 1) {
    // Started from a callback of Run's round: leaves with the round's other requests.
    if (outbox.size() >= peer_batch.frames ||
        outbox_bytes + call->frame.bytes + kSegmentAlign > peer_batch.bytes) {
      FlushLocked(&ready);
    }
    if (!broken.ok()) {
      lock.unlock();
      for (auto& c : ready) Finalize(c);
      return absl::UnavailableError(
          absl::StrCat("rpc connection to ", peer, ": ", broken.message()));
    }
    pieces.Queued();
    outbox.push_back(call);
    outbox_bytes += call->frame.bytes + kSegmentAlign;
    piece_full = PieceFull(outbox.size(), outbox_bytes, round_piece);
  } else {
    FlushLocked(&ready);  // what Run queued goes first (per-thread order is kept anyway)
    const uint64_t wr = kSendBit | next_send++;
    absl::StatusOr<bool> ps = broken.ok() ? conn->SendNowOrPost(call->frame.parts, wr)
                                          : absl::UnavailableError(broken.message());
    if (!ps.ok()) {
      lock.unlock();
      for (auto& c : ready) Finalize(c);
      return absl::UnavailableError(
          absl::StrCat("rpc connection to ", peer, ": ", ps.status().message()));
    }
    if (*ps) {
      SentLocked(*call);  // no completion follows
    } else {
      sending.emplace(wr, Sending{call, {}, {}});
    }
  }
  ++in_flight;
  call->async = has_callback;
  if (has_callback) ++async_in_flight;
  calls.emplace(call->id, call);
  if (call->deadline != absl::InfiniteFuture()) {
    deadlines.emplace(call->deadline, call->id);
    has_deadlines.store(true, std::memory_order_relaxed);
  }
  // After the call is registered: a send refused now fails it with the connection's other calls.
  if (piece_full) {
    FlushLocked(&ready);
    pieces.PieceLeft();
  }
  lock.unlock();
  for (auto& c : ready) Finalize(c);
  return absl::OkStatus();
}

}  // namespace plexus::rpc::internal
