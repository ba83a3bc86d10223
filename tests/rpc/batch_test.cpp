// Batches (several frames per transport message) and run-to-completion polling: the batch
// parser's checks, the handshake that agrees on batches, a raw client's batch of requests answered
// (and a batch over the window refused), and a Channel whose blocking callers poll the connection
// themselves while callbacks keep running on the channel's thread, in ProgressMode kCaller and
// kThread; pipelined rounds (a round's frames leave in pieces while that pays).
#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "codec.hpp"
#include "conn.hpp"
#include "frame.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pi = plexus::rpc::internal;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

// A request frame for Kinds/Echo carrying `ints` = {id} (and a blob of `blob_bytes`).
struct EchoFrame {
  AllKinds req;
  int32_t value = 0;
  std::vector<uint8_t> blob;
  pi::EncodedMessage encoded;
  pi::OutFrame frame;
  explicit EchoFrame(uint64_t id, size_t blob_bytes = 0)
      : value(static_cast<int32_t>(id)), blob(blob_bytes, static_cast<uint8_t>(id)) {
    req.ints = pr::Repeated<int32_t>(&value, 1);
    if (!blob.empty()) req.blob = pr::Bytes(blob.data(), blob.size());
    REQUIRE(pi::EncodeMessage(*Kinds::Descriptor().methods[0].request(), &req, &encoded).ok());
    pi::FrameHeader h;
    h.type = pi::FrameType::kRequest;
    h.call_id = id;
    h.service_id = Kinds::Descriptor().id;
    h.method_id = 0;
    pi::BuildFrame(h, "", {}, &encoded, &frame);
  }
};

// Copies gathered parts into one 64-byte aligned buffer (what a receiver holds).
std::shared_ptr<pi::RecvBuffer> Flatten(const std::vector<pi::Part>& parts, size_t extra = 0) {
  size_t bytes = 0;
  for (const auto& p : parts) bytes += p.size;
  auto pool = std::make_shared<pi::BufferPool>(bytes + extra + 64, 1);
  pi::BufferPool::Buffer b = pool->Take();
  size_t at = 0;
  for (const auto& p : parts) {
    std::memcpy(b.get() + at, p.data, p.size);
    at += p.size;
  }
  std::memset(b.get() + at, 0, extra);
  return std::make_shared<pi::RecvBuffer>(pool, std::move(b), bytes + extra);
}

// A tcp device in `mode`, a started server with a HoldingService, and (unless `channel_options`
// is nullopt: tests that speak the wire themselves) a channel to it. Echo is registered as never
// blocking: it runs in the dispatcher's rounds, whose batches and pieces these tests check.
struct EchoBed {
  EchoBed(pt::ProgressMode mode, pr::ServerOptions server_options,
          std::optional<pr::ChannelOptions> channel_options) {
    auto d = pt::Device::Create(
        {.backend = pt::Backend::kTcp, .progress = mode, .local_address = "127.0.0.1"});
    REQUIRE(d.ok());
    dev = *d;
    auto s = pr::Server::Create(dev, std::move(server_options));
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl, {"Echo"}).ok());
    REQUIRE(server->Start().ok());
    if (!channel_options) return;
    auto c = pr::Channel::Connect(dev, server->address(), {&Kinds::Descriptor()},
                                  std::move(*channel_options));
    REQUIRE(c.ok());
    ch = *c;
  }
  std::shared_ptr<pt::Device> dev;
  plexus::rpctest::HoldingService impl;
  std::unique_ptr<pr::Server> server;
  std::shared_ptr<pr::Channel> ch;
};

// A raw client's hello for the Kinds service. `batch_bytes` > 0: it takes batches into receive
// buffers of that many bytes; 0: an older client, one frame per message. Built in place (parts[0]
// points into head).
void BuildRawHello(size_t batch_bytes, pi::OutFrame* hello) {
  pi::FrameHeader h;
  h.type = pi::FrameType::kHello;
  if (batch_bytes > 0) {
    h.flags = pi::kFlagBatch;
    h.deadline_us = batch_bytes;
  }
  pi::BuildFrame(
      h, "",
      {{Kinds::Descriptor().full_name, absl::StrFormat("%016x", Kinds::Descriptor().schema_hash)}},
      nullptr, hello);
}

}  // namespace

