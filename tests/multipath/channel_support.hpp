// Helpers shared by the multipath channel tests (loopback and netns).
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <vector>

#include "absl/time/clock.h"
#include "plexus/multipath/channel.hpp"
#include "plexus/transport/completion.hpp"

namespace plexus::multipath::testing {

namespace pm = ::plexus::multipath;
namespace pt = ::plexus::transport;

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Waits for exactly `n` completions on `cq` (each checked OK), then checks no more arrive
// shortly after; returns them.
inline std::vector<pt::Completion> Expect(pt::CompletionQueue& cq, size_t n,
                                          absl::Duration timeout = absl::Seconds(60)) {
  std::vector<pt::Completion> out;
  const absl::Time deadline = absl::Now() + timeout;
  while (out.size() < n) {
    auto c = cq.Wait(deadline - absl::Now());
    REQUIRE(c.ok());
    INFO(c->status.ToString());
    CHECK(c->status.ok());
    out.push_back(std::move(*c));
  }
  return out;
}

inline void ExpectNoMore(pt::CompletionQueue& cq) {
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(cq.size() == 0);
}

// Sends `sizes` messages a -> b from unaligned offsets into unaligned offsets; checks every byte
// and exactly one completion per operation on each side.
inline void SendAndCheck(pm::MultipathChannel& a, pm::MultipathChannel& b,
                         pt::CompletionQueue& cq_a, pt::CompletionQueue& cq_b,
                         const std::vector<size_t>& sizes, uint32_t seed,
                         std::function<void(size_t)> during = nullptr) {
  std::vector<std::vector<uint8_t>> src, dst;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(Pattern(sizes[i] + 3, seed + static_cast<uint32_t>(i)));
    dst.emplace_back(sizes[i] + 5, 0xee);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(b.Recv({dst[i].data() + 5, sizes[i]}, 1000 + i).ok());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(a.Send({src[i].data() + 3, sizes[i]}, 2000 + i).ok());
    if (during) during(i);
  }
  auto sent = Expect(cq_a, sizes.size());
  auto received = Expect(cq_b, sizes.size());
  std::vector<int> sent_count(sizes.size(), 0);
  for (const auto& c : sent) {
    CHECK(c.opcode == pt::Opcode::kSend);
    REQUIRE(c.wr_id >= 2000);
    REQUIRE(c.wr_id < 2000 + sizes.size());
    ++sent_count[c.wr_id - 2000];
  }
  for (int n : sent_count) CHECK(n == 1);
  for (size_t i = 0; i < received.size(); ++i) {
    CHECK(received[i].opcode == pt::Opcode::kRecv);
    CHECK(received[i].wr_id == 1000 + i);  // in Send order
    CHECK(received[i].bytes == sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message " << i << " of " << sizes[i] << " bytes");
    CHECK(std::memcmp(dst[i].data() + 5, src[i].data() + 3, sizes[i]) == 0);
    CHECK(std::memcmp(dst[i].data(), std::vector<uint8_t>(5, 0xee).data(), 5) == 0);
  }
  ExpectNoMore(cq_a);
  ExpectNoMore(cq_b);
}

inline uint64_t BytesAcked(const pm::MultipathChannel& ch) {
  uint64_t n = 0;
  for (const auto& p : ch.Stats().paths) n += p.bytes_acked;
  return n;
}

inline void WaitBytesAcked(const pm::MultipathChannel& ch, uint64_t bytes) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (BytesAcked(ch) < bytes && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(200));
}

}  // namespace plexus::multipath::testing
