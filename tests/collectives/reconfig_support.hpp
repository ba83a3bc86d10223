// What the live-reconfiguration tests share (reconfig_test.cpp, reconfig_transport_test.cpp):
// communicator options, order-sensitive operands and the watchers' delay hook.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "reconfig.hpp"

namespace plexus::collectives::reconfigtest {

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace pi = plexus::collectives::internal;

// 24 KiB of f32: above the 16 KiB latency path, so the ring runs (and its reduction order
// follows the ring order).
inline constexpr size_t kCount = 6144;

inline pc::CommunicatorOptions Options(pt::Backend backend) {
  pc::CommunicatorOptions o;
  o.device.backend = backend;
  o.timeout = absl::Seconds(20);
  o.chunk_bytes = 2048;  // several chunks per ring step
  o.channels = 2;
  o.algorithms = pc::AlgorithmOverrides::Parse("allreduce:ring").value();
  return o;
}

// Operands whose f32 sum depends on the order they are added in (magnitudes spread over 2^20).
inline std::vector<float> Operand(int rank, int call) {
  std::vector<float> v(kCount);
  uint64_t x = 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(rank) * 1000003 + call + 1);
  for (size_t e = 0; e < kCount; ++e) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float mantissa = 1.0f + static_cast<float>(x % 1000003) / 1000003.0f;
    v[e] = std::ldexp(mantissa, static_cast<int>((x >> 20) % 21) - 10) * ((x >> 40) & 1 ? -1 : 1);
  }
  return v;
}

// Installs the watchers' delays for one test case, and removes them after.
struct HookGuard {
  explicit HookGuard(std::map<std::pair<int, pi::ReconfigStep>, int> delays_ms) {
    pi::SetReconfigTestHook([delays_ms](int rank, uint64_t, pi::ReconfigStep step) {
      auto it = delays_ms.find({rank, step});
      if (it != delays_ms.end()) std::this_thread::sleep_for(std::chrono::milliseconds(it->second));
    });
  }
  ~HookGuard() { pi::SetReconfigTestHook(nullptr); }
};

}  // namespace plexus::collectives::reconfigtest
