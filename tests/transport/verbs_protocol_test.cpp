// The verbs protocol without RDMA hardware: two protocol engines connected by a simulated
// reliable-connected queue pair that delivers in order, places RDMA writes, and counts
// receiver-not-ready events (which credits must prevent). The slot table, the encodings and
// the probe are tested in verbs_codec_test.cpp.
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "verbs/protocol.hpp"

namespace plexus::transport::verbs {
namespace {

// ---- A simulated RC queue pair ------------------------------------------------------------------

absl::Status Flushed() { return absl::UnavailableError("flushed (simulated)"); }

class SimQp final : public Wire {
 public:
  struct Item {
    bool is_write = false;
    uint32_t handle = 0;
    uint32_t slot = 0;
    uint32_t bytes = 0;
    WriteSegment segment;
  };

  SimQp* peer = nullptr;
  uint8_t* send_pool = nullptr;
  uint8_t* recv_pool = nullptr;
  uint32_t slot_bytes = 0;
  std::deque<std::pair<uint32_t, uint32_t>> recvs;  // (handle, slot), in post order
  std::deque<Item> outbound;
  std::deque<std::pair<uint32_t, WireCompletion>> cqes;
  bool in_error = false;
  int aborts = 0;
  int rnr = 0;
  std::optional<absl::Status> fail_next_transmit;

  absl::Status PostRecv(uint32_t handle, uint32_t slot) override {
    if (in_error) {
      cqes.push_back({handle, {Flushed()}});
    } else {
      recvs.push_back({handle, slot});
    }
    return absl::OkStatus();
  }
  absl::Status PostSendSlot(uint32_t handle, uint32_t slot, uint32_t bytes) override {
    REQUIRE(bytes <= slot_bytes);
    Item item;
    item.handle = handle;
    item.slot = slot;
    item.bytes = bytes;
    return Queue(item);
  }
  absl::Status PostWrite(uint32_t handle, const WriteSegment& segment) override {
    Item item;
    item.is_write = true;
    item.handle = handle;
    item.segment = segment;
    return Queue(item);
  }
  void Abort(const absl::Status&) override {
    ++aborts;
    EnterError();
  }

  void EnterError() {
    if (in_error) return;
    in_error = true;
    for (const auto& [handle, slot] : recvs) cqes.push_back({handle, {Flushed()}});
    for (const Item& item : outbound) cqes.push_back({item.handle, {Flushed()}});
    recvs.clear();
    outbound.clear();
  }

  bool CanTransmit() const { return !outbound.empty() && !in_error; }

  // Moves the oldest outbound request to the peer; false when the peer has no receive for it.
  bool Transmit() {
    const Item item = outbound.front();
    if (fail_next_transmit || peer->in_error) {
      outbound.pop_front();
      cqes.push_back(
          {item.handle,
           {fail_next_transmit.value_or(absl::UnavailableError("retry exceeded (simulated)"))}});
      fail_next_transmit.reset();
      EnterError();
      return true;
    }
    const bool consumes_receive = !item.is_write || item.segment.immediate.has_value();
    if (consumes_receive && peer->recvs.empty()) {
      ++rnr;
      return false;
    }
    outbound.pop_front();
    if (!item.is_write) {
      const auto [handle, slot] = peer->recvs.front();
      peer->recvs.pop_front();
      std::memcpy(peer->recv_pool + size_t{slot} * peer->slot_bytes,
                  send_pool + size_t{item.slot} * slot_bytes, item.bytes);
      peer->cqes.push_back({handle, {absl::OkStatus(), item.bytes}});
    } else {
      if (item.segment.length > 0) {
        std::memcpy(reinterpret_cast<void*>(item.segment.remote_addr),
                    reinterpret_cast<const void*>(item.segment.local_addr), item.segment.length);
      }
      if (item.segment.immediate) {
        const auto [handle, slot] = peer->recvs.front();
        peer->recvs.pop_front();
        peer->cqes.push_back(
            {handle, {absl::OkStatus(), item.segment.length, item.segment.immediate}});
      }
    }
    cqes.push_back({item.handle, {absl::OkStatus()}});
    return true;
  }

