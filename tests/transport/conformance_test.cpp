// The transport contract (connection.hpp), checked for every backend and progress mode.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <future>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "conformance_support.hpp"
#include "plexus/base/net.hpp"
#include "plexus/transport/device.hpp"
#include "support/child_process.hpp"

namespace pt = plexus::transport;

using namespace plexus::transport::conformance;  // NOLINT

TEST_CASE("messages arrive whole, once and in order", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    constexpr int kMessages = 300;
    std::vector<std::vector<uint8_t>> sent, received(kMessages);
    for (int i = 0; i < kMessages; ++i) sent.push_back(Pattern(1 + (i * 7919) % 3000, i));
    // Half the receives are posted before the sends, half after (held messages).
    for (int i = 0; i < kMessages / 2; ++i) {
      received[i].resize(4096);
      REQUIRE(p.b->PostRecv({received[i].data(), received[i].size()}, i).ok());
    }
    for (int i = 0; i < kMessages; ++i) {
      REQUIRE(p.a->PostSend(pt::ConstBuffer{sent[i].data(), sent[i].size()}, 1000 + i).ok());
    }
    for (int i = kMessages / 2; i < kMessages; ++i) {
      received[i].resize(4096);
      REQUIRE(p.b->PostRecv({received[i].data(), received[i].size()}, i).ok());
    }
    std::vector<pt::Completion> ca, cb;
    Collect(p, kMessages, kMessages, &ca, &cb);
    for (int i = 0; i < kMessages; ++i) {
      CHECK(ca[i].opcode == pt::Opcode::kSend);
      CHECK(ca[i].wr_id == 1000u + i);
      REQUIRE(cb[i].status.ok());
      CHECK(cb[i].opcode == pt::Opcode::kRecv);
      REQUIRE(cb[i].wr_id == static_cast<uint64_t>(i));
      REQUIRE(cb[i].bytes == sent[i].size());
      REQUIRE(std::memcmp(received[i].data(), sent[i].data(), sent[i].size()) == 0);
      CHECK(cb[i].connection_id == p.b->id());
    }
  }
}

// PeekNext shows the message the next receive would take, without taking it, only once it is
// whole and only while no receive is posted for it (the basis of a receive from any source).
TEST_CASE("PeekNext shows the next held message without consuming it", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    uint8_t head[16] = {};
    auto peek = [&]() -> std::optional<size_t> {
      absl::StatusOr<std::optional<size_t>> r = p.b->PeekNext({head, sizeof head});
      REQUIRE(r.ok());
      return *r;
    };
    // Drives b's progress (caller mode) until a message is held, or fails after 20 s.
    auto await_peek = [&]() -> size_t {
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      pt::Completion buf[4];
      while (true) {
        if (std::optional<size_t> n = peek()) return *n;
        REQUIRE(absl::Now() < deadline);
        REQUIRE(p.cq_b->Poll(absl::MakeSpan(buf)) == 0);  // no receive is posted
        std::this_thread::yield();
      }
    };
    CHECK_FALSE(peek().has_value());
    const std::vector<uint8_t> m1 = Pattern(100, 1), m2 = Pattern(200000, 2), m3 = Pattern(8, 3);
    REQUIRE(p.a->PostSend(pt::ConstBuffer{m1.data(), m1.size()}, 1).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{m2.data(), m2.size()}, 2).ok());
    REQUIRE(await_peek() == m1.size());
    CHECK(std::memcmp(head, m1.data(), sizeof head) == 0);
    REQUIRE(peek() == m1.size());  // still there: nothing was consumed
    std::vector<uint8_t> got(m2.size());
    REQUIRE(p.b->PostRecv({got.data(), got.size()}, 10).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 2, 1, &ca, &cb);
    REQUIRE(cb[0].status.ok());
    REQUIRE(cb[0].bytes == m1.size());
    CHECK(std::memcmp(got.data(), m1.data(), m1.size()) == 0);
    // The second message, whole (it may still be arriving: peek waits for all of it).
    REQUIRE(await_peek() == m2.size());
    CHECK(std::memcmp(head, m2.data(), sizeof head) == 0);
    REQUIRE(p.b->PostRecv({got.data(), got.size()}, 11).ok());
    cb.clear();
    Collect(p, 2, 1, &ca, &cb);
    REQUIRE(cb[0].status.ok());
    CHECK(got == m2);
    CHECK_FALSE(peek().has_value());
    // A receive posted first takes the next message directly: there is nothing to peek at.
    REQUIRE(p.b->PostRecv({got.data(), got.size()}, 12).ok());
    CHECK_FALSE(peek().has_value());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{m3.data(), m3.size()}, 3).ok());
    cb.clear();
    Collect(p, 3, 1, &ca, &cb);
    REQUIRE(cb[0].bytes == m3.size());
    CHECK_FALSE(peek().has_value());
  }
}

