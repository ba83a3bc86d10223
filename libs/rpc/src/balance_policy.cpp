// LoadBalancePolicy: the balancing engine of a Channel over several replicas, on Balancer.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/policies.hpp"

namespace plexus::rpc {

absl::StatusOr<std::shared_ptr<LoadBalancePolicy>> LoadBalancePolicy::Create(
    std::string name, LoadBalanceOptions options) {
  return std::shared_ptr<LoadBalancePolicy>(new LoadBalancePolicy(std::move(name), options));
}

absl::Status LoadBalancePolicy::Rebuild(uint32_t n, const std::vector<uint32_t>& outstanding,
                                        const std::vector<uint32_t>& load) {
  BalancerOptions config;
  config.policy = options_.policy;
  config.replicas = n;
  config.seed = options_.seed;
  config.delta = options_.delta;
  // The channel has no replica whose every call it sees: all are remote, and their load is the
  // larger of the server's report and this channel's own calls in flight (exact).
  PLEXUS_ASSIGN_OR_RETURN(auto next, Balancer::Create(config));
  for (uint32_t r = 0; r < n; ++r) {
    if (r < load.size()) PLEXUS_RETURN_IF_ERROR(next->OnGossip({r, load[r]}));
    for (uint32_t k = 0; r < outstanding.size() && k < outstanding[r]; ++k) {
      PLEXUS_RETURN_IF_ERROR(next->OnSend(r).status());
    }
  }
  balancer_ = std::move(next);
  picks_.resize(n);
  reported_.assign(n, load.empty() ? absl::InfinitePast() : absl::Now());
  return absl::OkStatus();
}

absl::Status LoadBalancePolicy::EnsureLocked(uint32_t n) {
  if (balancer_ != nullptr && balancer_->size() == n) return absl::OkStatus();
  std::vector<uint32_t> outstanding, load;
  std::vector<absl::Time> reported = reported_;
  if (balancer_ != nullptr) {
    for (ReplicaId r = 0; r < balancer_->size() && r < n; ++r) {
      outstanding.push_back(balancer_->outstanding(r));
      load.push_back(balancer_->Load(r));
    }
  }
  PLEXUS_RETURN_IF_ERROR(Rebuild(n, outstanding, load));
  for (ReplicaId r = 0; r < n; ++r) {
    reported_[r] = r < reported.size() ? reported[r] : absl::InfinitePast();
  }
  return absl::OkStatus();
}

void LoadBalancePolicy::Reported(uint32_t replica) {
  if (replica < reported_.size()) reported_[replica] = absl::Now();
}

void LoadBalancePolicy::ExpireLocked() const {
  if (balancer_ == nullptr) return;
  const absl::Time now = absl::Now();
  for (ReplicaId r = 0; r < reported_.size(); ++r) {
    if (reported_[r] != absl::InfinitePast() && now - reported_[r] > options_.estimate_ttl) {
      (void)balancer_->OnGossip({r, 0});
      reported_[r] = absl::InfinitePast();
    }
  }
}

std::optional<uint32_t> LoadBalancePolicy::Route(const CallInfo& call,
                                                 const std::vector<bool>& usable) {
  (void)call;
  const uint32_t n = static_cast<uint32_t>(usable.size());
  if (n == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!EnsureLocked(n).ok()) return std::nullopt;
  ExpireLocked();
  BalanceCall bc;
  if (options_.policy == BalancePolicy::kDaronpon) {
    // The call's target: the next replica in turn (the seed's clients pick at random; turns make
    // the target sequence even and tests exact). Pick redirects it at most once.
    bc.target = next_target_;
    next_target_ = (next_target_ + 1) % n;
  }
  BalanceChoice choice = balancer_->Pick(bc);
  ReplicaId r = choice.replica;
  if (!usable[r]) {
    // Never a disconnected replica while another is connected: the least loaded connected one.
    std::optional<ReplicaId> best;
    for (ReplicaId k = 0; k < n; ++k) {
      if (usable[k] && (!best || balancer_->Load(k) < balancer_->Load(*best))) best = k;
    }
    if (best) r = *best;
  } else if (bc.target && r != *bc.target) {
    ++redirects_;
  }
  (void)balancer_->OnSend(r);  // no local replica: never announces
  ++picks_[r];
  return r;
}

void LoadBalancePolicy::OnComplete(const CallInfo& call, const absl::Status& status) {
  (void)status;
  if (call.route_engine != name_) return;  // another engine (or the channel) routed it
  std::lock_guard<std::mutex> lock(mu_);
  if (balancer_ == nullptr || call.replica >= balancer_->size()) return;
  (void)balancer_->OnResponse(call.replica, call.replica_load);
  if (call.replica_load) Reported(call.replica);
}

void LoadBalancePolicy::OnLoadReport(uint32_t replica, uint32_t load) {
  std::lock_guard<std::mutex> lock(mu_);
  // A report may come before the first call: the balancer then grows to cover the replica.
  if (replica >= 4096 || !EnsureLocked(std::max(replica + 1, Size())).ok()) return;
  if (balancer_->OnGossip({replica, load}).ok()) Reported(replica);
}

LoadBalancePolicy::Stats LoadBalancePolicy::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked();
  Stats s;
  s.picks = picks_;
  s.redirects = redirects_;
  if (balancer_ != nullptr) {
    for (ReplicaId r = 0; r < balancer_->size(); ++r) {
      s.outstanding.push_back(balancer_->outstanding(r));
      s.load.push_back(balancer_->Load(r));
    }
  }
  return s;
}