TEST_CASE("batch parsing: frames back to back, every length checked", "[rpc][batch]") {
  std::vector<std::unique_ptr<EchoFrame>> frames;
  std::vector<pi::Part> parts;
  size_t bytes = 0;
  for (uint64_t id = 1; id <= 3; ++id) {
    frames.push_back(std::make_unique<EchoFrame>(id));
    pi::AppendToBatch(frames.back()->frame, &parts, &bytes);
  }
  SECTION("three frames") {
    std::vector<std::shared_ptr<pi::Inbound>> in;
    REQUIRE(pi::SplitFrames(Flatten(parts), true, {}, &in).ok());
    REQUIRE(in.size() == 3);
    for (uint64_t i = 0; i < 3; ++i) {
      CHECK(in[i]->frame().header.call_id == i + 1);
      REQUIRE(in[i]->Decode(*Kinds::Descriptor().methods[0].request(), {}).ok());
      const auto* m = static_cast<const AllKinds*>(in[i]->message());
      REQUIRE(m->ints.size() == 1);
      CHECK(m->ints[0] == static_cast<int32_t>(i + 1));
    }
  }
  SECTION("without batches agreed, a second frame is an error") {
    std::vector<std::shared_ptr<pi::Inbound>> in;
    absl::Status st = pi::SplitFrames(Flatten(parts), false, {}, &in);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()),
               Catch::Contains("malformed rpc frame: length: the frame has"));
  }
  SECTION("a stray tail after the last frame") {
    std::vector<std::shared_ptr<pi::Inbound>> in;
    absl::Status st = pi::SplitFrames(Flatten(parts, 20), true, {}, &in);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("stray bytes after the frame ending"));
  }
  SECTION("a frame cut short names its index and offset") {
    std::vector<pi::Part> cut = parts;
    cut.back().size -= 1;
    std::vector<std::shared_ptr<pi::Inbound>> in;
    absl::Status st = pi::SplitFrames(Flatten(cut), true, {}, &in);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("frame 2 of a batch (at byte "));
  }
}