TEST_CASE("messages of mixed sizes sent back to back straddle the receiver's reads",
          "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    // Small, around the tcp staging buffer (32 KiB) and well over it, in an order where a
    // payload's tail and the next frames' headers arrive in one read.
    const std::vector<size_t> sizes = {5,     40000, 3,  33000, 70000, 8200, 1,      100000,
                                       32768, 32767, 17, 65536, 9000,  9000, 250000, 2};
    constexpr int kRounds = 8;
    std::vector<std::vector<uint8_t>> sent, received;
    for (int r = 0; r < kRounds; ++r) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        sent.push_back(Pattern(sizes[(i + r) % sizes.size()], r * 100 + i));
        received.emplace_back(sent.back().size() + 16);
      }
    }
    for (size_t i = 0; i < received.size(); ++i) {
      REQUIRE(p.b->PostRecv({received[i].data(), received[i].size()}, i).ok());
    }
    for (size_t i = 0; i < sent.size(); ++i) {
      REQUIRE(p.a->PostSend(pt::ConstBuffer{sent[i].data(), sent[i].size()}, 1000 + i).ok());
    }
    std::vector<pt::Completion> ca, cb;
    Collect(p, sent.size(), sent.size(), &ca, &cb);
    for (size_t i = 0; i < sent.size(); ++i) {
      REQUIRE(cb[i].status.ok());
      REQUIRE(cb[i].wr_id == i);
      REQUIRE(cb[i].bytes == sent[i].size());
      REQUIRE(std::memcmp(received[i].data(), sent[i].data(), sent[i].size()) == 0);
    }
  }
}

TEST_CASE("message sizes from 1 B to 1 GiB", "[conformance][large]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    std::vector<size_t> sizes = {0, 1, 7, 64, 4095, 65536, 1 << 20, (16 << 20) + 3};
    // One 1 GiB message per backend (not per mode) keeps the suite fast.
    if (config.progress == pt::ProgressMode::kThread && config.sockets == 1) {
      sizes.push_back(size_t{1} << 30);
    }
    for (size_t size : sizes) {
      INFO("size " << size);
      std::vector<uint8_t> out = size > (64 << 20) ? std::vector<uint8_t>(size, 0)
                                                   : Pattern(size, static_cast<uint32_t>(size));
      if (size > (64 << 20)) {
        for (size_t i = 0; i < size; i += 4096) out[i] = static_cast<uint8_t>(i / 4096 + 1);
        out[size - 1] = 0xab;
      }
      std::vector<uint8_t> in(size + 1, 0);
      REQUIRE(p.b->PostRecv({in.data(), in.size()}, 1).ok());
      REQUIRE(p.a->PostSend(pt::ConstBuffer{out.data(), size}, 2).ok());
      std::vector<pt::Completion> ca, cb;
      Collect(p, 1, 1, &ca, &cb, absl::Seconds(120));
      REQUIRE(ca[0].status.ok());
      REQUIRE(cb[0].status.ok());
      REQUIRE(cb[0].bytes == size);
      REQUIRE(std::memcmp(in.data(), out.data(), size) == 0);
    }
  }
}

TEST_CASE("scatter-gather send delivers the concatenation", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    const std::vector<size_t> parts = {3, 0, 1000, 70000, 1, 200000};
    std::vector<std::vector<uint8_t>> data;
    std::vector<pt::ConstBuffer> buffers;
    std::vector<uint8_t> expected;
    for (size_t i = 0; i < parts.size(); ++i) {
      data.push_back(Pattern(parts[i], static_cast<uint32_t>(i + 11)));
      buffers.push_back({data.back().data(), data.back().size()});
      expected.insert(expected.end(), data.back().begin(), data.back().end());
    }
    std::vector<uint8_t> in(expected.size());
    REQUIRE(p.b->PostRecv({in.data(), in.size()}, 5).ok());
    REQUIRE(p.a->PostSend(absl::MakeConstSpan(buffers), 6).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 1, 1, &ca, &cb);
    REQUIRE(cb[0].status.ok());
    CHECK(cb[0].bytes == expected.size());
    CHECK(in == expected);
  }
}

