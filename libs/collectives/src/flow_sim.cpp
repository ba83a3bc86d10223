#include "plexus/collectives/flow_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus::collectives::sim {
namespace {

bool Positive(double v) { return std::isfinite(v) && v > 0; }
bool NonNegative(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

// Link layout: host h up = 2h, down = 2h + 1; then per rack up/down (racks) or per leaf and
// spine up/down (Clos).
absl::StatusOr<Topology> Topology::Racks(const RackSpec& spec) {
  if (spec.racks < 1 || spec.hosts_per_rack < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rack topology: racks (", spec.racks,
                                                   ") and hosts_per_rack (", spec.hosts_per_rack,
                                                   ") must be >= 1"));
  }
  if (!Positive(spec.host_bytes_per_s) || !(spec.oversubscription >= 1) ||
      !std::isfinite(spec.oversubscription) || !NonNegative(spec.host_latency_s) ||
      !NonNegative(spec.core_latency_s)) {
    return absl::InvalidArgumentError(
        "rack topology: host_bytes_per_s must be > 0, oversubscription >= 1, latencies >= 0");
  }
  Topology t;
  t.racks_ = spec.racks;
  t.hosts_per_rack_ = spec.hosts_per_rack;
  const int hosts = spec.racks * spec.hosts_per_rack;
  for (int h = 0; h < hosts; ++h) {
    t.rack_of_.push_back(h / spec.hosts_per_rack);
    t.links_.push_back(
        {spec.host_bytes_per_s, spec.host_latency_s, false, absl::StrCat("host", h, ".up")});
    t.links_.push_back(
        {spec.host_bytes_per_s, spec.host_latency_s, false, absl::StrCat("host", h, ".down")});
  }
  const double uplink = spec.hosts_per_rack * spec.host_bytes_per_s / spec.oversubscription;
  for (int r = 0; r < spec.racks; ++r) {
    t.links_.push_back({uplink, spec.core_latency_s, true, absl::StrCat("rack", r, ".up")});
    t.links_.push_back({uplink, spec.core_latency_s, true, absl::StrCat("rack", r, ".down")});
  }
  return t;
}

absl::StatusOr<Topology> Topology::Clos(const ClosSpec& spec) {
  if (spec.leaves < 1 || spec.spines < 1 || spec.hosts_per_leaf < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("clos topology: leaves (", spec.leaves, "), spines (", spec.spines,
                     ") and hosts_per_leaf (", spec.hosts_per_leaf, ") must be >= 1"));
  }
  if (!Positive(spec.host_bytes_per_s) || !(spec.oversubscription >= 1) ||
      !std::isfinite(spec.oversubscription) || !NonNegative(spec.host_latency_s) ||
      !NonNegative(spec.spine_latency_s)) {
    return absl::InvalidArgumentError(
        "clos topology: host_bytes_per_s must be > 0, oversubscription >= 1, latencies >= 0");
  }
  Topology t;
  t.racks_ = spec.leaves;
  t.spines_ = spec.spines;
  t.hosts_per_rack_ = spec.hosts_per_leaf;
  const int hosts = spec.leaves * spec.hosts_per_leaf;
  for (int h = 0; h < hosts; ++h) {
    t.rack_of_.push_back(h / spec.hosts_per_leaf);
    t.links_.push_back(
        {spec.host_bytes_per_s, spec.host_latency_s, false, absl::StrCat("host", h, ".up")});
    t.links_.push_back(
        {spec.host_bytes_per_s, spec.host_latency_s, false, absl::StrCat("host", h, ".down")});
  }
  const double per_spine =
      spec.hosts_per_leaf * spec.host_bytes_per_s / spec.oversubscription / spec.spines;
  for (int l = 0; l < spec.leaves; ++l) {
    for (int s = 0; s < spec.spines; ++s) {
      t.links_.push_back(
          {per_spine, spec.spine_latency_s, true, absl::StrCat("leaf", l, "-spine", s, ".up")});
      t.links_.push_back(
          {per_spine, spec.spine_latency_s, true, absl::StrCat("leaf", l, "-spine", s, ".down")});
    }
  }
  return t;
}