TEST_CASE("a raw client's batch of requests is answered; a batch over the window is refused",
          "[rpc][batch]") {
  constexpr size_t kWindow = 8;
  EchoBed bed(pt::DeviceOptions{}.progress, {.max_in_flight_per_connection = kWindow},
              std::nullopt);
  auto& impl = bed.impl;
  auto cq = bed.dev->CreateCompletionQueue();
  auto conn = bed.dev->Connect(bed.server->address(), cq.get());
  REQUIRE(conn.ok());

  constexpr size_t kRecvBytes = 64 << 10;
  pi::OutFrame hello;
  BuildRawHello(kRecvBytes, &hello);
  auto pool = std::make_shared<pi::BufferPool>(kRecvBytes, 4);
  std::vector<pi::BufferPool::Buffer> bufs;
  auto post = [&] {
    bufs.push_back(pool->Take());
    REQUIRE((*conn)->PostRecv({bufs.back().get(), kRecvBytes}, bufs.size() - 1).ok());
  };
  post();
  REQUIRE((*conn)->PostSend(hello.parts, 1000).ok());
  // Receives: completion wr_id = index into bufs; sends: 1000 and up.
  auto next_recv = [&]() -> pt::Completion {
    while (true) {
      auto c = cq->Wait(absl::Seconds(10));
      REQUIRE(c.ok());
      if (c->opcode == pt::Opcode::kRecv) return *c;
      REQUIRE(c->status.ok());
    }
  };
  pt::Completion ack_c = next_recv();
  REQUIRE(ack_c.status.ok());
  auto ack = pi::ParseFrame({bufs[ack_c.wr_id].get(), ack_c.bytes});
  REQUIRE(ack.ok());
  CHECK(ack->header.type == pi::FrameType::kHelloAck);
  CHECK(ack->header.status_code == 0);
  CHECK((ack->header.flags & pi::kFlagBatch) != 0);
  REQUIRE(ack->metadata.size() == 1);
  CHECK(ack->metadata[0].first == pi::kBatchLimitsKey);
  CHECK(ack->metadata[0].second == absl::StrCat(kWindow, " ", 4 << 20));

  // A batch of 5 requests in one message: 5 responses (in one or more messages).
  std::vector<std::unique_ptr<EchoFrame>> frames;
  std::vector<pi::Part> parts;
  size_t bytes = 0;
  for (uint64_t id = 1; id <= 5; ++id) {
    frames.push_back(std::make_unique<EchoFrame>(id));
    pi::AppendToBatch(frames.back()->frame, &parts, &bytes);
  }
  for (int i = 0; i < 5; ++i) post();
  REQUIRE((*conn)->PostSend(parts, 1001).ok());
  std::set<uint64_t> answered;
  while (answered.size() < 5) {
    pt::Completion c = next_recv();
    REQUIRE(c.status.ok());
    std::vector<std::shared_ptr<pi::Inbound>> in;
    REQUIRE(
        pi::SplitFrames(std::make_shared<pi::RecvBuffer>(pool, std::move(bufs[c.wr_id]), c.bytes),
                        true, {}, &in)
            .ok());
    for (const auto& f : in) {
      CHECK(f->frame().header.type == pi::FrameType::kResponse);
      CHECK(f->frame().header.status_code == 0);
      REQUIRE(f->Decode(*Kinds::Descriptor().methods[0].response(), {}).ok());
      const auto* m = static_cast<const AllKinds*>(f->message());
      REQUIRE(m->ints.size() == 1);
      CHECK(m->ints[0] == static_cast<int32_t>(f->frame().header.call_id));
      CHECK(answered.insert(f->frame().header.call_id).second);
    }
  }
  CHECK(impl.echoes == 5);
  REQUIRE(bed.server->Connections().size() == 1);

  // A batch of window + 1 requests: the server drops the connection.
  frames.clear();
  parts.clear();
  bytes = 0;
  for (uint64_t id = 10; id < 10 + kWindow + 1; ++id) {
    frames.push_back(std::make_unique<EchoFrame>(id));
    pi::AppendToBatch(frames.back()->frame, &parts, &bytes);
  }
  REQUIRE((*conn)->PostSend(parts, 1002).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (!bed.server->Connections().empty() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(bed.server->Connections().empty());
  CHECK(impl.echoes == 5);  // none of the oversized batch ran
  (*conn)->Close();
  bed.server->Shutdown();
}

TEST_CASE("blocking callers poll the connection; callbacks stay on the channel's thread",
          "[rpc][batch]") {
  const pt::ProgressMode mode = GENERATE(pt::ProgressMode::kCaller, pt::ProgressMode::kThread);
  INFO("progress mode " << static_cast<int>(mode));
  EchoBed bed(mode, {.max_in_flight_per_connection = 64}, pr::ChannelOptions{.max_in_flight = 64});
  auto& impl = bed.impl;
  Kinds::Stub stub(bed.ch);

  // 8 chains of callbacks, each starting its next call from its callback (those leave batched),
  // 400 calls each; meanwhile 4 threads make 300 blocking calls each.
  constexpr int kChains = 8, kPerChain = 400, kThreads = 4, kPerThread = 300;
  std::mutex mu;
  std::set<std::thread::id> callback_threads;
  std::atomic<int> callbacks_ok{0}, callbacks_bad{0}, chains_done{0};
  std::vector<int32_t> values(kChains);
  std::vector<AllKinds> reqs(kChains);
  std::function<void(int, int)> issue = [&](int chain, int n) {
    values[chain] = chain * 100000 + n;
    reqs[chain].ints = pr::Repeated<int32_t>(&values[chain], 1);
    stub.Echo(reqs[chain], {.timeout = absl::Seconds(20)},
              [&, chain, n](absl::StatusOr<pr::Reply<AllKinds>> r) {
                {
                  std::lock_guard<std::mutex> lock(mu);
                  callback_threads.insert(std::this_thread::get_id());
                }
                if (r.ok() && (*r)->ints.size() == 1 && (*r)->ints[0] == chain * 100000 + n) {
                  ++callbacks_ok;
                } else {
                  ++callbacks_bad;
                }
                if (n + 1 < kPerChain) {
                  issue(chain, n + 1);
                } else {
                  ++chains_done;
                }
              });
  };
  for (int c = 0; c < kChains; ++c) issue(c, 0);
  std::atomic<int> sync_ok{0}, sync_bad{0};
  std::vector<std::thread::id> caller_ids;
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int32_t v = t * 1000000 + i;
        AllKinds req;
        req.ints = pr::Repeated<int32_t>(&v, 1);
        auto r = stub.EchoSync(req, {.timeout = absl::Seconds(20)});
        if (r.ok() && (*r)->ints.size() == 1 && (*r)->ints[0] == v) {
          ++sync_ok;
        } else {
          ++sync_bad;
        }
      }
    });
    caller_ids.push_back(callers.back().get_id());
  }
  for (auto& t : callers) t.join();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (chains_done < kChains && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  CHECK(sync_ok == kThreads * kPerThread);
  CHECK(sync_bad == 0);
  CHECK(callbacks_ok == kChains * kPerChain);
  CHECK(callbacks_bad == 0);
  CHECK(chains_done == kChains);
  CHECK(impl.echoes == kThreads * kPerThread + kChains * kPerChain);
  {
    std::lock_guard<std::mutex> lock(mu);
    // Every callback ran on the channel's one thread: never on a blocking caller, never the test's.
    CHECK(callback_threads.size() == 1);
    for (const auto& id : caller_ids) CHECK_FALSE(callback_threads.contains(id));
    CHECK_FALSE(callback_threads.contains(std::this_thread::get_id()));
  }
  bed.ch->Close();
  bed.server->Shutdown();
}