// SendNowOrPost: a send that left within the call has no completion and its buffer is free at
// once; any other completes as PostSend's would, in order with PostSend's own.
TEST_CASE("SendNowOrPost: a send that left needs no completion, the others complete",
          "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    constexpr int kMessages = 120;
    std::vector<std::vector<uint8_t>> sent, received(kMessages);
    for (int i = 0; i < kMessages; ++i) {
      // Small ones, and every tenth 300 KiB (queued behind the socket, striped over several).
      sent.push_back(Pattern(i % 10 == 9 ? (300 << 10) + i : 1 + (i * 7919) % 3000, i + 77));
      received[i].resize(sent[i].size());
      REQUIRE(p.b->PostRecv({received[i].data(), received[i].size()}, i).ok());
    }
    std::vector<uint64_t> want_completions;  // wr ids, in order
    int left_now = 0;
    bool first_left_now = false;
    for (int i = 0; i < kMessages; ++i) {
      std::vector<uint8_t> buffer = sent[i];
      const uint64_t wr = 1000 + i;
      if (i % 3 == 2) {
        REQUIRE(p.a->PostSend(pt::ConstBuffer{buffer.data(), buffer.size()}, wr).ok());
        want_completions.push_back(wr);
        // PostSend's buffer stays untouched until its completion: keep it alive.
        sent.push_back(std::move(buffer));
        continue;
      }
      absl::StatusOr<bool> now =
          p.a->SendNowOrPost(pt::ConstBuffer{buffer.data(), buffer.size()}, wr);
      REQUIRE(now.ok());
      if (i == 0) first_left_now = *now;
      if (*now) {
        ++left_now;
        std::fill(buffer.begin(), buffer.end(), 0xEE);  // free at once: the bytes already left
      } else {
        want_completions.push_back(wr);
        sent.push_back(std::move(buffer));
      }
    }
    // tcp with one socket writes a small message on an idle connection within the call.
    if (config.backend == pt::Backend::kTcp && config.sockets == 1) CHECK(first_left_now);
    INFO(left_now << " of " << (kMessages - kMessages / 3) << " left within the call");
    std::vector<pt::Completion> ca, cb;
    Collect(p, want_completions.size(), kMessages, &ca, &cb);
    // No completion beyond those: a short quiet look at the sender's queue.
    const absl::Time quiet_until = absl::Now() + absl::Milliseconds(100);
    pt::Completion extra[4];
    while (absl::Now() < quiet_until) {
      const size_t n = p.cq_a->Poll(absl::MakeSpan(extra));
      for (size_t k = 0; k < n; ++k) ca.push_back(extra[k]);
      p.cq_b->Poll(absl::MakeSpan(extra, 0));
      std::this_thread::yield();
    }
    REQUIRE(ca.size() == want_completions.size());
    for (size_t k = 0; k < ca.size(); ++k) {
      CHECK(ca[k].status.ok());
      CHECK(ca[k].opcode == pt::Opcode::kSend);
      CHECK(ca[k].wr_id == want_completions[k]);
    }
    for (int i = 0; i < kMessages; ++i) {
      REQUIRE(cb[i].status.ok());
      REQUIRE(cb[i].wr_id == static_cast<uint64_t>(i));
      REQUIRE(cb[i].bytes == sent[i].size());
      REQUIRE(std::memcmp(received[i].data(), sent[i].data(), sent[i].size()) == 0);
    }
    // A connection already closed refuses, as PostSend does.
    p.a->Close();
    uint8_t byte = 1;
    CHECK_FALSE(p.a->SendNowOrPost(pt::ConstBuffer{&byte, 1}, 9999).ok());
  }
}

TEST_CASE("one-sided writes land at the offset and deliver the immediate", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    std::vector<uint8_t> target(1 << 20, 0), source = Pattern(300000, 9);
    auto remote = p.dev_b->Register(target.data(), target.size());
    REQUIRE(remote.ok());
    auto local = p.dev_a->Register(source.data(), source.size());
    REQUIRE(local.ok());
    // The handle travels as bytes, as it would between processes.
    auto handle = pt::RegionHandle::Decode((*remote)->handle().Encode());
    REQUIRE(handle.ok());

    // A message, then a write with an immediate: the immediate comes after the message.
    char note[8] = "before", got[8] = {};
    REQUIRE(p.b->PostRecv({got, sizeof got}, 1).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{note, sizeof note}, 2).ok());
    REQUIRE(p.a->PostWrite(**local, 1000, 200000, *handle, 5000, std::nullopt, 3).ok());
    REQUIRE(p.a->PostWrite(**local, 0, 10, *handle, 0, 0xC0FFEEu, 4).ok());
    std::vector<pt::Completion> ca, cb;
    Collect(p, 3, 2, &ca, &cb);
    for (const auto& c : ca) REQUIRE(c.status.ok());
    CHECK(ca[0].opcode == pt::Opcode::kSend);
    CHECK(ca[1].opcode == pt::Opcode::kWrite);
    CHECK(ca[1].wr_id == 3);
    CHECK(ca[2].wr_id == 4);
    CHECK(cb[0].opcode == pt::Opcode::kRecv);
    REQUIRE(cb[1].opcode == pt::Opcode::kRemoteWrite);
    CHECK(cb[1].has_immediate);
    CHECK(cb[1].immediate == 0xC0FFEEu);
    CHECK(cb[1].bytes == 10);
    CHECK(std::memcmp(target.data() + 5000, source.data() + 1000, 200000) == 0);
    CHECK(std::memcmp(target.data(), source.data(), 10) == 0);
    CHECK(target[4999] == 0);
    CHECK(target[205000] == 0);

    // A bulk write (large enough for every backend's bulk path: striping, cross-memory attach).
    std::vector<uint8_t> big_target((8 << 20) + 4096, 0), big_source = Pattern((8 << 20) + 3, 5);
    auto big_remote = p.dev_b->Register(big_target.data(), big_target.size());
    auto big_local = p.dev_a->Register(big_source.data(), big_source.size());
    REQUIRE(big_remote.ok());
    REQUIRE(big_local.ok());
    REQUIRE(p.a->PostWrite(**big_local, 0, big_source.size(), (*big_remote)->handle(), 4093, 7u, 8)
                .ok());
    ca.clear();
    cb.clear();
    Collect(p, 1, 1, &ca, &cb);
    REQUIRE(ca[0].status.ok());
    REQUIRE(cb[0].opcode == pt::Opcode::kRemoteWrite);
    CHECK(cb[0].immediate == 7u);
    CHECK(std::memcmp(big_target.data() + 4093, big_source.data(), big_source.size()) == 0);
    CHECK(big_target[4092] == 0);

    // Out of range for the remote region: rejected at post time.
    CHECK_FALSE(p.a->PostWrite(**local, 0, 100, *handle, target.size() - 50, std::nullopt, 9).ok());
    // Out of range locally.
    CHECK_FALSE(p.a->PostWrite(**local, source.size() - 5, 10, *handle, 0, std::nullopt, 9).ok());
  }
}