std::vector<int> Topology::Route(int src, int dst) const {
  if (src == dst) return {};
  std::vector<int> route{2 * src};
  const int rs = rack_of_[src];
  const int rd = rack_of_[dst];
  const int base = 2 * hosts();
  if (rs != rd) {
    if (spines_ == 0) {
      route.push_back(base + 2 * rs);
      route.push_back(base + 2 * rd + 1);
    } else {
      const int spine = (src + dst) % spines_;
      route.push_back(base + 2 * (rs * spines_ + spine));
      route.push_back(base + 2 * (rd * spines_ + spine) + 1);
    }
  }
  route.push_back(2 * dst + 1);
  return route;
}

double Topology::PathLatency(int src, int dst) const {
  double latency = 0;
  for (int link : Route(src, dst)) latency += links_[link].latency_s;
  return latency;
}

absl::Status Topology::SetHostBandwidth(int host, double up_bytes_per_s, double down_bytes_per_s) {
  if (host < 0 || host >= hosts()) {
    return absl::OutOfRangeError(absl::StrCat("host ", host, " is not in [0, ", hosts(), ")"));
  }
  if (!Positive(up_bytes_per_s) || !Positive(down_bytes_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host ", host, ": bandwidths must be finite and > 0"));
  }
  links_[2 * host].bytes_per_s = up_bytes_per_s;
  links_[2 * host + 1].bytes_per_s = down_bytes_per_s;
  return absl::OkStatus();
}

absl::Status Topology::AddHostLatency(int host, double extra_s) {
  if (host < 0 || host >= hosts()) {
    return absl::OutOfRangeError(absl::StrCat("host ", host, " is not in [0, ", hosts(), ")"));
  }
  if (!NonNegative(extra_s)) {
    return absl::InvalidArgumentError(absl::StrCat("host ", host, ": latency must be >= 0"));
  }
  links_[2 * host].latency_s += extra_s;
  links_[2 * host + 1].latency_s += extra_s;
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const Schedule& schedule, int hosts) {
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    if (t.src < 0 || t.src >= hosts || t.dst < 0 || t.dst >= hosts) {
      return absl::InvalidArgumentError(absl::StrCat(schedule.name, ": transfer ", i, " (", t.src,
                                                     " -> ", t.dst, ") names a host outside [0, ",
                                                     hosts, ")"));
    }
    if (!NonNegative(t.bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(schedule.name, ": transfer ", i, " has bytes ", t.bytes));
    }
    for (int d : t.after) {
      if (d < 0 || static_cast<size_t>(d) >= i) {
        return absl::InvalidArgumentError(absl::StrCat(
            schedule.name, ": transfer ", i, " depends on ", d, ", which is not an earlier one"));
      }
    }
  }
  return absl::OkStatus();
}

Counts Count(const Schedule& schedule, std::span<const int> rack_of) {
  Counts c;
  std::vector<int> depth(schedule.transfers.size(), 0);
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    int d = 0;
    for (int p : t.after) d = std::max(d, depth[p]);
    depth[i] = d + 1;
    c.rounds = std::max(c.rounds, depth[i]);
    c.logical_bytes += t.bytes;
    if (t.src == t.dst) continue;
    c.wire_bytes += t.bytes;
    ++c.transfers;
    if (rack_of[t.src] != rack_of[t.dst]) c.cross_rack_bytes += t.bytes;
  }
  return c;
}