TEST_CASE("a blocking call's deadline and the connection's death reach a polling caller",
          "[rpc][batch]") {
  EchoBed bed(pt::ProgressMode::kCaller, {}, pr::ChannelOptions{.reconnect = false});
  auto& impl = bed.impl;
  Kinds::Stub stub(bed.ch);
  Inner in{"h", 1, {}, nullptr};
  const absl::Time t0 = absl::Now();
  auto r = stub.HoldSync(in, {.timeout = absl::Milliseconds(200)});
  const absl::Duration took = absl::Now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took >= absl::Milliseconds(200));
  CHECK(took < absl::Seconds(2));

  // Two blocking callers held at the server; the server goes away: both fail with Unavailable.
  std::atomic<int> unavailable{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t) {
    callers.emplace_back([&] {
      Inner req{"h", 2, {}, nullptr};
      auto hr = stub.HoldSync(req, {.timeout = absl::Seconds(10)});
      if (!hr.ok() && hr.status().code() == absl::StatusCode::kUnavailable) ++unavailable;
    });
  }
  const absl::Time held_by = absl::Now() + absl::Seconds(5);
  while (impl.holds < 3 && absl::Now() < held_by) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(impl.holds == 3);
  const absl::Time killed = absl::Now();
  bed.server->Shutdown();
  for (auto& t : callers) t.join();
  CHECK(unavailable == 2);
  CHECK(absl::Now() - killed < absl::Seconds(5));
}