TEST_CASE("64 concurrent connections", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    auto client = pt::Device::Create(OptionsFor(config));
    auto server = pt::Device::Create(OptionsFor(config));
    REQUIRE(client.ok());
    REQUIRE(server.ok());
    auto cq_c = (*client)->CreateCompletionQueue();
    auto cq_s = (*server)->CreateCompletionQueue();
    auto listener = (*server)->Listen("");
    REQUIRE(listener.ok());
    constexpr int kConns = 64;
    auto accepted = std::async(std::launch::async, [&] {
      std::vector<std::unique_ptr<pt::Connection>> out;
      for (int i = 0; i < kConns; ++i) {
        auto c = (*listener)->Accept(cq_s.get(), absl::Seconds(20));
        if (!c.ok()) break;
        out.push_back(*std::move(c));
      }
      return out;
    });
    std::vector<std::unique_ptr<pt::Connection>> conns;
    for (int i = 0; i < kConns; ++i) {
      auto c = (*client)->Connect((*listener)->address(), cq_c.get());
      REQUIRE(c.ok());
      conns.push_back(*std::move(c));
    }
    auto servers = accepted.get();
    REQUIRE(servers.size() == kConns);
    std::vector<uint32_t> in(kConns, 0), out(kConns);
    for (int i = 0; i < kConns; ++i) {
      REQUIRE(servers[i]->PostRecv({&in[i], sizeof(uint32_t)}, i).ok());
    }
    for (int i = 0; i < kConns; ++i) {
      out[i] = 0x1000 + i;
      REQUIRE(conns[i]->PostSend(pt::ConstBuffer{&out[i], sizeof(uint32_t)}, i).ok());
    }
    int sends = 0, recvs = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (sends < kConns || recvs < kConns) {
      REQUIRE(absl::Now() < deadline);
      pt::Completion c[16];
      size_t n = cq_c->Poll(absl::MakeSpan(c));
      for (size_t i = 0; i < n; ++i) sends += c[i].status.ok();
      n = cq_s->Poll(absl::MakeSpan(c));
      for (size_t i = 0; i < n; ++i) {
        REQUIRE(c[i].status.ok());
        ++recvs;
      }
    }
    // Each connection carried its own message: receive i holds 0x1000 + (sender matching i).
    std::vector<uint32_t> sorted = in;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < kConns; ++i) CHECK(sorted[i] == 0x1000u + i);
  }
}

TEST_CASE("a message longer than the posted receive fails it", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    std::vector<uint8_t> small(10), big(100, 1);
    REQUIRE(p.b->PostRecv({small.data(), small.size()}, 1).ok());
    REQUIRE(p.a->PostSend(pt::ConstBuffer{big.data(), big.size()}, 2).ok());
    auto c = Next(*p.cq_b);
    CHECK(c.wr_id == 1);
    CHECK(absl::IsResourceExhausted(c.status));
  }
}

