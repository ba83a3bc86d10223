#include "plexus/rpc/server.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "conn.hpp"
#include "plexus/base/clock.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/rpc/balance.hpp"
#include "server_impl.hpp"

namespace plexus::rpc {

std::string_view ServerContext::CopyString(std::string_view s) {
  char* p = static_cast<char*>(Allocate(s.size(), 1));
  std::memcpy(p, s.data(), s.size());
  return std::string_view(p, s.size());
}

namespace internal {
namespace {
constexpr uint64_t kServerControlBit = uint64_t{1} << 62;
// Responses gathered into one batch at most (and at most the client's receive buffer).
constexpr size_t kMaxResponsesPerBatch = 256;
// The server whose dispatcher runs on this thread, while it handles a round of completions.
thread_local const ServerCore* round_of = nullptr;
}  // namespace

uint32_t ServerCore::ChangeLoad(int delta) {
  std::optional<uint32_t> announce;
  uint32_t now;
  {
    std::lock_guard<std::mutex> lock(load_mu);
    load = delta < 0 && load == 0 ? 0 : static_cast<uint32_t>(static_cast<int64_t>(load) + delta);
    now = load;
    announce = trigger.Observe(load);
    // Forwarding: the balancer's local replica (0) is this server, counted exactly.
    if (Forwarding* f = forwarding.load()) {
      if (delta > 0) {
        (void)f->balancer->OnSend(0);
      } else if (f->balancer->outstanding(0) > 0) {
        (void)f->balancer->OnResponse(0, std::nullopt);
      }
    }
  }
  if (announce) BroadcastLoad(*announce);
  return now;
}

uint32_t ServerCore::CurrentLoad() {
  std::lock_guard<std::mutex> lock(load_mu);
  return load;
}

void ServerCore::BroadcastLoad(uint32_t value) {
  std::vector<std::shared_ptr<ServerConn>> targets;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [id, sc] : conns) targets.push_back(sc);
  }
  for (auto& sc : targets) {
    std::lock_guard<std::mutex> lock(sc->mu);
    if (sc->dead || !sc->wants_load || !sc->hello_done) continue;
    auto f = std::make_unique<OutFrame>();
    FrameHeader h;
    h.type = FrameType::kLoad;
    h.flags = kFlagLoad;
    h.load = value;
    BuildFrame(h, "", {}, nullptr, f.get());
    const uint64_t wr = kServerControlBit | sc->next_wr++;
    if (sc->conn->PostSend(f->parts, wr).ok()) sc->controls.emplace(wr, std::move(f));
  }
}

absl::Status ServerConn::PostRecvLocked() {
  if (dead) return absl::OkStatus();
  BufferPool::Buffer b = server->pool->Take();
  const uint64_t wr = (uint64_t{1} << 63) | next_wr++;
  PLEXUS_RETURN_IF_ERROR(conn->PostRecv({b.get(), server->pool->bytes()}, wr));
  recvs.emplace(wr, std::move(b));
  ++posted;
  return absl::OkStatus();
}

