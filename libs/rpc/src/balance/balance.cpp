// Replica selection policies (see plexus/rpc/balance.hpp and docs/rpc_balance.md).
#include "plexus/rpc/balance.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace plexus::rpc {

std::optional<uint32_t> GossipTrigger::Observe(uint32_t outstanding) {
  if (outstanding < floor_) {
    // One last announcement when the count has halved below the floor, so peers stop seeing the
    // old high count. Waiting for the halving (not the first step under the floor) keeps a count
    // that wobbles around the floor (4, 3, 4, 3) from gossiping at every step.
    if (!announced_ || 2ull * outstanding > level_) return std::nullopt;
    announced_ = false;
    level_ = 0;
    return outstanding;
  }
  // Up: twice the last power of two; down: half of it (2x <= level, exact in integers).
  const bool cross = !announced_ || (level_ == 0 && outstanding > 0) ||
                     (level_ > 0 && (outstanding / 2 >= level_ || 2ull * outstanding <= level_));
  if (!cross) return std::nullopt;
  announced_ = true;
  level_ = outstanding == 0 ? 0 : std::bit_floor(outstanding);
  return outstanding;
}

std::string_view BalancePolicyName(BalancePolicy policy) {
  switch (policy) {
    case BalancePolicy::kRoundRobin:
      return "round_robin";
    case BalancePolicy::kRandom:
      return "random";
    case BalancePolicy::kPowerOfTwo:
      return "po2";
    case BalancePolicy::kDaronpon:
      return "daronpon";
  }
  return "?";
}

absl::StatusOr<BalancePolicy> ParseBalancePolicy(std::string_view name) {
  for (BalancePolicy p : {BalancePolicy::kRoundRobin, BalancePolicy::kRandom,
                          BalancePolicy::kPowerOfTwo, BalancePolicy::kDaronpon}) {
    if (name == BalancePolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown balancing policy '", std::string(name),
                   "'; expected round_robin, random, po2 or daronpon"));
}

namespace {

class RoundRobin final : public Balancer {
 public:
  explicit RoundRobin(const BalancerOptions& config) : Balancer(config) {}
  BalanceChoice Pick(const BalanceCall&) override {
    const ReplicaId r = next_;
    next_ = (next_ + 1) % size();
    return {r, false};
  }

 private:
  ReplicaId next_ = 0;
};

class Random final : public Balancer {
 public:
  explicit Random(const BalancerOptions& config) : Balancer(config) {}
  BalanceChoice Pick(const BalanceCall&) override { return {UniformBelow(size()), false}; }
};

// Two distinct replicas at random, the one with the lower Load() (the first on a tie).
class PowerOfTwo final : public Balancer {
 public:
  explicit PowerOfTwo(const BalancerOptions& config) : Balancer(config) {}
  BalanceChoice Pick(const BalanceCall&) override {
    const uint32_t n = size();
    const ReplicaId a = UniformBelow(n);
    if (n == 1) return {a, false};
    ReplicaId b = UniformBelow(n - 1);
    if (b >= a) ++b;
    return {Load(b) < Load(a) ? b : a, false};
  }
};

class Daronpon final : public Balancer {
 public:
  explicit Daronpon(const BalancerOptions& config) : Balancer(config) {}

  BalanceChoice Pick(const BalanceCall& call) override {
    const bool has_target = call.target.has_value() && *call.target < size();
    if (has_target && call.hops >= config().max_hops) return {*call.target, false};
    ReplicaId candidate;
    if (has_target) {
      candidate = *call.target;
    } else {
      // No target: the least loaded local replica, or with none, the least loaded of all.
      const bool any_local = !config().local.empty();
      candidate = ArgMin(std::nullopt, any_local);
    }
    if (size() == 1) return {candidate, false};
    const ReplicaId best = ArgMin(candidate, false);
    if (Wait(best, config().delta) >= Wait(candidate, 0)) return {candidate, false};
    const bool redirected = !is_local(best);
    if (redirected && config().count_redirects) CountRedirect(best);
    return {best, redirected};
  }

 private:
  // What a new call would wait at `replica` with `extra` more calls ahead of it: its load (plus
  // the call) in calls, or in time with per-replica costs.
  double Wait(ReplicaId replica, uint32_t extra) const {
    const double calls = static_cast<double>(Load(replica)) + extra + 1;
    return config().cost.empty() ? calls : calls * config().cost[replica];
  }

  // The replica with the lowest Wait(), ties broken at random; `skip` is excluded, `local_only`
  // restricts the search to local replicas.
  ReplicaId ArgMin(std::optional<ReplicaId> skip, bool local_only) {
    ReplicaId best = 0;
    double best_load = std::numeric_limits<double>::infinity();
    uint32_t ties = 0;
    for (ReplicaId r = 0; r < size(); ++r) {
      if ((skip && *skip == r) || (local_only && !is_local(r))) continue;
      const double load = Wait(r, 0);
      if (ties == 0 || load < best_load) {
        best = r;
        best_load = load;
        ties = 1;
      } else if (load == best_load && UniformBelow(++ties) == 0) {
        best = r;
      }
    }
    return best;
  }
};

}  // namespace