TEST_CASE("closing fails outstanding operations on both ends", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    std::vector<uint8_t> buf(64);
    REQUIRE(p.a->PostRecv({buf.data(), buf.size()}, 1).ok());
    REQUIRE(p.b->PostRecv({buf.data(), buf.size()}, 2).ok());
    p.a->Close();
    auto mine = Next(*p.cq_a);
    CHECK(mine.wr_id == 1);
    CHECK(absl::IsCancelled(mine.status));
    auto theirs = Next(*p.cq_b, absl::Seconds(10));
    CHECK(theirs.wr_id == 2);
    INFO(theirs.status.ToString());
    CHECK(absl::IsAborted(theirs.status));  // a deliberate close, not a dead peer
    // Sending on the failed connection is refused at once or completes with an error.
    const absl::Status posted = p.b->PostSend(pt::ConstBuffer{buf.data(), 1}, 3);
    if (posted.ok()) CHECK_FALSE(Next(*p.cq_b, absl::Seconds(10)).status.ok());
  }
}

TEST_CASE("messages sent before the peer closed are still delivered", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    std::vector<uint32_t> out = {11, 22, 33};
    for (uint32_t i = 0; i < 3; ++i) {
      REQUIRE(p.a->PostSend(pt::ConstBuffer{&out[i], sizeof(uint32_t)}, i).ok());
    }
    std::vector<pt::Completion> ca, cb;
    Collect(p, 3, 0, &ca, &cb);
    for (const auto& c : ca) REQUIRE(c.status.ok());
    // Let the bytes reach the receiver before the close does.
    const absl::Time settle = absl::Now() + absl::Milliseconds(200);
    while (absl::Now() < settle) p.cq_b->Poll({});
    p.a->Close();
    const absl::Time closed_seen = absl::Now() + absl::Milliseconds(200);
    while (absl::Now() < closed_seen) p.cq_b->Poll({});
    std::vector<uint32_t> in(4, 0);
    int delivered = 0;
    absl::Status last;
    for (int i = 0; i < 4; ++i) {
      const absl::Status posted = p.b->PostRecv({&in[i], sizeof(uint32_t)}, 100 + i);
      if (!posted.ok()) {
        last = posted;
        break;
      }
      auto c = Next(*p.cq_b, absl::Seconds(10));
      if (!c.status.ok()) {
        last = c.status;
        break;
      }
      CHECK(in[i] == out[i]);
      ++delivered;
    }
    CHECK(delivered == 3);
    CHECK_FALSE(last.ok());  // and then the connection reports the close
  }
}

TEST_CASE("mailbox: small messages arrive whole, once and in order", "[conformance][mailbox]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    Pair p = MakePair(config);
    const bool offered =
        config.backend == pt::Backend::kShm || config.backend == pt::Backend::kInproc;
    REQUIRE((p.a->mailbox() != nullptr) == offered);
    if (!offered) return;
    pt::Mailbox& tx = *p.a->mailbox();
    pt::Mailbox& rx = *p.b->mailbox();
    std::vector<uint8_t> in(pt::Mailbox::kMaxMessageBytes);

    auto none = rx.TryReceive(absl::MakeSpan(in));
    REQUIRE(none.ok());
    CHECK_FALSE(none->has_value());
    // Oversized messages are refused; the inbox holds kSlots messages, then says "full".
    std::vector<uint8_t> big(pt::Mailbox::kMaxMessageBytes + 1);
    CHECK(absl::IsInvalidArgument(tx.TrySend(big).status()));
    for (int i = 0; i < pt::Mailbox::kSlots; ++i) {
      const std::vector<uint8_t> msg = Pattern(i % 3 == 0 ? 0 : 1 + i * 63, i);
      // Odd messages go gathered from two parts.
      const size_t cut = msg.size() / 3;
      const pt::ConstBuffer parts[2] = {{msg.data(), cut}, {msg.data() + cut, msg.size() - cut}};
      auto sent = i % 2 == 0 ? tx.TrySend(msg) : tx.TrySend(absl::MakeConstSpan(parts, 2));
      REQUIRE(sent.ok());
      REQUIRE(*sent);
    }
    auto full = tx.TrySend(Pattern(8, 99));
    REQUIRE(full.ok());
    CHECK_FALSE(*full);
    for (int i = 0; i < pt::Mailbox::kSlots; ++i) {
      const std::vector<uint8_t> want = Pattern(i % 3 == 0 ? 0 : 1 + i * 63, i);
      // Peek shows the message in place and twice; TryReceive then copies and releases it.
      for (int look = 0; look < 2; ++look) {
        auto peeked = rx.Peek();
        REQUIRE(peeked.ok());
        REQUIRE(peeked->has_value());
        REQUIRE((*peeked)->size() == want.size());
        REQUIRE(std::equal(want.begin(), want.end(), (*peeked)->begin()));
      }
      auto got = rx.TryReceive(absl::MakeSpan(in));
      REQUIRE(got.ok());
      REQUIRE(got->has_value());
      REQUIRE(**got == want.size());
      REQUIRE(std::memcmp(in.data(), want.data(), want.size()) == 0);
    }

    // A stream between two threads, the receiver sleeping in Wait when the sender pauses.
    constexpr uint32_t kMessages = 100000;
    std::thread sender([&] {
      for (uint32_t i = 0; i < kMessages; ++i) {
        if (i % 20000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const uint32_t words[2] = {i, ~i};
        const auto bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(words),
                                               (i % 2 + 1) * sizeof(uint32_t));
        for (;;) {
          auto ok = tx.TrySend(bytes);
          if (!ok.ok() || *ok) break;
          std::this_thread::yield();
        }
      }
    });
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    uint32_t next = 0;
    bool in_order = true;
    while (next < kMessages && absl::Now() < deadline) {
      auto got = rx.TryReceive(absl::MakeSpan(in));
      REQUIRE(got.ok());
      if (!got->has_value()) {
        rx.Wait(absl::Milliseconds(100));
        continue;
      }
      uint32_t words[2] = {};
      std::memcpy(words, in.data(), **got);
      in_order = in_order && **got == (next % 2 + 1) * sizeof(uint32_t) && words[0] == next &&
                 (next % 2 == 0 || words[1] == ~next);
      ++next;
    }
    sender.join();
    CHECK(in_order);
    CHECK(next == kMessages);
    auto extra = rx.TryReceive(absl::MakeSpan(in));
    REQUIRE(extra.ok());
    CHECK_FALSE(extra->has_value());  // nothing duplicated

    // Wait returns when a message arrives, well before its limit. The send's status is checked
    // after the join (Catch2 assertions are not thread-safe).
    absl::Status late_sent;
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      const uint8_t one = 1;
      late_sent = tx.TrySend(absl::MakeConstSpan(&one, 1)).status();
    });
    const absl::Time start = absl::Now();
    std::optional<size_t> woke;
    while (!woke.has_value() && absl::Now() - start < absl::Seconds(5)) {
      rx.Wait(absl::Seconds(5));
      auto got = rx.TryReceive(absl::MakeSpan(in));
      REQUIRE(got.ok());
      woke = *got;
    }
    late.join();
    INFO("the late send: " << late_sent);
    REQUIRE(late_sent.ok());
    CHECK(woke.has_value());
    CHECK(absl::Now() - start < absl::Seconds(2));
  }
}