absl::Status ServerConn::RefillLocked() {
  // A refused connection (or one whose handshake failed) is closed once the answer has left.
  while (!dead && !close_after_ack && posted < want && posted + held < server->window) {
    PLEXUS_RETURN_IF_ERROR(PostRecvLocked());
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<ServerCallImpl>> ServerConn::TakeUnsentLocked() {
  std::vector<std::shared_ptr<ServerCallImpl>> out;
  for (auto& [wr, batch] : sending) batch.ForEach([&](const auto& call) { out.push_back(call); });
  sending.clear();
  for (auto& call : outbox) out.push_back(std::move(call));
  outbox.clear();
  outbox_bytes = 0;
  return out;
}

absl::Status ServerConn::FlushLocked(Ended* ended) {
  if (outbox.empty()) return absl::OkStatus();
  Sending batch;
  outbox_bytes = 0;
  absl::Span<const Part> parts;
  if (outbox.size() == 1) {
    batch.one = std::move(outbox[0]);
    outbox.clear();  // keeps its capacity
    parts = batch.one->frame().parts;
  } else {
    batch.calls.swap(outbox);
    size_t bytes = 0;
    for (const auto& c : batch.calls) AppendToBatch(c->frame(), &batch.parts, &bytes);
    parts = batch.parts;
  }
  const uint64_t wr = next_wr++;
  absl::StatusOr<bool> st = conn->SendNowOrPost(parts, wr);
  if (!st.ok()) {
    batch.ForEach([&](const std::shared_ptr<ServerCallImpl>& c) { ended->push_back(c); });
    return st.status();
  }
  if (!*st) {
    sending.emplace(wr, std::move(batch));
    return absl::OkStatus();
  }
  // Left whole: no completion follows.
  batch.ForEach([&](const std::shared_ptr<ServerCallImpl>& c) { ended->push_back(c); });
  return ResponsesLeftLocked(batch.size());
}

absl::Status ServerConn::ResponsesLeftLocked(size_t n) {
  held -= std::min(held, n);
  return RefillLocked();
}

void ServerCallImpl::Start(std::shared_ptr<ServerConn> conn, std::shared_ptr<Inbound> in) {
  conn_ = std::move(conn);
  in_ = std::move(in);
  const FrameHeader& h = in_->frame().header;
  call_id_ = h.call_id;
  info_.call_id = h.call_id;
  info_.server_side = true;
  info_.request_bytes = in_->bytes().size();
  wants_load_ = conn_->wants_load;  // set by the hello, on the dispatcher's thread, as this is
  if (h.deadline_us != 0) {
    StampStart();
    deadline_ = info_.start + absl::Microseconds(h.deadline_us);
  }
}

void ServerCallImpl::StampStart() {
  if (info_.start == absl::Time()) info_.start = base::WallNow();
}

void ServerCallImpl::Recycle() {
  conn_.reset();
  in_.reset();
  call_id_ = 0;
  info_ = CallInfo();
  deadline_ = absl::InfiniteFuture();
  cancelled_.store(false, std::memory_order_relaxed);
  finished_.store(false, std::memory_order_relaxed);
  counted_ = false;
  wants_load_ = false;
  qos_slot_ = false;
  runs_inline_ = false;
  response_md_.clear();
  arena_.Reset();
  response_ = nullptr;
  reply_.reset();
  encoded_.Clear();
  frame_.parts.clear();  // the head keeps its capacity (BuildFrame resizes it)
  frame_.bytes = 0;
  status_ = absl::OkStatus();
  chain_.reset();
}

void ServerCallImpl::Bind(const ServiceDesc* s, const MethodDesc* m) {
  info_.service = s;
  info_.method = m;
  const MessageDesc& rd = *m->response();
  response_ = arena_.Allocate(rd.size, rd.align);
  rd.construct(response_);
}

void ServerCallImpl::Count() {
  counted_ = true;
  conn_->server->ChangeLoad(+1);
}

void ServerCallImpl::AddResponseMetadata(std::string key, std::string value) {
  std::lock_guard<std::mutex> lock(md_mu_);
  response_md_.emplace_back(std::move(key), std::move(value));
}

void* ServerCallImpl::Allocate(size_t bytes, size_t align) {
  std::lock_guard<std::mutex> lock(md_mu_);
  return arena_.Allocate(bytes, align);
}

void ServerCallImpl::set_request_for_policies(const void* request, uint64_t connection_id) {
  info_.request = request;
  info_.metadata = request != nullptr ? &in_->metadata() : nullptr;
  info_.connection_id = connection_id;
  info_.deadline = deadline_;
}

void ServerCallImpl::Relay(RawResult result) {
  if (!result.ok()) {
    Finish(result.status());
    return;
  }
  reply_ = std::move(*result);
  {
    std::lock_guard<std::mutex> lock(md_mu_);
    for (const auto& [k, v] : reply_->metadata()) response_md_.emplace_back(k, v);
  }
  // The response's views point into the peer's reply, which lives as long as this call.
  response_ = const_cast<void*>(reply_->message());
  Finish(absl::OkStatus());
}

void ServerCallImpl::Finish(absl::Status status) {
  if (finished_.exchange(true)) return;
  ServerCore* server = conn_->server;
  const uint32_t load = counted_ ? server->ChangeLoad(-1) : server->CurrentLoad();
  if (qos_slot_) server->qos.Done();
  FrameHeader h;
  h.type = FrameType::kResponse;
  h.call_id = call_id_;
  if (wants_load_) {
    h.flags = kFlagLoad;
    h.load = load;
  }
  if (info_.service) h.service_id = info_.service->id;
  if (info_.method) h.method_id = info_.method->id;
  if (status.ok() && info_.method) {
    absl::Status es = EncodeMessage(*info_.method->response(), response_, &encoded_);
    if (!es.ok()) {
      status = absl::InternalError(
          absl::StrCat("the server could not encode the response: ", es.message()));
    }
  }
  h.status_code = static_cast<uint32_t>(status.code());
  std::string msg(status.message());
  if (msg.size() > 4000) msg.resize(4000);
  BuildFrame(h, msg, response_md_, status.ok() && info_.method ? &encoded_ : nullptr, &frame_);
  info_.response_bytes = frame_.bytes;
  status_ = status;
  auto self = shared_from_this();
  absl::Status refused;
  bool dropped = false;
  ServerConn::Ended ended;
  const bool in_round = server->InRound();
  bool first_queued = false;
  {
    std::lock_guard<std::mutex> lock(conn_->mu);
    conn_->active.erase(call_id_);
    if (conn_->dead) {
      dropped = true;
    } else {
      ServerConn& sc = *conn_;
      // A response finished on the dispatcher's thread waits for the round's end, to leave with
      // the others of the round in one batch (when the client takes batches and it fits).
      if (!sc.outbox.empty() &&
          (sc.outbox.size() >= std::min(sc.peer_batch.frames, kMaxResponsesPerBatch) ||
           sc.outbox_bytes + frame_.bytes + kSegmentAlign > sc.peer_batch.bytes)) {
        refused = sc.FlushLocked(&ended);
      }
      if (!refused.ok()) {
        dropped = true;  // this response too: the connection is failing
      } else {
        sc.outbox.push_back(std::move(self));
        sc.outbox_bytes += frame_.bytes + kSegmentAlign;
        if (!in_round || sc.peer_batch.frames <= 1) {
          refused = sc.FlushLocked(&ended);
        } else {
          // A piece of the round (conn.hpp, PieceFrames) leaves now, the rest when it ends.
          first_queued = !sc.in_flush_list;
          sc.in_flush_list = true;
          server->pieces.Queued();
          if (PieceFull(sc.outbox.size(), sc.outbox_bytes, sc.round_piece)) {
            refused = sc.FlushLocked(&ended);
            server->pieces.PieceLeft();
          }
        }
      }
    }
  }
  if (first_queued) server->flush_list.push_back(conn_);
  if (refused.ok() && !dropped && ended.empty()) return;
  // The transport refuses posts only on a failed connection (the client is gone): no
  // completion will ever come for it, so drop it now, or it would stay in Connections() with
  // its held requests until Shutdown. Outside conn_->mu: Kill takes it, then the server's.
  if (!refused.ok()) conn_->server->Kill(conn_, refused);
  // The response is dropped, but the call ended: the policies see it end (an admission count
  // or a metrics engine must not keep it outstanding for ever).
  if (dropped) Sent();
  for (auto& c : ended) c->Sent();
}

bool ServerCore::InRound() const { return round_of == this; }

void ServerCore::EndRound() {
  std::vector<std::shared_ptr<ServerConn>>& conns = flushing;  // capacity kept across rounds
  conns.swap(flush_list);
  for (auto& sc : conns) {
    ServerConn::Ended ended;
    absl::Status st;
    {
      std::lock_guard<std::mutex> lock(sc->mu);
      sc->in_flush_list = false;
      if (sc->dead) {
        for (auto& c : sc->outbox) ended.push_back(std::move(c));
        sc->outbox.clear();
        sc->outbox_bytes = 0;
      } else {
        st = sc->FlushLocked(&ended);
      }
    }
    if (!st.ok()) Kill(sc, st);
    for (auto& c : ended) c->Sent();
  }
  conns.clear();
}

void ServerCallImpl::Sent() {
  if (chain_) {
    for (const auto& p : *chain_) p->OnComplete(info_, status_);
  }
}

void ServerCore::Dispatch() {
  transport::Completion batch[64];
  // Spin before sleeping only while that pays (not when the clients share this CPU).
  base::AdaptiveSpin spin(PollerSpin(*device));
  size_t last_round = 0;
  while (!stop.load()) {
    // Busy (the last round handled several completions): take what is there first. One call at
    // a time: wait at once (in ProgressMode::kCaller one system call per message).
    // Completions queued already (our own sends) are taken without driving the transport.
    size_t n = 0;
    if (pieces.TakePieced()) {
      // The last round left in pieces: it paid when a client's next requests are here now (it
      // ran beside this thread); with the clients on this CPU nothing can be here yet.
      n = cq->Poll(absl::MakeSpan(batch));
      pieces.Learn(std::any_of(batch, batch + n, [](const transport::Completion& c) {
        return c.opcode == transport::Opcode::kRecv;
      }));
    } else if (const size_t queued = cq->size(); queued > 0) {
      n = cq->Poll(absl::MakeSpan(batch, std::min<size_t>(queued, 64)));
    } else if (last_round > 1) {
      n = cq->Poll(absl::MakeSpan(batch));
    }
    const absl::Duration spun = n == 0 ? spin.spin() : absl::ZeroDuration();
    const bool timed = spun > absl::ZeroDuration();  // only spinning waits teach AdaptiveSpin
    // Before a spin, one pass for what is there already: a request that came while this thread
    // was descheduled (its client shares the CPU) says nothing about spinning (as in Channel).
    if (n == 0 && timed) n = cq->Poll(absl::MakeSpan(batch));
    if (n == 0) {
      const absl::Time start = timed ? absl::Now() : absl::InfinitePast();
      auto c = cq->Wait(absl::Milliseconds(50), spun);
      if (!c.ok()) continue;
      if (timed) spin.Record(spun, absl::Now() - start);
      batch[0] = std::move(*c);
      n = 1;
      // And what is queued already, without driving the transport again.
      if (const size_t more = std::min<size_t>(cq->size(), 63); more > 0) {
        n += cq->Poll(absl::MakeSpan(batch + 1, more));
      }
    }
    last_round = n;
    // Run to completion: parse, chain and handler of each call on this thread; the responses
    // finished meanwhile leave together, one batch per connection, in pieces while those pay
    // (conn.hpp) and when the round ends.
    round_of = this;
    pieces.StartRound();
    for (size_t i = 0; i < n; ++i) Handle(batch[i]);
    round_of = nullptr;
    EndRound();
  }
  EndRound();
}

void ServerCore::Handle(const transport::Completion& c) {
  std::shared_ptr<ServerConn> sc;
  if (cached_conn != nullptr && c.connection_id == cached_id &&
      conns_epoch.load(std::memory_order_acquire) == cached_epoch) {
    sc = cached_conn;  // still in `conns` (a removal bumps the epoch)
  } else {
    std::lock_guard<std::mutex> lock(mu);
    auto it = conns.find(c.connection_id);
    if (it == conns.end()) return;
    sc = it->second;
    cached_id = c.connection_id;
    cached_epoch = conns_epoch.load(std::memory_order_relaxed);
    cached_conn = sc;
  }
  if (c.opcode == transport::Opcode::kSend) {
    ServerConn::Sending sent;
    bool close = false;
    absl::Status refill;
    {
      std::lock_guard<std::mutex> lock(sc->mu);
      auto it = sc->sending.find(c.wr_id);
      if (it != sc->sending.end()) {
        sent = std::move(it->second);
        sc->sending.erase(it);
      }
      if (!sc->controls.empty()) sc->controls.erase(c.wr_id);
      close = sc->close_after_ack && c.wr_id == 0;
      if (sent.size() > 0) {
        refill = sc->ResponsesLeftLocked(sent.size());
      } else if (c.wr_id == 0) {
        refill = sc->RefillLocked();
      }
    }
    sent.ForEach([](const std::shared_ptr<ServerCallImpl>& call) { call->Sent(); });
    if (close || !c.status.ok()) Kill(sc, c.status);
    if (!refill.ok()) Kill(sc, refill);
    return;
  }
  if (c.opcode != transport::Opcode::kRecv) return;
  BufferPool::Buffer buf;
  bool batches;
  {
    std::lock_guard<std::mutex> lock(sc->mu);
    auto it = sc->recvs.find(c.wr_id);
    if (it == sc->recvs.end()) return;
    buf = std::move(it->second);
    sc->recvs.erase(it);
    --sc->posted;
    batches = sc->hello_done && sc->peer_batch.frames > 1;
  }
  if (!c.status.ok()) {
    Kill(sc, c.status);
    return;
  }
  std::vector<std::shared_ptr<Inbound>>& frames = frames_scratch;  // the dispatcher's only
  frames.clear();
  absl::Status st = SplitFrames(std::make_shared<RecvBuffer>(pool, std::move(buf), c.bytes),
                                batches, frame_limits, &frames);
  // A batch takes at most a window of calls (the client was told so in the handshake).
  if (st.ok() && frames.size() > window) {
    st = absl::ResourceExhaustedError(absl::StrCat("a batch of ", frames.size(),
                                                   " frames from a client, over the window of ",
                                                   window, " calls per connection"));
  }
  if (!st.ok()) {
    frames.clear();
    Kill(sc, st);  // a peer that sends garbage is not talked to any more
    return;
  }
  size_t requests = 0;
  for (const auto& in : frames) requests += in->frame().header.type == FrameType::kRequest;
  // Requests are counted before their handlers run: a response that leaves within its Finish
  // takes its request back there (FlushLocked), a response sent later when its send completes.
  // The receive this message took is replaced now, before the handlers: the next message can
  // land while they run.
  absl::Status refill;
  if (requests > 0) {
    std::lock_guard<std::mutex> lock(sc->mu);
    sc->held += requests;
    sc->requests += requests;
    // The client keeps this many in flight: keep receives posted for at least as many more.
    if (sc->held >= sc->want) sc->want = std::min(window, std::max(sc->want * 2, sc->held + 1));
    if (sc->hello_done) refill = sc->RefillLocked();
  }
  sc->round_piece = pieces.PieceFor(requests);
  for (auto& in : frames) HandleFrame(sc, std::move(in));
  frames.clear();
  if (requests == 0) {  // a handshake or a cancel: replaced once it was handled
    std::lock_guard<std::mutex> lock(sc->mu);
    if (sc->hello_done) refill = sc->RefillLocked();
  }
  if (!refill.ok()) Kill(sc, refill);
}

void ServerCore::HandleFrame(const std::shared_ptr<ServerConn>& sc, std::shared_ptr<Inbound> in) {
  const FrameHeader& h = in->frame().header;
  if (h.type == FrameType::kHello) {
    absl::Status verdict;
    if (sc->refused) {
      verdict = absl::ResourceExhaustedError(
          absl::StrCat("the rpc server serves at most ", options.max_connections,
                       " connections at once (ServerOptions::max_connections); try again later"));
    }
    for (const auto& [name, hash] : in->frame().metadata) {
      if (!verdict.ok()) break;
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        std::string served;
        for (const auto& [n, s] : by_name) absl::StrAppend(&served, served.empty() ? "" : ", ", n);
        verdict = absl::NotFoundError(absl::StrCat("service ", std::string(name),
                                                   " is not served here (serves: ", served, ")"));
        break;
      }
      const std::string mine = absl::StrFormat("%016x", it->second->descriptor().schema_hash);
      if (mine != hash) {
        verdict = absl::FailedPreconditionError(absl::StrCat(
            "service ", std::string(name), ": schema hash mismatch: client 0x", std::string(hash),
            ", server 0x", mine, " (regenerate both sides from the same .proto)"));
        break;
      }
    }
    std::lock_guard<std::mutex> lock(sc->mu);
    if (sc->hello_done) return;
    sc->hello_done = verdict.ok();
    sc->wants_load = (h.flags & kFlagLoad) != 0;
    sc->close_after_ack = !verdict.ok();
    sc->ack = std::make_unique<OutFrame>();
    FrameHeader a;
    a.type = FrameType::kHelloAck;
    a.status_code = static_cast<uint32_t>(verdict.code());
    Metadata ack_md;
    // Batches both ways when the client takes them: it may send up to a window of requests in
    // one message of at most our receive buffer, we send responses up to its receive buffer.
    if ((h.flags & kFlagBatch) != 0 && h.deadline_us >= kFixedHeaderBytes && verdict.ok()) {
      sc->peer_batch = {kMaxResponsesPerBatch, h.deadline_us};
      a.flags = kFlagBatch;
      ack_md.emplace_back(std::string(kBatchLimitsKey),
                          absl::StrCat(window, " ", std::min<size_t>(pool->bytes(), UINT32_MAX)));
    }
    BuildFrame(a, std::string(verdict.message()), ack_md, nullptr, sc->ack.get());
    (void)sc->conn->PostSend(sc->ack->parts, 0);  // completion (wr 0) reposts the receive
    return;
  }
  if (h.type == FrameType::kCancel) {
    std::shared_ptr<ServerCallImpl> call;
    {
      std::lock_guard<std::mutex> lock(sc->mu);
      auto it = sc->active.find(h.call_id);
      if (it != sc->active.end()) call = it->second.lock();
    }
    if (call) call->Cancel();
    return;
  }
  if (h.type != FrameType::kRequest) {
    Kill(sc, absl::InvalidArgumentError("a client sent a non-request frame"));
    return;
  }
  std::shared_ptr<ServerCallImpl> call = call_pool->Take();
  call->Start(sc, in);
  bool hello_done;
  {
    std::lock_guard<std::mutex> lock(sc->mu);
    hello_done = sc->hello_done;
    if (hello_done) sc->active.emplace(h.call_id, call);
  }
  if (!hello_done) {
    Kill(sc, absl::FailedPreconditionError("request before the handshake"));
    return;
  }
  auto sit = services.find(h.service_id);
  if (sit == services.end()) {
    call->Finish(
        absl::UnimplementedError(absl::StrCat("service id ", h.service_id, " is not served here")));
    return;
  }
  ServiceBase* service = sit->second.service;
  const ServiceDesc& sd = service->descriptor();
  if (h.method_id >= sd.method_count) {
    call->Finish(
        absl::UnimplementedError(absl::StrCat("service ", sd.full_name, " has no method ",
                                              h.method_id, " (it has ", sd.method_count, ")")));
    return;
  }
  const MethodDesc& md = sd.methods[h.method_id];
  call->Bind(&sd, &md);
  call->set_runs_inline(handlers == nullptr || sit->second.never_block[h.method_id]);
  if (absl::Status ds = in->Decode(*md.request(), codec); !ds.ok()) {
    call->Finish(absl::InvalidArgumentError(
        absl::StrCat("request of ", sd.full_name, "/", md.name, ": ", ds.message())));
    return;
  }
  auto chain_snapshot = chain.snapshot();
  if (!chain_snapshot->empty()) call->StampStart();  // engines see the start (metrics latency)
  call->set_chain(chain_snapshot);
  // The request was decoded in place in this server's receive buffer: no handler has it yet, so
  // content policies check exactly what the handler will get.
  call->set_request_for_policies(in->message(), sc->conn->id());
  for (const auto& p : *chain_snapshot) {
    if (absl::Status ps = p->OnRequest(call->info()); !ps.ok()) {
      call->set_request_for_policies(nullptr, sc->conn->id());
      call->Finish(ps);
      return;
    }
  }
  std::optional<QosVerdict> verdict;
  for (const auto& p : *chain_snapshot) {
    if ((verdict = p->Classify(call->info()))) break;
  }
  call->set_request_for_policies(nullptr, sc->conn->id());
  Route(call, service, h.method_id, (h.flags & kFlagForwarded) != 0, verdict);
}

void ServerCore::Route(const std::shared_ptr<ServerCallImpl>& call, ServiceBase* service,
                       uint32_t method_id, bool forwarded_to_us,
                       const std::optional<QosVerdict>& verdict) {
  if (std::optional<uint32_t> peer = ForwardTarget(forwarded_to_us)) {
    Forward(call, *peer);
    return;
  }
  call->Count();  // Finish takes it back
  if (!verdict && !qos.Busy()) {
    service->Dispatch(method_id, call);
    return;
  }
  QosQueue::Job job;
  job.run = [call, service, method_id] {
    call->HoldsQosSlot();
    if (!call->FinishIfStale("queued for QoS")) service->Dispatch(method_id, call);
  };
  job.drop = [call] { call->Finish(absl::UnavailableError("the rpc server is shutting down")); };
  qos.Push(verdict ? verdict->cls : QosClass::kBulk, verdict ? &verdict->schedule : nullptr,
           std::move(job));
}

}  // namespace internal

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Create(std::shared_ptr<transport::Device> device,
                                                       ServerOptions options) {
  auto impl = std::make_unique<Impl>();
  auto& c = impl->core;
  PLEXUS_ASSIGN_OR_RETURN(c.window, internal::ResolveWindow(options.max_in_flight_per_connection));
  PLEXUS_ASSIGN_OR_RETURN(size_t max_bytes,
                          internal::ResolveMaxMessageBytes(options.max_message_bytes));
  if (options.idle_timeout <= absl::ZeroDuration() ||
      options.frame_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc server: idle_timeout (", absl::FormatDuration(options.idle_timeout),
                     ") and frame_timeout (", absl::FormatDuration(options.frame_timeout),
                     ") must be > 0 (InfiniteDuration: never)"));
  }
  c.pool = std::make_shared<internal::BufferPool>(max_bytes, c.window * 2 + 2);
  c.call_pool = std::make_shared<internal::Recycler<internal::ServerCallImpl>>(
      std::min<size_t>(c.window * 2 + 2, 1024));
  c.codec.max_depth = options.max_depth;
  if (options.handler_threads > 0) {
    c.handlers =
        std::make_unique<internal::HandlerPool>(options.handler_threads, options.handler_queue);
  }
  c.trigger = GossipTrigger(options.load_gossip_floor);
  c.options = std::move(options);
  c.device = std::move(device);
  c.cq = c.device->CreateCompletionQueue();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