 private:
  absl::Status Queue(const Item& item) {
    if (in_error) {
      cqes.push_back({item.handle, {Flushed()}});
    } else {
      outbound.push_back(item);
    }
    return absl::OkStatus();
  }
};

ProtocolConfig SmallConfig(uint32_t recv_slots = 4) {
  ProtocolConfig c;
  c.slot_bytes = 64;  // 48 bytes of payload per chunk: every test message spans several
  c.recv_slots = recv_slots;
  c.send_slots = 4;
  c.max_send_wr = 8;
  c.max_write_bytes = 100;
  c.max_message_bytes = 1 << 20;
  c.op_timeout = absl::Seconds(5);
  return c;
}
constexpr size_t kPayload = 64 - kChunkHeaderBytes;

struct Endpoint {
  Endpoint(const ProtocolConfig& config, uint64_t id, std::string name)
      : send_pool(size_t{config.send_slots} * config.slot_bytes),
        recv_pool(size_t{config.recv_slots} * config.slot_bytes),
        protocol(config, absl::MakeSpan(send_pool), absl::MakeSpan(recv_pool), &qp, &cq, id,
                 std::move(name)) {
    qp.send_pool = send_pool.data();
    qp.recv_pool = recv_pool.data();
    qp.slot_bytes = config.slot_bytes;
  }

  std::vector<Completion> Drain() {
    std::vector<Completion> out;
    Completion c;
    while (cq.Poll({&c, 1}) == 1) out.push_back(c);
    return out;
  }

  std::vector<uint8_t> send_pool;
  std::vector<uint8_t> recv_pool;
  CompletionQueue cq;
  SimQp qp;
  Protocol protocol;
};

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Two connected engines and a scheduler that interleaves transmissions and completions at
// random, keeping each queue pair's order as RC does.
class Pair {
 public:
  explicit Pair(const ProtocolConfig& config = SmallConfig(), uint32_t seed = 1)
      : a(config, 1, "peer-b"), b(config, 2, "peer-a"), rng(seed) {
    a.qp.peer = &b.qp;
    b.qp.peer = &a.qp;
    REQUIRE(a.protocol.Start().ok());
    REQUIRE(b.protocol.Start().ok());
    REQUIRE(a.protocol.Connected(b.protocol.local_hello(), kT0).ok());
    REQUIRE(b.protocol.Connected(a.protocol.local_hello(), kT0).ok());
  }

  // Runs until nothing can move; returns false when it did not settle within max_steps.
  bool Run(int max_steps = 1000000) {
    for (int step = 0; step < max_steps; ++step) {
      PropagateDisconnect(a, b);
      PropagateDisconnect(b, a);
      std::vector<int> actions;
      if (a.qp.CanTransmit()) actions.push_back(0);
      if (b.qp.CanTransmit()) actions.push_back(1);
      if (!a.qp.cqes.empty()) actions.push_back(2);
      if (!b.qp.cqes.empty()) actions.push_back(3);
      if (actions.empty()) return true;
      const int action = actions[std::uniform_int_distribution<size_t>(0, actions.size() - 1)(rng)];
      bool moved = true;
      switch (action) {
        case 0:
          moved = a.qp.Transmit();
          break;
        case 1:
          moved = b.qp.Transmit();
          break;
        case 2:
          Complete(a);
          break;
        case 3:
          Complete(b);
          break;
      }
      // A transmission refused for want of a receive (RNR) can only wait for completions;
      // when there are none, the pair is stuck.
      if (!moved && a.qp.cqes.empty() && b.qp.cqes.empty() &&
          !(a.qp.CanTransmit() && !b.qp.recvs.empty()) &&
          !(b.qp.CanTransmit() && !a.qp.recvs.empty())) {
        return true;
      }
    }
    return false;
  }

  Endpoint a;
  Endpoint b;
  std::mt19937 rng;

 private:
  void Complete(Endpoint& e) {
    const auto [handle, completion] = e.qp.cqes.front();
    e.qp.cqes.pop_front();
    e.protocol.OnCompletion(handle, completion, kT0);
  }
  // rdma_disconnect of one side reaches the other as a CM DISCONNECTED event.
  static void PropagateDisconnect(Endpoint& from, Endpoint& to) {
    if (from.qp.aborts > 0 && !to.qp.in_error) {
      to.qp.EnterError();
      to.protocol.Fail(absl::UnavailableError("the peer disconnected (simulated)"));
    }
  }
};

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8));
  return v;
}

