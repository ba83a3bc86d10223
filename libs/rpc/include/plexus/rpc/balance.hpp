// Replica selection across the replicas of one service: round robin, random, power-of-two
// choices and Daronpon (sub-RTT replica selection with logarithmic gossip, seed 003 ch. 2).
// Pure logic with no transport and no clock: the RPC runtime and the simulator
// (tools/rpc/sim) run this same code. Not thread-safe: one balancer per dispatcher thread.
//
// A balancer sees replicas 0..n-1. A *local* replica is one whose every call passes through this
// balancer (the replicas under a ToR in the seed, the server's own replica in the RPC runtime):
// its outstanding count is exact. Other replicas are *remote*: their load is an estimate from
// counters piggybacked on responses and redirected calls and from gossip. See docs/rpc_balance.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::rpc {

using ReplicaId = uint32_t;

// Outstanding calls of one replica, as gossiped or piggybacked.
struct LoadReport {
  ReplicaId replica = 0;
  uint32_t outstanding = 0;
  bool operator==(const LoadReport&) const = default;
};

// Logarithmic gossip (seed §2.3.3): fed the outstanding count of one local replica after every
// change, says when to announce it. The first count at or above `floor` is announced; then a
// count is announced when it reaches twice, or falls to half, the power of two last announced
// (1 -> 8 announces at 2, 4, 8; 8 -> 17 at 16). Below `floor` it is silent, except for one final
// "below threshold" announcement when an announced count drops under `floor` and to half the last
// level or less (a sharp drop), so that peers do not keep a stale high estimate. floor 0 and 1
// behave alike except that floor 0 also announces 0.
class GossipTrigger {
 public:
  explicit GossipTrigger(uint32_t floor = 4) : floor_(floor) {}

  // The count to announce now, or nullopt.
  std::optional<uint32_t> Observe(uint32_t outstanding);

  uint32_t floor() const { return floor_; }
  // The power of two last announced (0 when below the floor or never announced).
  uint32_t level() const { return level_; }

 private:
  uint32_t floor_;
  uint32_t level_ = 0;
  bool announced_ = false;
};

// A call to place. `target` is the replica the call is addressed to (the client's pick in the
// seed; nullopt lets the balancer choose freely); `hops` counts redirects already taken.
struct BalanceCall {
  std::optional<ReplicaId> target;
  uint32_t hops = 0;
};

struct BalanceChoice {
  ReplicaId replica = 0;
  // Daronpon only: the call leaves for a remote replica (carry LocalLoads() with it).
  bool redirected = false;
};

enum class BalancePolicy { kRoundRobin, kRandom, kPowerOfTwo, kDaronpon };
std::string_view BalancePolicyName(BalancePolicy policy);
// "round_robin" | "random" | "po2" | "daronpon"; an error lists the accepted names.
absl::StatusOr<BalancePolicy> ParseBalancePolicy(std::string_view name);

struct BalancerOptions {
  BalancePolicy policy = BalancePolicy::kDaronpon;
  uint32_t replicas = 0;         // n >= 1
  std::vector<ReplicaId> local;  // local replicas (exact counts); may be empty
  uint64_t seed = 1;             // RNG seed for random, po2 and Daronpon's tie breaks
  // Daronpon: redirect when a replica's load + delta < the load of the call's target.
  uint32_t delta = 1;
  uint32_t gossip_floor = 4;  // GossipTrigger floor for local replicas
  bool log_gossip = true;     // false: OnSend/OnResponse never announce (periodic gossip)
  uint32_t max_hops = 1;      // a call redirected this many times is admitted where it is
  // After redirecting to a remote replica, count the call in its estimate until the next report,
  // so that a burst is not herded onto one replica (a choice; the seed does not say).
  bool count_redirects = true;
  // Daronpon with replicas of unequal speed: per replica, the time one call takes there (any
  // unit, > 0). Calls then compare expected completion times, (Load + 1) * cost, instead of
  // loads: redirect to b when (Load(b) + delta + 1) * cost[b] < (Load(candidate) + 1) *
  // cost[candidate]. Empty: every replica alike (the seed's rule on loads).
  std::vector<double> cost;
};

class Balancer {
 public:
  // Errors: no replicas, a local replica out of range or listed twice.
  static absl::StatusOr<std::unique_ptr<Balancer>> Create(const BalancerOptions& config);
  virtual ~Balancer() = default;

  // Where `call` goes. A target out of range is treated as no target.
  virtual BalanceChoice Pick(const BalanceCall& call) = 0;

  // A call was sent to `replica` through this balancer; its response will come back through it.
  // Returns a gossip announcement when the replica is local and its count crosses a threshold.
  absl::StatusOr<std::optional<LoadReport>> OnSend(ReplicaId replica);
  // The response of such a call; `piggybacked` is the replica's outstanding count carried by the
  // response (remote replicas: becomes the estimate). Error: unknown replica, or no call in flight.
  absl::StatusOr<std::optional<LoadReport>> OnResponse(ReplicaId replica,
                                                       std::optional<uint32_t> piggybacked);
  // A count from a peer (gossip, or piggybacked on a redirected call or a passing response).
  // Reports about local replicas are ignored (the local count is exact). Error: unknown replica.
  absl::Status OnGossip(const LoadReport& report);

  // The exact counts of the local replicas, to piggyback on a redirected call or a response.
  std::vector<LoadReport> LocalLoads() const;
  // The load Pick uses: exact for local replicas; for remote ones the larger of the last report
  // (plus counted redirects) and the calls this balancer has in flight there.
  uint32_t Load(ReplicaId replica) const;
  uint32_t outstanding(ReplicaId replica) const { return replicas_[replica].outstanding; }
  bool is_local(ReplicaId replica) const { return replicas_[replica].local; }
  uint32_t size() const { return static_cast<uint32_t>(replicas_.size()); }
  const BalancerOptions& config() const { return config_; }

 protected:
  explicit Balancer(const BalancerOptions& config);
  uint64_t NextRandom();
  uint32_t UniformBelow(uint32_t n);
  void CountRedirect(ReplicaId replica) { ++replicas_[replica].estimate; }

 private:
  struct Replica {
    bool local = false;
    uint32_t outstanding = 0;  // calls in flight through this balancer
    uint32_t estimate = 0;     // remote: last report, plus counted redirects
    GossipTrigger trigger;
  };
  std::optional<LoadReport> Announce(ReplicaId replica);

  BalancerOptions config_;
  std::vector<Replica> replicas_;
  uint64_t rng_;
};

}  // namespace plexus::rpc
