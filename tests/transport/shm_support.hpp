// Helpers shared by the shm backend's tests: deterministic content, device options, the
// cross-memory switch and a connected device pair in this process.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::transport::shm_test {

namespace pt = plexus::transport;

// Deterministic content: a message's bytes depend on its seed.
inline void Fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<uint8_t>(x >> 56);
  }
}

inline bool Matches(const uint8_t* p, size_t n, uint64_t seed) {
  std::vector<uint8_t> expect(n);
  Fill(expect.data(), n, seed);
  return n == 0 || std::memcmp(p, expect.data(), n) == 0;
}

inline pt::DeviceOptions Options(pt::ProgressMode mode,
                                 absl::Duration op_timeout = absl::Seconds(10)) {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kShm;
  o.progress = mode;
  o.op_timeout = op_timeout;
  o.connect_timeout = absl::Seconds(10);
  o.shm.ring_bytes = size_t{1} << 20;  // smaller than the big messages: they must stream
  o.max_message_bytes = size_t{1} << 30;
  return o;
}

inline std::shared_ptr<pt::Device> MakeDevice(const pt::DeviceOptions& o) {
  auto d = pt::Device::Create(o);
  if (!d.ok()) {
    std::fprintf(stderr, "Device::Create: %s\n", std::string(d.status().message()).c_str());
    std::abort();
  }
  return *d;
}

// Sets the cross-memory switch for every device created afterwards (children inherit it).
inline void SetCma(bool on, const char* threshold = nullptr) {
  ::setenv("PLEXUS_SHM_CMA", on ? "1" : "0", 1);
  if (threshold != nullptr) {
    ::setenv("PLEXUS_SHM_CMA_THRESHOLD", threshold, 1);
  } else {
    ::unsetenv("PLEXUS_SHM_CMA_THRESHOLD");
  }
}

// One device pair in this process: a listener's connection and a connector's.
struct LocalPair {
  std::shared_ptr<pt::Device> a, b;
  std::unique_ptr<pt::CompletionQueue> cqa, cqb;
  std::unique_ptr<pt::Connection> ca, cb;
};

inline LocalPair MakeLocalPair(const pt::DeviceOptions& options) {
  LocalPair p;
  p.a = MakeDevice(options);
  p.b = MakeDevice(options);
  p.cqa = p.a->CreateCompletionQueue();
  p.cqb = p.b->CreateCompletionQueue();
  auto listener = p.a->Listen("");
  REQUIRE(listener.ok());
  std::thread t([&] {
    auto c = p.b->Connect((*listener)->address(), p.cqb.get());
    if (c.ok()) p.cb = std::move(*c);
  });
  auto c = (*listener)->Accept(p.cqa.get(), absl::Seconds(10));
  t.join();
  REQUIRE(c.ok());
  REQUIRE(p.cb != nullptr);
  p.ca = std::move(*c);
  return p;
}

inline LocalPair MakeLocalPair(pt::ProgressMode mode = pt::ProgressMode::kThread) {
  return MakeLocalPair(Options(mode));
}

}  // namespace plexus::transport::shm_test