TEST_CASE("messages of every chunking shape arrive whole and in order", "[verbs]") {
  Pair pair;
  const std::vector<size_t> sizes = {0, 1, kPayload - 1, kPayload, kPayload + 1, 10 * kPayload + 7,
                                     3};
  std::vector<std::vector<uint8_t>> sent, received(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    received[i].assign(sizes[i] + 5, 0xEE);
    REQUIRE(pair.b.protocol.PostRecv({received[i].data(), received[i].size()}, 100 + i).ok());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(Pattern(sizes[i], static_cast<uint32_t>(i)));
    REQUIRE(
        pair.a.protocol.PostSend(ConstBuffer{sent[i].data(), sent[i].size()}, 10 + i, kT0).ok());
  }
  REQUIRE(pair.Run());
  CHECK(pair.a.qp.rnr == 0);
  const std::vector<Completion> sends = pair.a.Drain();
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(sends.size() == sizes.size());
  REQUIRE(recvs.size() == sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message " << i << " of " << sizes[i] << " bytes");
    CHECK(sends[i].opcode == Opcode::kSend);
    CHECK(sends[i].wr_id == 10 + i);
    CHECK(sends[i].status.ok());
    CHECK(sends[i].connection_id == 1);
    CHECK(recvs[i].opcode == Opcode::kRecv);
    CHECK(recvs[i].wr_id == 100 + i);
    CHECK(recvs[i].status.ok());
    CHECK(recvs[i].bytes == sizes[i]);
    CHECK(recvs[i].connection_id == 2);
    CHECK(std::equal(sent[i].begin(), sent[i].end(), received[i].begin()));
    CHECK(received[i][sizes[i]] == 0xEE);  // nothing written past the message
  }
  CHECK(pair.a.protocol.posted_work_requests() == SmallConfig().recv_slots);
  CHECK(pair.a.protocol.status().ok());
}

TEST_CASE("scatter-gather sends concatenate their buffers", "[verbs]") {
  Pair pair;
  const std::vector<uint8_t> p1 = Pattern(30, 1), p2 = Pattern(100, 2), p3 = Pattern(1, 3);
  std::vector<ConstBuffer> parts = {
      {p1.data(), p1.size()}, {nullptr, 0}, {p2.data(), p2.size()}, {p3.data(), p3.size()}};
  std::vector<uint8_t> out(200);
  REQUIRE(pair.b.protocol.PostRecv({out.data(), out.size()}, 1).ok());
  REQUIRE(pair.a.protocol.PostSend(absl::MakeConstSpan(parts), 2, kT0).ok());
  REQUIRE(pair.Run());
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(recvs.size() == 1);
  CHECK(recvs[0].bytes == 131);
  std::vector<uint8_t> expected(p1);
  expected.insert(expected.end(), p2.begin(), p2.end());
  expected.insert(expected.end(), p3.begin(), p3.end());
  CHECK(std::equal(expected.begin(), expected.end(), out.begin()));
}

TEST_CASE("produced sends and consumed receives mix with ordinary messages", "[verbs]") {
  Pair pair;
  const std::vector<uint8_t> m0 = Pattern(10 * kPayload + 3, 1), m1 = Pattern(7, 2),
                             m2 = Pattern(3 * kPayload, 3);
  const auto produce = [](const std::vector<uint8_t>* src) -> Producer {
    return [src](size_t offset, absl::Span<uint8_t> out) {
      std::memcpy(out.data(), src->data() + offset, out.size());
      return absl::OkStatus();
    };
  };
  std::vector<uint8_t> got0, got1(m1.size()), got2;
  const auto consume = [](std::vector<uint8_t>* dst) -> Consumer {
    return [dst](size_t offset, absl::Span<const uint8_t> in) {
      if (offset != dst->size()) return absl::InternalError("out of order");
      dst->insert(dst->end(), in.begin(), in.end());
      return absl::OkStatus();
    };
  };
  // 0: produced -> consumed (streamed), 1: produced -> ordinary, 2: ordinary -> consumed (held).
  REQUIRE(pair.b.protocol.PostRecvConsumed(m0.size(), consume(&got0), 0).ok());
  REQUIRE(pair.a.protocol.PostSendProduced(m0.size(), produce(&m0), 10, kT0).ok());
  REQUIRE(pair.a.protocol.PostSendProduced(m1.size(), produce(&m1), 11, kT0).ok());
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{m2.data(), m2.size()}, 12, kT0).ok());
  REQUIRE(pair.Run());
  REQUIRE(pair.b.protocol.PostRecv({got1.data(), got1.size()}, 1).ok());
  REQUIRE(pair.b.protocol.PostRecvConsumed(m2.size(), consume(&got2), 2).ok());  // held first
  const std::vector<Completion> sends = pair.a.Drain();
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(sends.size() == 3);
  REQUIRE(recvs.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(sends[i].wr_id == 10u + i);
    CHECK(sends[i].status.ok());
    CHECK(recvs[i].wr_id == static_cast<uint64_t>(i));
    CHECK(recvs[i].status.ok());
  }
  CHECK(recvs[0].bytes == m0.size());
  CHECK(got0 == m0);
  CHECK(got1 == m1);
  CHECK(got2 == m2);
  CHECK(pair.b.protocol.held_messages() == 0);
}