TEST_CASE("mailbox: messages sent before a close are delivered, then the close is reported",
          "[conformance][mailbox]") {
  const Config config = GENERATE(from_range(Configs()));
  if (config.backend != pt::Backend::kShm && config.backend != pt::Backend::kInproc) return;
  SECTION(config.name) {
    Pair p = MakePair(config);
    const uint8_t msg[3] = {7, 8, 9};
    for (int i = 0; i < 2; ++i) REQUIRE(*p.a->mailbox()->TrySend(msg));
    p.a->Close();
    CHECK_FALSE(p.a->mailbox()->TrySend(msg).ok());
    std::vector<uint8_t> in(pt::Mailbox::kMaxMessageBytes);
    int delivered = 0;
    absl::Status end;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    pt::Completion sink[4];
    while (end.ok() && absl::Now() < deadline) {
      p.cq_b->Poll(absl::MakeSpan(sink));  // caller-mode progress notices the close
      auto got = p.b->mailbox()->TryReceive(absl::MakeSpan(in));
      if (!got.ok()) {
        end = got.status();
      } else if (got->has_value()) {
        CHECK(**got == 3);
        ++delivered;
      }
    }
    CHECK(delivered == 2);
    INFO(end.ToString());
    CHECK(absl::IsAborted(end));
  }
}

TEST_CASE("connecting where nobody listens gives a clear error", "[conformance]") {
  const Config config = GENERATE(from_range(Configs()));
  SECTION(config.name) {
    auto dev = pt::Device::Create(OptionsFor(config));
    REQUIRE(dev.ok());
    auto cq = (*dev)->CreateCompletionQueue();
    std::string address = "plexus-nobody-listens-here";
    if (config.backend == pt::Backend::kTcp) {
      const absl::StatusOr<uint16_t> port = plexus::base::net::ReserveLoopbackPort();
      REQUIRE(port.ok());
      address = "127.0.0.1:" + std::to_string(*port);
    }
    const absl::Time start = absl::Now();
    auto conn = (*dev)->Connect(address, cq.get());
    REQUIRE_FALSE(conn.ok());
    CHECK(absl::Now() - start < absl::Seconds(6));
    const std::string msg(conn.status().message());
    INFO(msg);
    CHECK(msg.find(address) != std::string::npos);
  }
}

