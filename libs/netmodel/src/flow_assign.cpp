#include "plexus/netmodel/flow_assign.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace plexus::netmodel {

std::string_view FlowAssignPolicyName(FlowAssignPolicy policy) {
  switch (policy) {
    case FlowAssignPolicy::kEcmp:
      return "ecmp";
    case FlowAssignPolicy::kFfa:
      return "ffa";
    case FlowAssignPolicy::kPfa:
      return "pfa";
  }
  return "?";
}

absl::StatusOr<FlowAssignPolicy> ParseFlowAssignPolicy(std::string_view name) {
  if (name == "ecmp") return FlowAssignPolicy::kEcmp;
  if (name == "ffa") return FlowAssignPolicy::kFfa;
  if (name == "pfa") return FlowAssignPolicy::kPfa;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown flow assignment '", std::string(name), "' (ecmp, ffa or pfa)"));
}

uint64_t EcmpHash(uint64_t key, uint64_t seed) {
  uint64_t z = key ^ seed;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::StatusOr<std::vector<int>> AssignFlows(const std::vector<Flow>& flows,
                                             std::span<const double> capacity,
                                             const FlowAssignOptions& options) {
  for (size_t l = 0; l < capacity.size(); ++l) {
    if (!(capacity[l] > 0) || !std::isfinite(capacity[l])) {
      return absl::InvalidArgumentError(
          absl::StrCat("flow assignment: link ", l, " has capacity ", capacity[l], " (> 0)"));
    }
  }
  for (size_t f = 0; f < flows.size(); ++f) {
    const Flow& flow = flows[f];
    if (flow.routes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flow ", f, " (job ", flow.job, ") has no route to choose from"));
    }
    if (!(flow.demand > 0) || !std::isfinite(flow.demand)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flow ", f, " (job ", flow.job, ") has demand ", flow.demand, " (> 0)"));
    }
    for (size_t r = 0; r < flow.routes.size(); ++r) {
      for (int l : flow.routes[r]) {
        if (l < 0 || static_cast<size_t>(l) >= capacity.size()) {
          return absl::InvalidArgumentError(absl::StrCat("flow ", f, " (job ", flow.job,
                                                         "), route ", r, ": link ", l,
                                                         " is not in [0, ", capacity.size(), ")"));
        }
      }
    }
  }
  std::vector<int> route(flows.size(), 0);
  if (options.policy == FlowAssignPolicy::kEcmp) {
    for (size_t f = 0; f < flows.size(); ++f) {
      route[f] =
          static_cast<int>(EcmpHash(flows[f].key, options.ecmp_seed) % flows[f].routes.size());
    }
    return route;
  }

  // Round-robin across jobs: the k-th flow of every job (jobs by first appearance) before any
  // job's (k+1)-th.
  std::vector<int> jobs;
  std::vector<std::vector<int>> of_job;
  for (size_t f = 0; f < flows.size(); ++f) {
    auto it = std::find(jobs.begin(), jobs.end(), flows[f].job);
    size_t j = static_cast<size_t>(it - jobs.begin());
    if (it == jobs.end()) {
      jobs.push_back(flows[f].job);
      of_job.emplace_back();
    }
    of_job[j].push_back(static_cast<int>(f));
  }
  std::vector<int> order;
  for (size_t k = 0;; ++k) {
    bool any = false;
    for (const auto& list : of_job) {
      if (k < list.size()) {
        order.push_back(list[k]);
        any = true;
      }
    }
    if (!any) break;
  }

  std::vector<double> load(capacity.size(), 0);
  absl::flat_hash_map<uint64_t, int> job_flows;  // (job, link) -> the job's flows on the link
  auto job_key = [](int job, int link) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(job)) << 32) | static_cast<uint32_t>(link);
  };
  std::vector<char> reserved;
  for (int r : options.reserved_routes) {
    if (r < 0) return absl::InvalidArgumentError(absl::StrCat("reserved route ", r, " < 0"));
    if (static_cast<size_t>(r) >= reserved.size()) reserved.resize(r + 1, 0);
    reserved[r] = 1;
  }
  auto is_reserved = [&](size_t r) { return r < reserved.size() && reserved[r]; };
  auto place = [&](int f, bool avoid_reserved) {
    const Flow& flow = flows[f];
    bool any_free = false;
    if (avoid_reserved) {
      for (size_t r = 0; r < flow.routes.size(); ++r) any_free |= !is_reserved(r);
    }
    // Links on every route (the NICs) weigh the same whichever is chosen: compare the others.
    absl::flat_hash_map<int, size_t> on_routes;
    for (const auto& links : flow.routes) {
      for (int l : links) ++on_routes[l];
    }
    int best = -1;
    double best_excess = std::numeric_limits<double>::infinity();
    int best_own = std::numeric_limits<int>::max();
    for (size_t r = 0; r < flow.routes.size(); ++r) {
      if (avoid_reserved && any_free && is_reserved(r)) continue;
      double excess = -std::numeric_limits<double>::infinity();
      int own = 0;
      for (int l : flow.routes[r]) {
        if (flow.routes.size() > 1 && on_routes[l] == flow.routes.size()) continue;
        excess = std::max(excess, load[l] + flow.demand - capacity[l]);
        auto it = job_flows.find(job_key(flow.job, l));
        if (it != job_flows.end()) own = std::max(own, it->second);
      }
      if (excess < best_excess || (excess == best_excess && own < best_own)) {
        best_excess = excess;
        best_own = own;
        best = static_cast<int>(r);
      }
    }
    route[f] = best;
    for (int l : flow.routes[best]) {
      load[l] += flow.demand;
      ++job_flows[job_key(flow.job, l)];
    }
  };
  if (options.policy == FlowAssignPolicy::kFfa) {
    for (int f : order) place(f, false);
  } else {
    for (int f : order) {
      if (!flows[f].high_priority) place(f, true);
    }
    for (int f : order) {
      if (flows[f].high_priority) place(f, false);
    }
  }
  return route;
}

std::vector<int> LocalityRingOrder(std::span<const Locality> members, int channel) {
  std::vector<int> order(members.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::tie(members[a].pod, members[a].rack, members[a].host) <
           std::tie(members[b].pod, members[b].rack, members[b].host);
  });
  if (channel == 0) return order;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    auto same = [&](size_t i) {
      const Locality& x = members[order[begin]];
      const Locality& y = members[order[i]];
      return x.pod == y.pod && x.rack == y.rack && x.host == y.host;
    };
    while (end < order.size() && same(end)) ++end;
    const size_t len = end - begin;
    const size_t shift = static_cast<size_t>(
        ((channel % static_cast<int>(len)) + static_cast<int>(len)) % static_cast<int>(len));
    std::rotate(order.begin() + begin, order.begin() + begin + shift, order.begin() + end);
    begin = end;
  }
  return order;
}

}  // namespace plexus::netmodel