TEST_CASE("a producer error fails the send and the connection", "[verbs]") {
  Pair pair;
  std::vector<uint8_t> out(100);
  REQUIRE(pair.b.protocol.PostRecv({out.data(), out.size()}, 1).ok());
  REQUIRE(pair.a.protocol
              .PostSendProduced(
                  50, [](size_t, absl::Span<uint8_t>) { return absl::DataLossError("no input"); },
                  2, kT0)
              .ok());
  REQUIRE(pair.Run());
  const std::vector<Completion> sends = pair.a.Drain();
  REQUIRE(sends.size() == 1);
  CHECK(absl::IsDataLoss(sends[0].status));
  CHECK(std::string(sends[0].status.message()) ==
        "verbs send (wr_id 2) to peer-b: producing bytes [0, +50) of a message of 50 bytes: no "
        "input");
  CHECK_FALSE(pair.a.protocol.status().ok());
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(recvs.size() == 1);
  CHECK_FALSE(recvs[0].status.ok());
}

TEST_CASE("messages that arrive before their receive are held, in order", "[verbs]") {
  Pair pair;
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t i = 0; i < 12; ++i) sent.push_back(Pattern(i * 13 % 150, i));
  std::vector<std::vector<uint8_t>> out(sent.size(), std::vector<uint8_t>(200));
  // Two receives posted ahead, the rest only after everything arrived.
  REQUIRE(pair.b.protocol.PostRecv({out[0].data(), out[0].size()}, 0).ok());
  REQUIRE(pair.b.protocol.PostRecv({out[1].data(), out[1].size()}, 1).ok());
  for (uint32_t i = 0; i < sent.size(); ++i) {
    REQUIRE(pair.a.protocol.PostSend(ConstBuffer{sent[i].data(), sent[i].size()}, i, kT0).ok());
  }
  REQUIRE(pair.Run());
  CHECK(pair.a.qp.rnr == 0);
  CHECK(pair.b.protocol.held_messages() == sent.size() - 2);
  CHECK(pair.a.Drain().size() == sent.size());  // sends complete although nobody received
  for (uint32_t i = 2; i < sent.size(); ++i) {
    REQUIRE(pair.b.protocol.PostRecv({out[i].data(), out[i].size()}, i).ok());
  }
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(recvs.size() == sent.size());
  for (uint32_t i = 0; i < sent.size(); ++i) {
    CHECK(recvs[i].wr_id == i);
    CHECK(recvs[i].bytes == sent[i].size());
    CHECK(std::equal(sent[i].begin(), sent[i].end(), out[i].begin()));
  }
  CHECK(pair.b.protocol.held_messages() == 0);
}

TEST_CASE("a receive posted mid-way through a held message gets that message", "[verbs]") {
  Pair pair;
  const std::vector<uint8_t> big = Pattern(5 * kPayload, 9), small = Pattern(10, 4);
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{big.data(), big.size()}, 1, kT0).ok());
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{small.data(), small.size()}, 2, kT0).ok());
  // Deliver only the first two chunks of the big message, then post both receives.
  for (int i = 0; i < 2; ++i) {
    REQUIRE(pair.a.qp.Transmit());
    auto [handle, completion] = pair.b.qp.cqes.front();
    pair.b.qp.cqes.pop_front();
    pair.b.protocol.OnCompletion(handle, completion, kT0);
  }
  std::vector<uint8_t> out1(big.size()), out2(small.size());
  REQUIRE(pair.b.protocol.PostRecv({out1.data(), out1.size()}, 11).ok());
  REQUIRE(pair.b.protocol.PostRecv({out2.data(), out2.size()}, 12).ok());
  REQUIRE(pair.Run());
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(recvs.size() == 2);
  CHECK(recvs[0].wr_id == 11);
  CHECK(recvs[1].wr_id == 12);
  CHECK(out1 == big);
  CHECK(out2 == small);
}