TEST_CASE("a blocking call made from a callback completes (its caller polls the connection)",
          "[rpc][batch]") {
  EchoBed bed(pt::ProgressMode::kCaller, {}, pr::ChannelOptions{});
  Kinds::Stub stub(bed.ch);
  int32_t outer_value = 1, inner_value = 2;
  AllKinds outer, inner;
  outer.ints = pr::Repeated<int32_t>(&outer_value, 1);
  inner.ints = pr::Repeated<int32_t>(&inner_value, 1);
  std::atomic<int> inner_result{0};
  std::atomic<bool> done{false};
  absl::Duration inner_took;
  // The callback runs on the channel's thread: it records the outer call's status for this
  // thread to check (Catch2 assertions are not thread-safe).
  absl::Status outer_status;
  stub.Echo(outer, {}, [&](absl::StatusOr<pr::Reply<AllKinds>> r) {
    outer_status = r.status();
    if (!r.ok()) {
      done = true;
      return;
    }
    const absl::Time t0 = absl::Now();
    auto nested = stub.EchoSync(inner, {.timeout = absl::Seconds(5)});
    inner_took = absl::Now() - t0;
    inner_result = nested.ok() && (*nested)->ints.size() == 1 ? (*nested)->ints[0] : -1;
    done = true;
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!done && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(2));
  REQUIRE(done);
  INFO("the outer call: " << outer_status);
  REQUIRE(outer_status.ok());
  CHECK(inner_result == 2);
  CHECK(inner_took < absl::Seconds(1));  // answered, not failed by its 5 s deadline
  bed.ch->Close();
  bed.server->Shutdown();
}

TEST_CASE("a client that does not take batches gets one frame per message", "[rpc][batch]") {
  EchoBed bed(pt::DeviceOptions{}.progress, {}, std::nullopt);
  auto& impl = bed.impl;
  auto cq = bed.dev->CreateCompletionQueue();
  auto conn = bed.dev->Connect(bed.server->address(), cq.get());
  REQUIRE(conn.ok());
  pi::OutFrame hello;
  BuildRawHello(0, &hello);  // no kFlagBatch: an older client
  constexpr size_t kBytes = 64 << 10;
  constexpr int kCalls = 6;
  std::vector<std::vector<uint64_t>> bufs(kCalls + 1, std::vector<uint64_t>(kBytes / 8));
  for (size_t i = 0; i < bufs.size(); ++i) {
    REQUIRE((*conn)->PostRecv({bufs[i].data(), kBytes}, i).ok());
  }
  REQUIRE((*conn)->PostSend(hello.parts, 1000).ok());
  std::vector<std::unique_ptr<EchoFrame>> frames;
  int acks = 0, responses = 0;
  while (acks + responses < 1 + kCalls) {
    auto c = cq->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    if (c->opcode != pt::Opcode::kRecv) continue;
    // Every message is exactly one frame (ParseFrame refuses trailing bytes).
    auto f = pi::ParseFrame({reinterpret_cast<const uint8_t*>(bufs[c->wr_id].data()), c->bytes});
    REQUIRE(f.ok());
    if (f->header.type == pi::FrameType::kHelloAck) {
      ++acks;
      CHECK((f->header.flags & pi::kFlagBatch) == 0);
      CHECK(f->metadata.empty());
      // Requests sent back to back, one per message: the server handles them in one round.
      for (uint64_t id = 1; id <= kCalls; ++id) {
        frames.push_back(std::make_unique<EchoFrame>(id));
        REQUIRE((*conn)->PostSend(frames.back()->frame.parts, 1000 + id).ok());
      }
      continue;
    }
    CHECK(f->header.type == pi::FrameType::kResponse);
    ++responses;
  }
  CHECK(acks == 1);
  CHECK(responses == kCalls);
  CHECK(impl.echoes == kCalls);
  (*conn)->Close();
  bed.server->Shutdown();
}

namespace {
long fake_switches = 0;
long FakeSwitches() { return fake_switches; }
}  // namespace

TEST_CASE("pipelined rounds: pieces of a quarter, kept only while the peer answers beside us",
          "[rpc][batch]") {
  CHECK(pi::PieceFrames(1) == pi::kMinPieceFrames);
  CHECK(pi::PieceFrames(32) == 8);
  CHECK(pi::PieceFrames(33) == 9);
  CHECK(pi::PieceFrames(128) == 32);
  CHECK(pi::PieceFull(8, pi::kMinPieceBytes, 8));
  CHECK_FALSE(pi::PieceFull(7, pi::kMinPieceBytes, 8));
  CHECK_FALSE(pi::PieceFull(8, 100, 8));  // small calls: the round leaves whole
  CHECK(pi::PieceFull(1, pi::kPieceBytes, 8));
  CHECK_FALSE(pi::PieceFull(100, 2 * pi::kPieceBytes, 0));  // the round leaves whole

  pi::PiecesGate gate(&FakeSwitches);
  // One round of 32 calls that leaves in pieces (when the gate says so); false when it left whole.
  auto round = [&](bool answered, bool switched_out) {
    gate.StartRound();
    const size_t piece = gate.PieceFor(32);
    if (piece == 0) return false;
    CHECK(piece == 8);
    gate.Queued();
    gate.PieceLeft();
    if (switched_out) ++fake_switches;
    gate.Queued();  // a frame queued after a piece left: the round went in pieces
    REQUIRE(gate.TakePieced());
    CHECK_FALSE(gate.TakePieced());
    gate.Learn(answered);
    return true;
  };
  // On at first; small batches are not split but stay piece-sized (kMinPieceFrames) while on.
  CHECK(gate.on());
  CHECK(gate.PieceFor(4) == pi::kMinPieceFrames);
  // Answers that came while this thread ran elsewhere keep it on.
  for (int i = 0; i < 20; ++i) CHECK(round(true, false));
  CHECK(gate.on());
  // A peer that answered by preempting this thread (it shares the CPU) does not count as paid:
  // kMissesToStop such rounds turn pieces off.
  for (uint32_t i = 0; i < pi::PiecesGate::kMissesToStop; ++i) CHECK(round(true, true));
  CHECK_FALSE(gate.on());
  CHECK(gate.PieceFor(4) == 0);
  // Off: rounds leave whole, but one in kProbeEvery is a probe in pieces; a probe whose answer
  // was not there keeps it off, one that paid turns it back on.
  int probes = 0;
  for (uint32_t i = 0; i < 2 * pi::PiecesGate::kProbeEvery; ++i) {
    if (round(false, false)) ++probes;
  }
  CHECK(probes == 2);
  CHECK_FALSE(gate.on());
  while (!round(true, false)) {
  }
  CHECK(gate.on());
  // A round in which a piece left but nothing followed it went out as one message.
  gate.StartRound();
  REQUIRE(gate.PieceFor(32) == 8);
  gate.Queued();
  gate.PieceLeft();
  CHECK_FALSE(gate.TakePieced());
}

TEST_CASE("a round of 32 requests of 8 KiB is answered in 4 pieces of 8, in order",
          "[rpc][batch]") {
  EchoBed bed(pt::DeviceOptions{}.progress, {.max_in_flight_per_connection = 64}, std::nullopt);
  auto cq = bed.dev->CreateCompletionQueue();
  auto conn = bed.dev->Connect(bed.server->address(), cq.get());
  REQUIRE(conn.ok());
  constexpr size_t kRecvBytes = 1 << 20;
  pi::OutFrame hello;
  BuildRawHello(kRecvBytes, &hello);
  auto pool = std::make_shared<pi::BufferPool>(kRecvBytes, 8);
  std::vector<pi::BufferPool::Buffer> bufs;
  for (int i = 0; i < 8; ++i) {
    bufs.push_back(pool->Take());
    REQUIRE((*conn)->PostRecv({bufs.back().get(), kRecvBytes}, bufs.size() - 1).ok());
  }
  REQUIRE((*conn)->PostSend(hello.parts, 1000).ok());
  auto next_recv = [&]() -> pt::Completion {
    while (true) {
      auto c = cq->Wait(absl::Seconds(10));
      REQUIRE(c.ok());
      REQUIRE(c->status.ok());
      if (c->opcode == pt::Opcode::kRecv) return *c;
    }
  };
  pt::Completion ack = next_recv();
  REQUIRE(pi::ParseFrame({bufs[ack.wr_id].get(), ack.bytes}).ok());

  // 32 requests in one message: the server's round splits its responses (the gate starts on;
  // 8 responses of 8 KiB are a piece, over kMinPieceBytes).
  constexpr uint64_t kCalls = 32;
  constexpr size_t kBlob = 8 << 10;
  std::vector<std::unique_ptr<EchoFrame>> frames;
  std::vector<pi::Part> parts;
  size_t bytes = 0;
  for (uint64_t id = 1; id <= kCalls; ++id) {
    frames.push_back(std::make_unique<EchoFrame>(id, kBlob));
    pi::AppendToBatch(frames.back()->frame, &parts, &bytes);
  }
  REQUIRE((*conn)->PostSend(parts, 1001).ok());
  std::vector<size_t> per_message;
  uint64_t next_id = 1;
  while (next_id <= kCalls) {
    pt::Completion c = next_recv();
    std::vector<std::shared_ptr<pi::Inbound>> in;
    REQUIRE(
        pi::SplitFrames(std::make_shared<pi::RecvBuffer>(pool, std::move(bufs[c.wr_id]), c.bytes),
                        true, {}, &in)
            .ok());
    per_message.push_back(in.size());
    for (const auto& f : in) {
      REQUIRE(f->frame().header.type == pi::FrameType::kResponse);
      CHECK(f->frame().header.call_id == next_id++);  // in order across the pieces
      REQUIRE(f->Decode(*Kinds::Descriptor().methods[0].response(), {}).ok());
      const auto* m = static_cast<const AllKinds*>(f->message());
      REQUIRE(m->ints.size() == 1);
      CHECK(m->ints[0] == static_cast<int32_t>(f->frame().header.call_id));
      REQUIRE(m->blob.size() == kBlob);
      CHECK(m->blob[kBlob - 1] == static_cast<uint8_t>(f->frame().header.call_id));
    }
  }
  CHECK(per_message == std::vector<size_t>{8, 8, 8, 8});
  CHECK(bed.impl.echoes == kCalls);
  (*conn)->Close();
  bed.server->Shutdown();
}

TEST_CASE("callbacks' large requests leave in pieces: every call gets its own bytes, in order",
          "[rpc][batch]") {
  const pt::ProgressMode mode = GENERATE(pt::ProgressMode::kCaller, pt::ProgressMode::kThread);
  INFO("progress mode " << static_cast<int>(mode));
  // 64 chains of 16 KiB requests at a window of 64: a round's requests (up to 64, 1 MiB) leave
  // in pieces of 64 KiB, and the server's responses (the same bytes) in pieces too.
  EchoBed bed(mode, {.max_in_flight_per_connection = 64}, pr::ChannelOptions{.max_in_flight = 64});
  Kinds::Stub stub(bed.ch);
  constexpr int kChains = 64, kPerChain = 40;
  constexpr size_t kBytes = 16 << 10;
  std::vector<std::vector<uint8_t>> blobs(kChains, std::vector<uint8_t>(kBytes));
  std::vector<AllKinds> reqs(kChains);
  std::atomic<int> ok{0}, bad{0}, chains_done{0};
  // Calls issued from callbacks (the channel's one thread) complete in the order they were
  // issued: the server answers a connection's requests in order, pieces or not.
  std::mutex mu;
  uint64_t issued_in_callbacks = 0;
  std::vector<uint64_t> completion_order;
  std::function<void(int, int, bool)> issue = [&](int chain, int n, bool from_callback) {
    std::vector<uint8_t>& blob = blobs[chain];
    for (size_t i = 0; i < kBytes; ++i) blob[i] = static_cast<uint8_t>(chain * 31 + n * 7 + i);
    reqs[chain].blob = pr::Bytes(blob.data(), blob.size());
    uint64_t seq = 0;
    if (from_callback) {
      std::lock_guard<std::mutex> lock(mu);
      seq = ++issued_in_callbacks;
    }
    stub.Echo(reqs[chain], {.timeout = absl::Seconds(30)},
              [&, chain, n, seq](absl::StatusOr<pr::Reply<AllKinds>> r) {
                bool good = r.ok() && (*r)->blob.size() == kBytes;
                for (size_t i = 0; good && i < kBytes; ++i) {
                  good = (*r)->blob[i] == static_cast<uint8_t>(chain * 31 + n * 7 + i);
                }
                ++(good ? ok : bad);
                if (seq > 0) {
                  std::lock_guard<std::mutex> lock(mu);
                  completion_order.push_back(seq);
                }
                if (n + 1 < kPerChain) {
                  issue(chain, n + 1, true);
                } else {
                  ++chains_done;
                }
              });
  };
  for (int c = 0; c < kChains; ++c) issue(c, 0, false);
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (chains_done < kChains && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  CHECK(chains_done == kChains);
  CHECK(ok == kChains * kPerChain);
  CHECK(bad == 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(completion_order.size() == static_cast<size_t>(kChains * (kPerChain - 1)));
    CHECK(std::is_sorted(completion_order.begin(), completion_order.end()));
  }
  bed.ch->Close();
  bed.server->Shutdown();
}