absl::Status Server::Register(ServiceBase* service, std::vector<std::string> never_block) {
  auto& c = impl_->core;
  if (c.started) return absl::FailedPreconditionError("Register after Start");
  const ServiceDesc& d = service->descriptor();
  if (c.services.contains(d.id)) {
    return absl::AlreadyExistsError(absl::StrCat("service ", d.full_name, " already registered"));
  }
  internal::ServerCore::Served served{service, std::vector<bool>(d.method_count, false)};
  for (const std::string& name : never_block) {
    auto m = std::find_if(d.methods, d.methods + d.method_count,
                          [&](const MethodDesc& md) { return name == md.name; });
    if (m == d.methods + d.method_count) {
      std::string has;
      for (size_t i = 0; i < d.method_count; ++i) {
        absl::StrAppend(&has, i == 0 ? "" : ", ", d.methods[i].name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("Register(", d.full_name, "): never_block names method '", name,
                       "', which the service does not have (it has: ", has, ")"));
    }
    served.never_block[m->id] = true;
  }
  c.services[d.id] = std::move(served);
  c.by_name[d.full_name] = service;
  return absl::OkStatus();
}

absl::Status Server::Start() {
  auto& c = impl_->core;
  if (c.started) return absl::FailedPreconditionError("server already started");
  PLEXUS_ASSIGN_OR_RETURN(c.listener, c.device->Listen(c.options.address));
  c.address = c.listener->address();
  c.started = true;
  c.accept_thread = std::thread([&c] { c.Accept(); });
  c.dispatch_thread = std::thread([&c] { c.Dispatch(); });
  c.reap_thread = std::thread([&c] { c.Reap(); });
  return absl::OkStatus();
}

std::string Server::address() const { return impl_->core.address; }

void Server::Shutdown() {
  auto& c = impl_->core;
  if (c.stop.exchange(true)) return;
  c.StopForwarding();  // forwarded calls fail (Cancelled) while their clients can still hear it
  if (c.accept_thread.joinable()) c.accept_thread.join();
  c.listener.reset();
  std::vector<std::shared_ptr<internal::ServerConn>> conns;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [id, sc] : c.conns) conns.push_back(sc);
  }
  std::vector<std::shared_ptr<internal::ServerCallImpl>> calls;
  for (auto& sc : conns) {
    std::lock_guard<std::mutex> lock(sc->mu);
    sc->dead = true;
    sc->conn->Close();
    for (auto& [id, w] : sc->active) {
      if (auto call = w.lock()) calls.push_back(std::move(call));
    }
  }
  // Handlers that watch IsCancelled return early: their responses would be dropped.
  for (auto& call : calls) call->Cancel();
  calls.clear();
  // From here no queued call runs, and a call the dispatcher or the QoS scheduler still hands
  // over is refused (shutting down).
  if (c.handlers) c.handlers->Stop();
  if (c.dispatch_thread.joinable()) c.dispatch_thread.join();
  {
    std::lock_guard<std::mutex> lock(c.reap_mu);
    c.reap_stop = true;  // it closes what was handed over, then ends
  }
  c.reap_cv.notify_one();
  if (c.reap_thread.joinable()) c.reap_thread.join();
  c.qos.Stop();           // calls still queued are dropped (their connections are closed)
  c.cached_conn.reset();  // the dispatcher has stopped
  // Responses never sent on connections closed here (killed ones were let go by the reaper).
  for (auto& sc : conns) {
    std::vector<std::shared_ptr<internal::ServerCallImpl>> ended;
    {
      std::lock_guard<std::mutex> lock(sc->mu);
      ended = sc->TakeUnsentLocked();
    }
    for (auto& call : ended) call->Sent();  // the policies see them end
  }
  std::lock_guard<std::mutex> lock(c.mu);
  c.conns.clear();
  c.conns_epoch.fetch_add(1, std::memory_order_release);
}

EngineChain& Server::engines() { return impl_->core.chain; }

Server::QosStats Server::qos() const {
  internal::QosQueue::Stats s = impl_->core.qos.stats();
  return {s.latency, s.bulk, s.aged, s.shared, s.queued, s.max_queued};
}

std::vector<Server::ConnectionInfo> Server::Connections() const {
  auto& c = impl_->core;
  std::vector<std::shared_ptr<internal::ServerConn>> conns;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [id, sc] : c.conns) conns.push_back(sc);
  }
  std::vector<ConnectionInfo> out;
  for (auto& sc : conns) {
    std::lock_guard<std::mutex> lock(sc->mu);
    if (sc->dead || sc->refused) continue;
    out.push_back({sc->conn->id(), sc->peer, sc->active.size()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace plexus::rpc