TEST_CASE("a message longer than its receive fails it and closes the connection", "[verbs]") {
  Pair pair;
  const std::vector<uint8_t> msg = Pattern(100, 1);
  std::vector<uint8_t> small(99), later(200);
  REQUIRE(pair.b.protocol.PostRecv({small.data(), small.size()}, 1).ok());
  REQUIRE(pair.b.protocol.PostRecv({later.data(), later.size()}, 2).ok());
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 7, kT0).ok());
  REQUIRE(pair.Run());
  const std::vector<Completion> recvs = pair.b.Drain();
  REQUIRE(recvs.size() == 2);
  CHECK(recvs[0].wr_id == 1);
  CHECK(recvs[0].status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(recvs[1].wr_id == 2);
  CHECK_FALSE(recvs[1].status.ok());
  CHECK(pair.b.protocol.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(pair.b.qp.aborts == 1);
  CHECK_FALSE(pair.a.protocol.status().ok());  // the peer learnt of the disconnect
  // Posts on a failed connection are refused at once.
  CHECK_FALSE(pair.b.protocol.PostRecv({later.data(), later.size()}, 3).ok());
  CHECK_FALSE(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 8, kT0).ok());
}

TEST_CASE("one-sided writes place bytes; immediates complete at the target in order", "[verbs]") {
  Pair pair;
  std::vector<uint8_t> local = Pattern(350, 5), remote(400, 0);
  const std::vector<uint8_t> m1 = Pattern(70, 1), m2 = Pattern(20, 2);
  std::vector<uint8_t> r1(100), r2(100);
  REQUIRE(pair.b.protocol.PostRecv({r1.data(), r1.size()}, 1).ok());
  REQUIRE(pair.b.protocol.PostRecv({r2.data(), r2.size()}, 2).ok());

  WriteRequest plain;
  plain.local_addr = reinterpret_cast<uintptr_t>(local.data());
  plain.remote_addr = reinterpret_cast<uintptr_t>(remote.data()) + 10;
  plain.length = 40;
  WriteRequest with_imm = plain;
  with_imm.local_addr += 40;
  with_imm.remote_addr = reinterpret_cast<uintptr_t>(remote.data()) + 50;
  with_imm.length = 310;  // more than max_write_bytes: several work requests, one immediate
  with_imm.immediate = 0xCAFEF00Du;

  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{m1.data(), m1.size()}, 10, kT0).ok());
  REQUIRE(pair.a.protocol.PostWrite(plain, 11, kT0).ok());
  REQUIRE(pair.a.protocol.PostWrite(with_imm, 12, kT0).ok());
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{m2.data(), m2.size()}, 13, kT0).ok());
  REQUIRE(pair.Run());
  CHECK(pair.a.qp.rnr == 0);

  const std::vector<Completion> initiator = pair.a.Drain();
  REQUIRE(initiator.size() == 4);
  CHECK(initiator[1].opcode == Opcode::kWrite);
  CHECK(initiator[1].wr_id == 11);
  CHECK(initiator[1].bytes == 40);
  CHECK(initiator[2].opcode == Opcode::kWrite);
  CHECK(initiator[2].wr_id == 12);
  CHECK(initiator[2].bytes == 310);
  for (const Completion& c : initiator) CHECK(c.status.ok());

  const std::vector<Completion> target = pair.b.Drain();
  REQUIRE(target.size() == 3);  // the plain write is silent at the target
  CHECK(target[0].opcode == Opcode::kRecv);
  CHECK(target[0].wr_id == 1);
  CHECK(target[1].opcode == Opcode::kRemoteWrite);
  CHECK(target[1].wr_id == 0);
  CHECK(target[1].has_immediate);
  CHECK(target[1].immediate == 0xCAFEF00Du);
  CHECK(target[2].opcode == Opcode::kRecv);
  CHECK(target[2].wr_id == 2);
  CHECK(std::all_of(remote.begin(), remote.begin() + 10, [](uint8_t v) { return v == 0; }));
  CHECK(std::equal(local.begin(), local.end(), remote.begin() + 10));
  CHECK(std::all_of(remote.begin() + 360, remote.end(), [](uint8_t v) { return v == 0; }));
}

