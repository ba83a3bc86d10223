// What the conformance tests share: the backends and progress modes every case runs on, a
// connected pair of endpoints, and the helpers that drive and check them.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/transport/device.hpp"

namespace plexus::transport::conformance {

namespace pt = plexus::transport;

struct Config {
  std::string name;
  pt::Backend backend;
  int sockets = 1;
  pt::ProgressMode progress = pt::ProgressMode::kThread;
};

inline std::vector<Config> Configs() {
  std::vector<Config> out = {
      {"inproc", pt::Backend::kInproc},
      {"shm/thread", pt::Backend::kShm},
      {"shm/caller", pt::Backend::kShm, 1, pt::ProgressMode::kCaller},
      {"tcp/thread", pt::Backend::kTcp},
      {"tcp/caller", pt::Backend::kTcp, 1, pt::ProgressMode::kCaller},
      {"tcp/4-sockets", pt::Backend::kTcp, 4},
  };
  if (pt::Device::Available(pt::Backend::kVerbs)) out.push_back({"verbs", pt::Backend::kVerbs});
  return out;
}

inline pt::DeviceOptions OptionsFor(const Config& c) {
  pt::DeviceOptions o;
  o.backend = c.backend;
  o.tcp.sockets_per_connection = c.sockets;
  o.progress = c.progress;
  o.tcp.stripe_threshold = 64 << 10;
  o.op_timeout = absl::Seconds(5);
  o.connect_timeout = absl::Seconds(5);
  if (c.backend == pt::Backend::kTcp) o.local_address = "127.0.0.1";
  return o;
}

// Two connected endpoints of one backend, each with its own device and completion queue.
struct Pair {
  std::shared_ptr<pt::Device> dev_a, dev_b;
  std::unique_ptr<pt::CompletionQueue> cq_a, cq_b;
  std::unique_ptr<pt::Connection> a, b;
};

inline Pair MakePair(const Config& c) {
  Pair p;
  auto da = pt::Device::Create(OptionsFor(c));
  REQUIRE(da.ok());
  auto db = pt::Device::Create(OptionsFor(c));
  REQUIRE(db.ok());
  p.dev_a = *da;
  p.dev_b = *db;
  p.cq_a = p.dev_a->CreateCompletionQueue();
  p.cq_b = p.dev_b->CreateCompletionQueue();
  auto listener = p.dev_b->Listen("");
  REQUIRE(listener.ok());
  auto accepted = std::async(std::launch::async,
                             [&] { return (*listener)->Accept(p.cq_b.get(), absl::Seconds(10)); });
  auto conn = p.dev_a->Connect((*listener)->address(), p.cq_a.get());
  REQUIRE(conn.ok());
  auto server = accepted.get();
  REQUIRE(server.ok());
  p.a = *std::move(conn);
  p.b = *std::move(server);
  return p;
}

// Waits for the next completion of `cq`, failing the test after `timeout`.
inline pt::Completion Next(pt::CompletionQueue& cq, absl::Duration timeout = absl::Seconds(20)) {
  auto c = cq.Wait(timeout);
  INFO("waiting for a completion: " << c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

// Drives both queues (needed in caller-progress mode, where nobody else moves bytes) until
// `want_a` and `want_b` completions arrived.
inline void Collect(Pair& p, size_t want_a, size_t want_b, std::vector<pt::Completion>* got_a,
                    std::vector<pt::Completion>* got_b,
                    absl::Duration timeout = absl::Seconds(60)) {
  const absl::Time deadline = absl::Now() + timeout;
  pt::Completion buf[16];
  while (got_a->size() < want_a || got_b->size() < want_b) {
    REQUIRE(absl::Now() < deadline);
    size_t n = p.cq_a->Poll(absl::MakeSpan(buf));
    for (size_t i = 0; i < n; ++i) got_a->push_back(buf[i]);
    n = p.cq_b->Poll(absl::MakeSpan(buf));
    for (size_t i = 0; i < n; ++i) got_b->push_back(buf[i]);
    if (n == 0) std::this_thread::yield();
  }
}

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

}  // namespace plexus::transport::conformance
