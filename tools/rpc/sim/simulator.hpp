// A discrete-event simulator of replica selection across racks (Daronpon, seed 003 ch. 2): a
// leaf-spine network with a per-hop latency, one dispatcher per ToR, k-core FCFS servers, open-loop
// Poisson clients. The ToR dispatchers and the client-side baselines run plexus::rpc::Balancer,
// the library's own policy code; only the oracle JSQ is simulator code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::rpc::sim {

enum class Service { kConstant, kExponential, kBimodal };
absl::StatusOr<Service> ParseService(const std::string& name);  // constant | exp | bimodal
std::string ServiceName(Service service);

struct SimConfig {
  // random | round_robin | po2 (client side, state from earlier responses) | jsq (oracle) |
  // periodic (ToR dispatchers, Daronpon's redirect rule, all counts gossiped every period) |
  // daronpon (ToR dispatchers, logarithmic gossip and piggyback).
  std::string policy = "daronpon";
  uint32_t racks = 3;
  uint32_t servers_per_rack = 2;
  uint32_t clients = 6;  // client i sits in rack i % racks
  double hop_us = 5;     // host-ToR and ToR-spine links alike
  Service service = Service::kExponential;
  double mean_us = 25;          // bimodal: 90% at 0.52x, 10% at 5.2x (13 and 130 us for 25)
  std::vector<uint32_t> cores;  // cores per server (rack-major); empty: 1 each
  double load = 0.7;            // offered load as a fraction of the total capacity
  uint64_t requests = 200000;
  double warmup = 0.1;  // fraction of the first requests left out of the latencies
  uint64_t seed = 1;
  uint32_t delta = 1;
  uint32_t gossip_floor = 4;
  double gossip_period_us = 25;     // periodic
  bool piggyback_redirects = true;  // a redirected call carries its first ToR's counts
  bool piggyback_responses = true;  // a response updates the client's ToR on its way back
};

struct SimResult {
  uint64_t measured = 0;  // requests in the latency sample
  double p50_us = 0, p99_us = 0, p999_us = 0, mean_us = 0;
  double throughput_krps = 0;
  uint64_t completed = 0;
  uint64_t redirects = 0;               // calls sent from one ToR to another
  uint64_t gossip_announcements = 0;    // trigger firings (or one per ToR and period)
  uint64_t gossip_messages = 0;         // announcements x other racks
  std::vector<uint64_t> served;         // per server
  std::vector<uint64_t> redirected_to;  // per server
  double redirect_fraction() const { return completed ? double(redirects) / completed : 0; }
  double gossip_fraction() const {
    return completed ? double(gossip_announcements) / completed : 0;
  }
};

// Offered loads the simulator accepts: below the minimum, the clients' Poisson gaps grow so long
// that the simulated clock loses the per-hop latencies and a periodic gossip never ends.
inline constexpr double kMinLoad = 0.01;
inline constexpr double kMaxLoad = 2;
// The most events a periodic-gossip run may schedule for its gossip (rounds x messages).
inline constexpr double kMaxPeriodicEvents = 1e8;

// Errors name the bad field (unknown policy, no servers, load outside [kMinLoad, kMaxLoad],
// a periodic gossip of more than kMaxPeriodicEvents, ...).
absl::StatusOr<SimResult> Simulate(const SimConfig& config);

}  // namespace plexus::rpc::sim