TEST_CASE("credits keep a receive posted for every send under random load", "[verbs]") {
  for (uint32_t recv_slots : {4u, 5u, 8u, 16u}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      INFO("recv_slots " << recv_slots << ", seed " << seed);
      Pair pair(SmallConfig(recv_slots), seed);
      std::mt19937 rng(seed * 7919);
      std::uniform_int_distribution<size_t> size_of(0, 4 * kPayload + 3);
      struct Side {
        Endpoint* self;
        std::vector<std::vector<uint8_t>> sent;
        std::vector<std::vector<uint8_t>> inbox;
        std::vector<uint32_t> immediates_sent;
        std::vector<uint8_t> window = std::vector<uint8_t>(64);
      };
      Side sides[2] = {{&pair.a, {}, {}, {}}, {&pair.b, {}, {}, {}}};
      constexpr int kMessages = 150;
      for (int round = 0; round < kMessages; ++round) {
        for (int s = 0; s < 2; ++s) {
          Side& me = sides[s];
          Side& other = sides[1 - s];
          me.sent.push_back(Pattern(size_of(rng), static_cast<uint32_t>(round * 2 + s)));
          REQUIRE(me.self->protocol
                      .PostSend(ConstBuffer{me.sent.back().data(), me.sent.back().size()},
                                static_cast<uint64_t>(round), kT0)
                      .ok());
          if (round % 7 == 3) {
            WriteRequest w;
            w.local_addr = reinterpret_cast<uintptr_t>(me.sent.back().data());
            w.remote_addr = reinterpret_cast<uintptr_t>(other.window.data());
            w.length = std::min<size_t>(me.sent.back().size(), other.window.size());
            w.immediate = static_cast<uint32_t>(round * 10 + s);
            me.immediates_sent.push_back(*w.immediate);
            REQUIRE(me.self->protocol.PostWrite(w, 1000000 + round, kT0).ok());
          }
          // Receives lag behind: some rounds post none, some several.
          if (rng() % 3 != 0) {
            for (uint32_t k = 0; k < rng() % 3; ++k) {
              me.inbox.emplace_back(4 * kPayload + 3);
              REQUIRE(me.self->protocol
                          .PostRecv({me.inbox.back().data(), me.inbox.back().size()},
                                    me.inbox.size() - 1)
                          .ok());
            }
          }
        }
        if (round % 10 == 0) pair.Run(300);  // partial progress, then more posts
      }
      // Catch up on receives, then everything must settle.
      for (Side& me : sides) {
        while (me.inbox.size() < kMessages) {
          me.inbox.emplace_back(4 * kPayload + 3);
          REQUIRE(
              me.self->protocol
                  .PostRecv({me.inbox.back().data(), me.inbox.back().size()}, me.inbox.size() - 1)
                  .ok());
        }
      }
      REQUIRE(pair.Run());
      CHECK(pair.a.qp.rnr == 0);
      CHECK(pair.b.qp.rnr == 0);
      for (int s = 0; s < 2; ++s) {
        Side& me = sides[s];
        Side& other = sides[1 - s];
        CHECK(me.self->protocol.status().ok());
        size_t sends = 0, writes = 0, recvs = 0;
        std::vector<uint32_t> immediates;
        for (const Completion& c : me.self->Drain()) {
          REQUIRE(c.status.ok());
          switch (c.opcode) {
            case Opcode::kSend:
              CHECK(c.wr_id == sends);
              ++sends;
              break;
            case Opcode::kWrite:
              ++writes;
              break;
            case Opcode::kRecv:
              REQUIRE(c.wr_id == recvs);
              CHECK(c.bytes == other.sent[recvs].size());
              CHECK(std::equal(other.sent[recvs].begin(), other.sent[recvs].end(),
                               me.inbox[recvs].begin()));
              ++recvs;
              break;
            case Opcode::kRemoteWrite:
              immediates.push_back(c.immediate);
              break;
          }
        }
        CHECK(sends == kMessages);
        CHECK(writes == me.immediates_sent.size());
        CHECK(recvs == kMessages);
        CHECK(immediates == other.immediates_sent);
        CHECK(me.self->protocol.held_messages() == 0);
        CHECK(me.self->protocol.credits() <= recv_slots);
      }
    }
  }
}

