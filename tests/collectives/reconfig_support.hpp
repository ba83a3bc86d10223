// What the live-reconfiguration tests share (reconfig_test.cpp, reconfig_transport_test.cpp,
// reconfig_channels_test.cpp):
// communicator options, order-sensitive operands and the watchers' delay hook.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
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

// Rank 1 never starts the landing collective (it sleeps 2.5 s); rank 0's must fail within the
// communicator's connect_timeout and break it. Returns rank 0's error ("" on rank 1, or what went
// wrong) and sets failed_after_s[rank] to the seconds rank 0's collective took.
inline std::string LandWithSilentRankOne(int rank, pc::Communicator& comm,
                                         std::vector<double>& failed_after_s) {
  using pc::DataType;
  using pc::ReduceOp;
  if (rank == 1) {  // silent: never starts the landing collective while rank 0 waits
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    return "";
  }
  std::vector<float> in = Operand(rank, 0), out(kCount);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum);
  failed_after_s[rank] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) return std::string("the landing collective succeeded without rank 1");
  if (comm.health().ok()) return std::string("the communicator is not broken");
  return std::string(s.message());
}

// Rank 0 sends one message before the landing collective and rank 1 would receive it after: a
// point-to-point exchange straddling a change of connections. Returns the landing collective's
// error (or what went wrong); check it with CheckSendAcrossLandingRefused.
inline std::string SendAcrossLanding(int rank, pc::Communicator& comm) {
  using pc::DataType;
  using pc::ReduceOp;
  int32_t token = 7;
  if (rank == 0) {
    if (absl::Status s = comm.Send(&token, 1, DataType::kI32, 1); !s.ok()) {
      return "send: " + std::string(s.message());
    }
  }
  std::vector<float> in = Operand(rank, 0), out(kCount);
  absl::Status s = comm.AllReduce(in.data(), out.data(), kCount, DataType::kF32, ReduceOp::kSum);
  if (s.ok()) return std::string("the landing collective succeeded");
  return std::string(s.message());
}

// Both ranks refused the landing collective, naming the unmatched message.
inline void CheckSendAcrossLandingRefused(const std::vector<std::string>& results) {
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r].find("rank 0 had sent 1 point-to-point message(s) to rank 1, which had "
                          "received 0") != std::string::npos);
  }
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