LoadBalanceOptions LoadBalancePolicy::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

std::string LoadBalancePolicy::DescribeJson() const {
  Stats s = stats();
  LoadBalanceOptions o = options();
  auto list = [](const auto& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? "," : "", v[i]);
    return out + "]";
  };
  return absl::StrCat("{\"policy\":\"", std::string(BalancePolicyName(o.policy)),
                      "\",\"delta\":", o.delta, ",\"seed\":", o.seed,
                      ",\"estimate_ttl_ms\":", absl::ToDoubleMilliseconds(o.estimate_ttl),
                      ",\"picks\":", list(s.picks), ",\"outstanding\":", list(s.outstanding),
                      ",\"load\":", list(s.load), ",\"redirects\":", s.redirects, "}");
}

absl::Status LoadBalancePolicy::Configure(std::string_view json_config) {
  namespace bj = base::json;
  const std::string where = absl::StrCat("balance '", name_, "' configuration");
  bj::Json j = bj::Json::parse(json_config.begin(), json_config.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object such as {\"policy\": \"po2\"}"));
  }
  PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"policy", "delta", "seed", "estimate_ttl_ms"}));
  LoadBalanceOptions next = options();
  if (j.contains("policy")) {
    PLEXUS_ASSIGN_OR_RETURN(std::string name, bj::StringField(j, where, "policy", true));
    PLEXUS_ASSIGN_OR_RETURN(next.policy, ParseBalancePolicy(name));
  }
  if (j.contains("delta")) {
    PLEXUS_ASSIGN_OR_RETURN(double d, bj::NumberField(j, where, "delta", true));
    if (!(d >= 0) || d > 1e6 || d != static_cast<uint32_t>(d)) {
      return bj::Invalid(bj::Child(where, "delta"), "expected an integer in [0, 1000000]");
    }
    next.delta = static_cast<uint32_t>(d);
  }
  if (j.contains("seed")) {
    PLEXUS_ASSIGN_OR_RETURN(double d, bj::NumberField(j, where, "seed", true));
    if (!(d >= 0) || d > 9e15) return bj::Invalid(bj::Child(where, "seed"), "expected >= 0");
    next.seed = static_cast<uint64_t>(d);
  }
  if (j.contains("estimate_ttl_ms")) {
    PLEXUS_ASSIGN_OR_RETURN(double d, bj::NumberField(j, where, "estimate_ttl_ms", true));
    if (!(d >= 0)) return bj::Invalid(bj::Child(where, "estimate_ttl_ms"), "expected >= 0");
    next.estimate_ttl = std::isinf(d) ? absl::InfiniteDuration() : absl::Milliseconds(d);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const LoadBalanceOptions old = options_;
  options_ = next;
  if (balancer_ != nullptr) {
    std::vector<uint32_t> outstanding, load;
    for (ReplicaId r = 0; r < balancer_->size(); ++r) {
      outstanding.push_back(balancer_->outstanding(r));
      load.push_back(balancer_->Load(r));
    }
    if (absl::Status st = Rebuild(balancer_->size(), outstanding, load); !st.ok()) {
      options_ = old;
      return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineState> LoadBalancePolicy::Decompose() const {
  EngineState state(kind(), version());
  Stats s = stats();
  state.Put("outstanding", s.outstanding);
  state.Put("load", s.load);
  state.Put("picks", s.picks);
  state.Put("redirects", s.redirects);
  return state;
}

absl::Status LoadBalancePolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  PLEXUS_ASSIGN_OR_RETURN(auto outstanding, state.Get<std::vector<uint32_t>>("outstanding"));
  PLEXUS_ASSIGN_OR_RETURN(auto load, state.Get<std::vector<uint32_t>>("load"));
  PLEXUS_ASSIGN_OR_RETURN(auto picks, state.Get<std::vector<uint64_t>>("picks"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t redirects, state.Get<uint64_t>("redirects"));
  std::lock_guard<std::mutex> lock(mu_);
  if (!outstanding.empty()) {
    PLEXUS_RETURN_IF_ERROR(Rebuild(static_cast<uint32_t>(outstanding.size()), outstanding, load));
    picks_ = std::move(picks);
    picks_.resize(outstanding.size());
  }
  redirects_ = redirects;
  return absl::OkStatus();
}

}  // namespace plexus::rpc