TEST_CASE("a peer process killed mid-transfer fails outstanding receives in time",
          "[conformance][process]") {
  for (pt::Backend backend : {pt::Backend::kShm, pt::Backend::kTcp}) {
    Config config{std::string(pt::BackendName(backend)), backend};
    SECTION(config.name) {
      auto dev = pt::Device::Create(OptionsFor(config));
      REQUIRE(dev.ok());
      auto cq = (*dev)->CreateCompletionQueue();
      auto listener = (*dev)->Listen("");
      REQUIRE(listener.ok());
      const std::string address = (*listener)->address();
      const std::string backend_name(pt::BackendName(backend));
      plexus::testing::Child peer({PLEXUS_TRANSPORT_PEER, backend_name, address, "stream"});
      auto conn = (*listener)->Accept(cq.get(), absl::Seconds(10));
      REQUIRE(conn.ok());
      std::vector<uint8_t> buf(64 << 20);
      REQUIRE((*conn)->PostRecv({buf.data(), buf.size()}, 0).ok());
      auto first = Next(*cq);  // the stream is flowing
      REQUIRE(first.status.ok());
      REQUIRE(peer.Signal(SIGKILL));
      REQUIRE(peer.Wait() == 128 + SIGKILL);
      const absl::Time killed = absl::Now();
      // Messages already in flight may still arrive; the stream must then end in an error.
      absl::Status error;
      for (uint64_t i = 1; i <= 64 && error.ok(); ++i) {
        const absl::Status posted = (*conn)->PostRecv({buf.data(), buf.size()}, i);
        if (!posted.ok()) {
          error = posted;
          break;
        }
        error = Next(*cq, OptionsFor(config).op_timeout + absl::Seconds(2)).status;
      }
      INFO(error.ToString());
      CHECK_FALSE(error.ok());
      CHECK_FALSE(absl::IsAborted(error));  // death, not a deliberate close
      CHECK(absl::Now() - killed <= OptionsFor(config).op_timeout + absl::Seconds(1));
      CHECK_FALSE((*conn)->status().ok());
    }
  }
}

TEST_CASE("tcp: local_address chooses the path's source address", "[conformance][tcp]") {
  // 127.0.0.2 is a loopback address on Linux without any configuration.
  pt::DeviceOptions server_options;
  server_options.backend = pt::Backend::kTcp;
  auto server = pt::Device::Create(server_options);
  REQUIRE(server.ok());
  pt::DeviceOptions client_options = server_options;
  client_options.local_address = "127.0.0.2";
  client_options.tcp.sockets_per_connection = 2;
  auto client = pt::Device::Create(client_options);
  REQUIRE(client.ok());
  auto cq_s = (*server)->CreateCompletionQueue();
  auto cq_c = (*client)->CreateCompletionQueue();
  auto listener = (*server)->Listen("127.0.0.1:0");
  REQUIRE(listener.ok());
  auto conn = (*client)->Connect((*listener)->address(), cq_c.get());
  REQUIRE(conn.ok());
  auto accepted = (*listener)->Accept(cq_s.get(), absl::Seconds(5));
  REQUIRE(accepted.ok());
  CHECK((*accepted)->peer_address().rfind("127.0.0.2:", 0) == 0);

  // An address this host does not have is refused with a clear error.
  pt::DeviceOptions bad = client_options;
  bad.local_address = "192.0.2.1";  // TEST-NET-1, never assigned to a local interface
  auto bad_client = pt::Device::Create(bad);
  REQUIRE(bad_client.ok());
  auto refused = (*bad_client)->Connect((*listener)->address(), cq_c.get());
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("192.0.2.1") != std::string::npos);
}

TEST_CASE("tcp: ConnectFrom picks the source address per connection on one device",
          "[conformance][tcp]") {
  // One device, two connections from two loopback sources: the device's registrations serve
  // both, which is what a multipath channel needs.
  pt::DeviceOptions options;
  options.backend = pt::Backend::kTcp;
  auto server = pt::Device::Create(options);
  REQUIRE(server.ok());
  auto client = pt::Device::Create(options);
  REQUIRE(client.ok());
  auto cq_s = (*server)->CreateCompletionQueue();
  auto cq_c = (*client)->CreateCompletionQueue();
  auto listener = (*server)->Listen("127.0.0.1:0");
  REQUIRE(listener.ok());
  std::vector<uint8_t> target(64, 0);
  auto target_region = (*server)->Register(target.data(), target.size());
  REQUIRE(target_region.ok());
  std::vector<uint8_t> source(64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i + 1);
  auto source_region = (*client)->Register(source.data(), source.size());
  REQUIRE(source_region.ok());
  for (const char* from : {"127.0.0.3", "127.0.0.4"}) {
    auto conn = (*client)->ConnectFrom(from, (*listener)->address(), cq_c.get());
    REQUIRE(conn.ok());
    auto accepted = (*listener)->Accept(cq_s.get(), absl::Seconds(5));
    REQUIRE(accepted.ok());
    CHECK((*accepted)->peer_address().rfind(std::string(from) + ":", 0) == 0);
    const size_t offset = from[8] == '3' ? 0 : 32;
    REQUIRE((*conn)
                ->PostWrite(**source_region, offset, 32, (*target_region)->handle(), offset,
                            std::nullopt, 7)
                .ok());
    auto done = cq_c->Wait(absl::Seconds(5));
    REQUIRE(done.ok());
    CHECK(done->status.ok());
    CHECK(done->opcode == pt::Opcode::kWrite);
  }
  CHECK(target == source);

  // An address this host does not have: a clear error naming it.
  auto refused = (*client)->ConnectFrom("192.0.2.1", (*listener)->address(), cq_c.get());
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("192.0.2.1") != std::string::npos);

  // A backend without per-connection sources refuses a different one by name.
  pt::DeviceOptions inproc_options;
  inproc_options.backend = pt::Backend::kInproc;
  auto inproc = pt::Device::Create(inproc_options);
  REQUIRE(inproc.ok());
  auto inproc_cq = (*inproc)->CreateCompletionQueue();
  auto unsupported = (*inproc)->ConnectFrom("127.0.0.3", "x", inproc_cq.get());
  REQUIRE_FALSE(unsupported.ok());
  CHECK(absl::IsUnimplemented(unsupported.status()));
  CHECK(std::string(unsupported.status().message()).find("inproc") != std::string::npos);
}