TEST_CASE("an error completion fails every outstanding operation exactly once", "[verbs]") {
  Pair pair;
  std::vector<uint8_t> msg = Pattern(300, 3), out1(10), out2(10), window(64);
  REQUIRE(pair.a.protocol.PostRecv({out1.data(), out1.size()}, 1).ok());
  REQUIRE(pair.a.protocol.PostRecv({out2.data(), out2.size()}, 2).ok());
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 10 + i, kT0).ok());
  }
  WriteRequest w;
  w.local_addr = reinterpret_cast<uintptr_t>(msg.data());
  w.remote_addr = reinterpret_cast<uintptr_t>(window.data());
  w.length = 8;
  REQUIRE(pair.a.protocol.PostWrite(w, 20, kT0).ok());
  REQUIRE(pair.a.qp.Transmit());
  pair.a.qp.fail_next_transmit = absl::UnavailableError(
      "verbs connection to peer-b failed: work completion error 'transport retry counter "
      "exceeded'");
  REQUIRE(pair.Run());
  std::vector<Completion> done = pair.a.Drain();
  std::vector<uint64_t> ids;
  for (const Completion& c : done) {
    CHECK(c.status.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(c.status.message()).find("retry counter exceeded") != std::string::npos);
    ids.push_back(c.wr_id);
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<uint64_t>{1, 2, 10, 11, 12, 13, 14, 20});
  CHECK(pair.a.protocol.outstanding_operations() == 0);
  CHECK(pair.a.protocol.posted_work_requests() == 0);  // every flush was accounted for
  CHECK(pair.a.qp.aborts == 1);
  CHECK_FALSE(pair.b.protocol.status().ok());
  // Stale and unknown ids after the failure are ignored.
  pair.a.protocol.OnCompletion(12345, {absl::OkStatus(), 3}, kT0);
  pair.a.protocol.OnCompletion(0, {Flushed()}, kT0);
  CHECK(pair.a.Drain().empty());
}

TEST_CASE("Fail (Close) cancels outstanding operations once; later posts are refused", "[verbs]") {
  Pair pair;
  std::vector<uint8_t> msg = Pattern(10, 1), out(10);
  REQUIRE(pair.a.protocol.PostRecv({out.data(), out.size()}, 1).ok());
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 2, kT0).ok());
  pair.a.protocol.Fail(absl::CancelledError("closed"));
  pair.a.protocol.Fail(absl::InternalError("second reason is ignored"));
  std::vector<Completion> done = pair.a.Drain();
  REQUIRE(done.size() == 2);
  for (const Completion& c : done) CHECK(c.status.code() == absl::StatusCode::kCancelled);
  CHECK(pair.a.protocol.status().code() == absl::StatusCode::kCancelled);
  REQUIRE(pair.Run());
  CHECK(pair.a.Drain().empty());
  CHECK(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 3, kT0).code() ==
        absl::StatusCode::kCancelled);
}

TEST_CASE("operations that make no progress time out; idle receives do not", "[verbs]") {
  Pair pair;
  std::vector<uint8_t> out(10);
  REQUIRE(pair.a.protocol.PostRecv({out.data(), out.size()}, 1).ok());
  pair.a.protocol.CheckTimeout(kT0 + absl::Hours(1));
  CHECK(pair.a.protocol.status().ok());  // a receive may wait forever

  std::vector<uint8_t> msg = Pattern(10, 1);
  REQUIRE(pair.a.protocol.PostSend(ConstBuffer{msg.data(), msg.size()}, 2, kT0).ok());
  pair.a.protocol.CheckTimeout(kT0 + absl::Seconds(4));
  CHECK(pair.a.protocol.status().ok());
  pair.a.protocol.CheckTimeout(kT0 + absl::Seconds(6));  // the wire never moved
  CHECK(pair.a.protocol.status().code() == absl::StatusCode::kDeadlineExceeded);
  std::vector<Completion> done = pair.a.Drain();
  REQUIRE(done.size() == 2);
  for (const Completion& c : done) {
    CHECK(c.status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(c.status.message()).find("peer-b") != std::string::npos);
  }
}