Balancer::Balancer(const BalancerOptions& config)
    : config_(config), replicas_(config.replicas), rng_(config.seed) {
  for (Replica& r : replicas_) r.trigger = GossipTrigger(config.gossip_floor);
  for (ReplicaId id : config.local) replicas_[id].local = true;
}

absl::StatusOr<std::unique_ptr<Balancer>> Balancer::Create(const BalancerOptions& config) {
  if (config.replicas == 0) {
    return absl::InvalidArgumentError("balancer: a service needs at least one replica, got 0");
  }
  std::vector<bool> seen(config.replicas);
  for (ReplicaId id : config.local) {
    if (id >= config.replicas) {
      return absl::InvalidArgumentError(absl::StrCat(
          "balancer: local replica ", id, " is out of range (", config.replicas, " replicas)"));
    }
    if (seen[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("balancer: local replica ", id, " is listed twice"));
    }
    seen[id] = true;
  }
  if (!config.cost.empty() && config.cost.size() != config.replicas) {
    return absl::InvalidArgumentError(absl::StrCat("balancer: cost has ", config.cost.size(),
                                                   " entries for ", config.replicas, " replicas"));
  }
  for (size_t r = 0; r < config.cost.size(); ++r) {
    if (!(config.cost[r] > 0) || !std::isfinite(config.cost[r])) {
      return absl::InvalidArgumentError(
          absl::StrCat("balancer: cost[", r, "] is ", config.cost[r], "; it must be > 0"));
    }
  }
  if (config.max_hops > 1) {
    // More than one hop lets calls ping-pong between dispatchers on stale estimates.
    return absl::InvalidArgumentError(
        absl::StrCat("balancer: max_hops is at most 1 (one redirect), got ", config.max_hops));
  }
  switch (config.policy) {
    case BalancePolicy::kRoundRobin:
      return std::unique_ptr<Balancer>(new RoundRobin(config));
    case BalancePolicy::kRandom:
      return std::unique_ptr<Balancer>(new Random(config));
    case BalancePolicy::kPowerOfTwo:
      return std::unique_ptr<Balancer>(new PowerOfTwo(config));
    case BalancePolicy::kDaronpon:
      return std::unique_ptr<Balancer>(new Daronpon(config));
  }
  return absl::InvalidArgumentError("balancer: unknown policy");
}

std::optional<LoadReport> Balancer::Announce(ReplicaId replica) {
  Replica& r = replicas_[replica];
  if (!r.local || !config_.log_gossip) return std::nullopt;
  std::optional<uint32_t> count = r.trigger.Observe(r.outstanding);
  if (!count) return std::nullopt;
  return LoadReport{replica, *count};
}

absl::StatusOr<std::optional<LoadReport>> Balancer::OnSend(ReplicaId replica) {
  if (replica >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("balancer: send to unknown replica ", replica, " (", size(), " replicas)"));
  }
  Replica& r = replicas_[replica];
  if (r.outstanding == std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("balancer: replica ", replica, " has 2^32-1 calls in flight"));
  }
  ++r.outstanding;
  return Announce(replica);
}

absl::StatusOr<std::optional<LoadReport>> Balancer::OnResponse(
    ReplicaId replica, std::optional<uint32_t> piggybacked) {
  if (replica >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("balancer: response from unknown replica ",
                                                   replica, " (", size(), " replicas)"));
  }
  Replica& r = replicas_[replica];
  if (r.outstanding == 0) {
    return absl::FailedPreconditionError(absl::StrCat("balancer: response from replica ", replica,
                                                      " with no call in flight (duplicate?)"));
  }
  --r.outstanding;
  if (piggybacked && !r.local) r.estimate = *piggybacked;
  return Announce(replica);
}

absl::Status Balancer::OnGossip(const LoadReport& report) {
  if (report.replica >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("balancer: load report for unknown replica ",
                                                   report.replica, " (", size(), " replicas)"));
  }
  Replica& r = replicas_[report.replica];
  if (!r.local) r.estimate = report.outstanding;
  return absl::OkStatus();
}

std::vector<LoadReport> Balancer::LocalLoads() const {
  std::vector<LoadReport> loads;
  for (ReplicaId id : config_.local) loads.push_back({id, replicas_[id].outstanding});
  return loads;
}

uint32_t Balancer::Load(ReplicaId replica) const {
  const Replica& r = replicas_[replica];
  return r.local ? r.outstanding : std::max(r.estimate, r.outstanding);
}

uint64_t Balancer::NextRandom() {
  // splitmix64: the same sequence on every platform (std distributions are not portable).
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t Balancer::UniformBelow(uint32_t n) {
  // Multiply-shift on the top 32 bits (bias under n / 2^32, nil for powers of two).
  return static_cast<uint32_t>(((NextRandom() >> 32) * n) >> 32);
}

}  // namespace plexus::rpc