absl::StatusOr<SimResult> Simulate(const Topology& topology, const Schedule& schedule) {
  if (absl::Status s = ValidateSchedule(schedule, topology.hosts()); !s.ok()) return s;
  const auto& transfers = schedule.transfers;
  const size_t n = transfers.size();
  const auto& links = topology.links();
  SimResult result;
  result.finish_s.assign(n, 0);
  result.link_bytes.assign(links.size(), 0);

  std::vector<std::vector<int>> dependents(n);
  std::vector<int> waiting(n, 0);
  std::vector<std::vector<int>> routes(n);
  for (size_t i = 0; i < n; ++i) {
    waiting[i] = static_cast<int>(transfers[i].after.size());
    for (int d : transfers[i].after) dependents[d].push_back(static_cast<int>(i));
    routes[i] = topology.Route(transfers[i].src, transfers[i].dst);
  }
  // (start time, transfer): transfers whose dependencies are done, waiting out their latency.
  using Pending = std::pair<double, int>;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;
  auto release = [&](int i, double now) {
    pending.push({now + topology.PathLatency(transfers[i].src, transfers[i].dst), i});
  };
  for (size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) release(static_cast<int>(i), 0);
  }

  std::vector<int> active;
  std::vector<double> remaining(n, 0);
  std::vector<double> rate(n, 0);
  std::vector<double> capacity(links.size(), 0);
  std::vector<int> unfrozen(links.size(), 0);
  std::vector<std::vector<int>> on_link(links.size());
  std::vector<int> touched;
  std::vector<char> frozen;
  double now = 0;
  size_t done = 0;

  auto finish = [&](int i) {
    result.finish_s[i] = now;
    ++done;
    for (int d : dependents[i]) {
      if (--waiting[d] == 0) release(d, now);
    }
  };

  while (done < n) {
    // Start every transfer whose latency has elapsed; local and empty ones finish at once.
    while (!pending.empty() && pending.top().first <= now) {
      const int i = pending.top().second;
      pending.pop();
      if (routes[i].empty() || transfers[i].bytes == 0) {
        finish(i);
      } else {
        remaining[i] = transfers[i].bytes;
        active.push_back(i);
      }
    }
    if (active.empty()) {
      if (pending.empty()) break;  // cannot happen for a valid DAG
      now = pending.top().first;
      continue;
    }
    ++result.events;
    // Progressive filling: raise every unfrozen flow's rate together; the link that saturates
    // first fixes the rate of its flows (max-min fairness).
    for (int l : touched) {
      on_link[l].clear();
      unfrozen[l] = 0;
    }
    touched.clear();
    frozen.assign(active.size(), 0);
    for (size_t a = 0; a < active.size(); ++a) {
      for (int l : routes[active[a]]) {
        if (on_link[l].empty()) {
          touched.push_back(l);
          capacity[l] = links[l].bytes_per_s;
        }
        on_link[l].push_back(static_cast<int>(a));
        ++unfrozen[l];
      }
    }
    size_t left = active.size();
    while (left > 0) {
      int best = -1;
      double share = std::numeric_limits<double>::infinity();
      for (int l : touched) {
        if (unfrozen[l] == 0) continue;
        const double s = std::max(0.0, capacity[l]) / unfrozen[l];
        if (s < share) {
          share = s;
          best = l;
        }
      }
      for (int a : on_link[best]) {
        if (frozen[a]) continue;
        frozen[a] = 1;
        --left;
        rate[active[a]] = share;
        for (int l : routes[active[a]]) {
          capacity[l] -= share;
          --unfrozen[l];
        }
      }
    }
    // Advance to the next completion or start.
    double step = std::numeric_limits<double>::infinity();
    for (int i : active) step = std::min(step, remaining[i] / rate[i]);
    if (!pending.empty()) step = std::min(step, pending.top().first - now);
    if (!std::isfinite(step)) {
      return absl::InternalError(absl::StrCat(schedule.name, ": no transfer can progress at t = ",
                                              now, " s (a link's capacity is used up)"));
    }
    now += step;
    std::vector<int> still;
    still.reserve(active.size());
    for (int i : active) {
      const double moved = std::min(remaining[i], rate[i] * step);
      remaining[i] -= moved;
      for (int l : routes[i]) result.link_bytes[l] += moved;
      if (remaining[i] <= 1e-9 * transfers[i].bytes) {
        finish(i);
      } else {
        still.push_back(i);
      }
    }
    active.swap(still);
  }
  if (done < n) return absl::InternalError(schedule.name + ": simulation stalled");
  result.makespan_s = now;
  for (size_t l = 0; l < links.size(); ++l) {
    if (links[l].cross_rack) result.cross_rack_link_bytes += result.link_bytes[l];
  }
  return result;
}

}  // namespace plexus::collectives::sim