TEST_CASE("invalid posts are refused at once without a completion", "[verbs]") {
  Pair pair;
  CHECK(pair.a.protocol.PostSend(ConstBuffer{nullptr, 4}, 1, kT0).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(pair.a.protocol.PostRecv({nullptr, 4}, 2).code() == absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> big(SmallConfig().max_message_bytes + 1);
  CHECK(pair.a.protocol.PostSend(ConstBuffer{big.data(), big.size()}, 3, kT0).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(pair.a.Drain().empty());
  CHECK(pair.a.protocol.status().ok());

  ProtocolConfig bad = SmallConfig();
  bad.slot_bytes = 8;
  CHECK_FALSE(ValidateConfig(bad).ok());
  bad = SmallConfig();
  bad.recv_slots = 3;  // credit chunks could ping-pong
  CHECK_FALSE(ValidateConfig(bad).ok());
}

// ---- Malformed input from the peer ------------------------------------------------------------

// One engine whose receives are filled by hand, as a misbehaving peer would.
class Forged {
 public:
  Forged() : e(SmallConfig(), 1, "forger") {
    REQUIRE(e.protocol.Start().ok());
    REQUIRE(e.protocol.Connected({4, 64}, kT0).ok());
    REQUIRE(e.protocol.PostRecv({out.data(), out.size()}, 77).ok());
  }
  // Delivers `bytes` as the next incoming SEND; returns the connection status after it.
  absl::Status Deliver(const std::vector<uint8_t>& bytes, std::optional<uint32_t> len = {}) {
    REQUIRE_FALSE(e.qp.recvs.empty());
    const auto [handle, slot] = e.qp.recvs.front();
    e.qp.recvs.pop_front();
    std::memcpy(e.recv_pool.data() + size_t{slot} * 64, bytes.data(),
                std::min<size_t>(bytes.size(), 64));
    e.protocol.OnCompletion(
        handle, {absl::OkStatus(), len.value_or(static_cast<uint32_t>(bytes.size()))}, kT0);
    return e.protocol.status();
  }
  static std::vector<uint8_t> Chunk(ChunkType type, uint8_t flags, uint32_t credits, uint64_t total,
                                    size_t payload) {
    std::vector<uint8_t> v(kChunkHeaderBytes + payload, 0xAB);
    ChunkHeader h;
    h.type = type;
    h.flags = flags;
    h.credits = credits;
    h.total_bytes = total;
    EncodeChunkHeader(h, v.data());
    return v;
  }
  Endpoint e;
  std::vector<uint8_t> out = std::vector<uint8_t>(1000);
};

TEST_CASE("malformed chunks close the connection with DataLoss, never crash", "[verbs]") {
  const uint8_t both = kFirstChunk | kLastChunk;
  struct Case {
    const char* name;
    std::vector<std::vector<uint8_t>> chunks;
    std::optional<uint32_t> len;
  };
  std::vector<uint8_t> garbage(30, 0x42);
  const std::vector<Case> cases = {
      {"garbage", {garbage}, {}},
      {"shorter than a header", {std::vector<uint8_t>(5, 0)}, {}},
      {"longer than a slot", {Forged::Chunk(ChunkType::kData, both, 0, 1, 1)}, 65},
      {"continuation first", {Forged::Chunk(ChunkType::kData, kLastChunk, 0, 4, 4)}, {}},
      {"too many credits", {Forged::Chunk(ChunkType::kCredit, 0, 1, 0, 0)}, {}},
      {"over max_message_bytes",
       {Forged::Chunk(ChunkType::kData, kFirstChunk, 0, (1 << 20) + 1, 48)},
       {}},
      {"payload beyond total", {Forged::Chunk(ChunkType::kData, both, 0, 3, 4)}, {}},
      {"last chunk short of total", {Forged::Chunk(ChunkType::kData, both, 0, 9, 4)}, {}},
      {"empty middle chunk",
       {Forged::Chunk(ChunkType::kData, kFirstChunk, 0, 100, 48),
        Forged::Chunk(ChunkType::kData, 0, 0, 100, 0)},
       {}},
      {"length changes mid-message",
       {Forged::Chunk(ChunkType::kData, kFirstChunk, 0, 100, 48),
        Forged::Chunk(ChunkType::kData, kLastChunk, 0, 101, 52)},
       {}},
      {"two first chunks",
       {Forged::Chunk(ChunkType::kData, kFirstChunk, 0, 100, 48),
        Forged::Chunk(ChunkType::kData, kFirstChunk, 0, 100, 48)},
       {}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Forged f;
    absl::Status status;
    for (size_t i = 0; i < c.chunks.size(); ++i) {
      status = f.Deliver(c.chunks[i], i + 1 == c.chunks.size() ? c.len : std::nullopt);
    }
    CHECK(status.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(status.message()).find("forger") != std::string::npos);
    const std::vector<Completion> done = f.e.Drain();
    REQUIRE(done.size() == 1);  // the posted receive failed
    CHECK(done[0].wr_id == 77);
    CHECK(done[0].status.code() == absl::StatusCode::kDataLoss);
    CHECK(f.e.qp.aborts == 1);
  }
  // The control: a well-formed single-chunk message is delivered.
  Forged ok;
  CHECK(ok.Deliver(Forged::Chunk(ChunkType::kData, both, 0, 4, 4)).ok());
  const std::vector<Completion> done = ok.e.Drain();
  REQUIRE(done.size() == 1);
  CHECK(done[0].status.ok());
  CHECK(done[0].bytes == 4);
  CHECK(ok.out[0] == 0xAB);
  CHECK(ok.e.protocol.owed_credits() == 1);  // the receive was re-posted, to be announced
}

}  // namespace
}  // namespace plexus::transport::verbs