TEST_CASE("tcp: malformed and truncated frames close the connection with an error",
          "[conformance][tcp]") {
  pt::DeviceOptions options;
  options.backend = pt::Backend::kTcp;
  options.op_timeout = absl::Seconds(2);
  auto dev = pt::Device::Create(options);
  REQUIRE(dev.ok());
  auto cq = (*dev)->CreateCompletionQueue();
  auto listener = (*dev)->Listen("127.0.0.1:0");
  REQUIRE(listener.ok());
  const std::string address = (*listener)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));

  auto raw_connect = [&]() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    // A valid hello: magic "PLXT", version 1, socket 0 of 1, token.
    uint8_t hello[24] = {0x50, 0x4c, 0x58, 0x54, 1, 0, 0, 0, 1, 0, 0, 0, 7};
    REQUIRE(write(fd, hello, sizeof hello) == sizeof hello);
    return fd;
  };

  // Each case: bytes a hostile or broken peer sends after a valid hello, whether it then hangs
  // up, and the error the posted receive must complete with.
  struct BadPeer {
    const char* name;
    std::vector<uint8_t> bytes;
    bool hang_up;
    absl::StatusCode want;
  };
  const std::vector<uint8_t> header_of_100 = {1, 0, 0x50, 0x58, 0, 0, 0, 0, 100};  // kMessage
  std::vector<uint8_t> truncated = header_of_100;
  truncated.resize(42);  // the 32-byte header announces 100 bytes, 10 follow
  std::vector<uint8_t> unknown_region = {2, 0, 0x50, 0x58, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 42};
  unknown_region.resize(32);  // kWrite of 4 bytes to region 42
  const std::vector<BadPeer> cases = {
      {"garbage header", std::vector<uint8_t>(32, 0x5a), false, absl::StatusCode::kDataLoss},
      {"truncated payload, then the peer goes away", truncated, true,
       absl::StatusCode::kUnavailable},
      {"truncated payload from a stalled peer", truncated, false,
       absl::StatusCode::kDeadlineExceeded},
      {"write to an unknown region", unknown_region, false, absl::StatusCode::kDataLoss},
  };
  for (const BadPeer& bad : cases) {
    SECTION(bad.name) {
      int fd = raw_connect();
      auto conn = (*listener)->Accept(cq.get(), absl::Seconds(5));
      REQUIRE(conn.ok());
      std::vector<uint8_t> buf(100);
      REQUIRE((*conn)->PostRecv({buf.data(), buf.size()}, 1).ok());
      REQUIRE(write(fd, bad.bytes.data(), bad.bytes.size()) ==
              static_cast<ssize_t>(bad.bytes.size()));
      if (bad.hang_up) close(fd);
      auto c = Next(*cq, absl::Seconds(10));
      INFO(c.status.ToString());
      CHECK(c.status.code() == bad.want);
      if (!bad.hang_up) close(fd);
    }
  }
  SECTION("a client that is not Plexus is dropped, the listener keeps serving") {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const char http[] = "GET / HTTP/1.1\r\nHost: a\r\n";
    REQUIRE(write(fd, http, 24) == 24);
    auto none = (*listener)->Accept(cq.get(), absl::Milliseconds(500));
    CHECK(absl::IsDeadlineExceeded(none.status()));
    CHECK(std::string(none.status().message()).find("hello") != std::string::npos);
    close(fd);
    int good = raw_connect();
    CHECK((*listener)->Accept(cq.get(), absl::Seconds(5)).ok());
    close(good);
  }
}
