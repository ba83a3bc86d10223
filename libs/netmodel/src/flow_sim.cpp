#include "plexus/netmodel/flow_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::netmodel::sim {
namespace {

bool Positive(double v) { return std::isfinite(v) && v > 0; }
bool NonNegative(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

// Link layout: host h up = 2h, down = 2h + 1; then per rack up/down (racks) or per leaf and
// spine up/down (Clos).
absl::StatusOr<Network> Network::Racks(const RackSpec& spec) {
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
  Network t;
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

absl::StatusOr<Network> Network::Clos(const ClosSpec& spec) {
  if (spec.leaves < 1 || spec.spines < 1 || spec.hosts_per_leaf < 1 || spec.nics_per_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "clos topology: leaves (", spec.leaves, "), spines (", spec.spines, "), hosts_per_leaf (",
        spec.hosts_per_leaf, ") and nics_per_host (", spec.nics_per_host, ") must be >= 1"));
  }
  if (!Positive(spec.host_bytes_per_s) || !(spec.oversubscription >= 1) ||
      !std::isfinite(spec.oversubscription) || !NonNegative(spec.host_latency_s) ||
      !NonNegative(spec.spine_latency_s) || !NonNegative(spec.nvlink_bytes_per_s)) {
    return absl::InvalidArgumentError(
        "clos topology: host_bytes_per_s must be > 0, oversubscription >= 1, latencies and "
        "nvlink_bytes_per_s >= 0");
  }
  Network t;
  t.racks_ = spec.leaves;
  t.spines_ = spec.spines;
  t.nics_per_host_ = spec.nics_per_host;
  t.hosts_per_rack_ = spec.hosts_per_leaf * spec.nics_per_host;
  const int endpoints = spec.leaves * t.hosts_per_rack_;
  for (int e = 0; e < endpoints; ++e) {
    t.rack_of_.push_back(e / t.hosts_per_rack_);
    const std::string name = spec.nics_per_host == 1 ? absl::StrCat("host", e)
                                                     : absl::StrCat("host", e / spec.nics_per_host,
                                                                    ".nic", e % spec.nics_per_host);
    t.links_.push_back({spec.host_bytes_per_s, spec.host_latency_s, false, name + ".up"});
    t.links_.push_back({spec.host_bytes_per_s, spec.host_latency_s, false, name + ".down"});
  }
  const double per_spine =
      t.hosts_per_rack_ * spec.host_bytes_per_s / spec.oversubscription / spec.spines;
  for (int l = 0; l < spec.leaves; ++l) {
    for (int s = 0; s < spec.spines; ++s) {
      t.links_.push_back(
          {per_spine, spec.spine_latency_s, true, absl::StrCat("leaf", l, "-spine", s, ".up")});
      t.links_.push_back(
          {per_spine, spec.spine_latency_s, true, absl::StrCat("leaf", l, "-spine", s, ".down")});
    }
  }
  if (spec.nics_per_host > 1 && spec.nvlink_bytes_per_s > 0) {
    t.nvlink_base_ = static_cast<int>(t.links_.size());
    for (int e = 0; e < endpoints; ++e) {
      t.links_.push_back({spec.nvlink_bytes_per_s, 0, false, absl::StrCat("gpu", e, ".nvlink.up")});
      t.links_.push_back(
          {spec.nvlink_bytes_per_s, 0, false, absl::StrCat("gpu", e, ".nvlink.down")});
    }
  }
  return t;
}

absl::StatusOr<Network> Network::Tree(const ::plexus::netmodel::Topology& input) {
  if (input.hosts.empty()) return absl::InvalidArgumentError("tree topology: no hosts");
  ::plexus::netmodel::Topology model = input;  // resolves parents (RackOf, PodOf)
  PLEXUS_RETURN_IF_ERROR(model.Validate());
  Network t;
  t.racks_ = static_cast<int>(model.racks.size());
  constexpr double kBytesPerGbit = 1e9 / 8;
  auto add = [&](double gbps, double latency_us, bool cross, const std::string& name) {
    if (!Positive(gbps) || !NonNegative(latency_us)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tree topology: ", name, ": capacity must be > 0 and latency >= 0 (Validate() it)"));
    }
    t.links_.push_back({gbps * kBytesPerGbit, latency_us * 1e-6, cross, name + ".up"});
    t.links_.push_back({gbps * kBytesPerGbit, latency_us * 1e-6, cross, name + ".down"});
    return absl::OkStatus();
  };
  for (size_t h = 0; h < model.hosts.size(); ++h) {
    const auto& host = model.hosts[h];
    PLEXUS_RETURN_IF_ERROR(add(host.nic_gbps, host.nic_latency_us, false, host.name));
    t.rack_of_.push_back(model.RackOf(static_cast<int>(h)));
  }
  for (const auto& rack : model.racks) {
    PLEXUS_RETURN_IF_ERROR(add(rack.uplink_gbps, rack.uplink_latency_us, true, rack.name));
  }
  for (const auto& pod : model.pods) {
    PLEXUS_RETURN_IF_ERROR(add(pod.uplink_gbps, pod.uplink_latency_us, true, pod.name));
  }
  t.pod_of_rack_.assign(model.racks.size(), 0);
  for (size_t h = 0; h < model.hosts.size(); ++h) {
    t.pod_of_rack_[model.RackOf(static_cast<int>(h))] = model.PodOf(static_cast<int>(h));
  }
  return t;
}

int Network::Paths(int src, int dst) const {
  if (src == dst) return 0;
  if (spines_ > 0 && rack_of_[src] != rack_of_[dst]) return spines_;
  return 1;
}

std::vector<int> Network::Route(int src, int dst, int path) const {
  if (src == dst) return {};
  if (nics_per_host_ > 1 && MachineOf(src) == MachineOf(dst)) {
    if (nvlink_base_ < 0) return {};
    return {nvlink_base_ + 2 * src, nvlink_base_ + 2 * dst + 1};
  }
  std::vector<int> route{2 * src};
  const int rs = rack_of_[src];
  const int rd = rack_of_[dst];
  const int base = 2 * hosts();
  if (rs != rd) {
    if (!pod_of_rack_.empty()) {
      route.push_back(base + 2 * rs);
      const int ps = pod_of_rack_[rs];
      const int pd = pod_of_rack_[rd];
      if (ps != pd) {
        const int pod_base = base + 2 * racks_;
        route.push_back(pod_base + 2 * ps);
        route.push_back(pod_base + 2 * pd + 1);
      }
      route.push_back(base + 2 * rd + 1);
    } else if (spines_ == 0) {
      route.push_back(base + 2 * rs);
      route.push_back(base + 2 * rd + 1);
    } else {
      const int spine = path >= 0 ? path : (src + dst) % spines_;
      route.push_back(base + 2 * (rs * spines_ + spine));
      route.push_back(base + 2 * (rd * spines_ + spine) + 1);
    }
  }
  route.push_back(2 * dst + 1);
  return route;
}

double Network::PathLatency(int src, int dst) const {
  double latency = 0;
  for (int link : Route(src, dst)) latency += links_[link].latency_s;
  return latency;
}

absl::Status Network::SetHostBandwidth(int host, double up_bytes_per_s, double down_bytes_per_s) {
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

absl::Status Network::AddHostLatency(int host, double extra_s) {
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

absl::Status ValidateSchedule(const Schedule& schedule, const Network& topology) {
  PLEXUS_RETURN_IF_ERROR(ValidateSchedule(schedule, topology.hosts()));
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    if (t.path < -1 || (t.path >= 0 && t.path >= topology.Paths(t.src, t.dst))) {
      return absl::InvalidArgumentError(absl::StrCat(
          schedule.name, ": transfer ", i, " (", t.src, " -> ", t.dst, ") takes route ", t.path,
          ", but the pair has ", topology.Paths(t.src, t.dst), " equal-cost routes"));
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

absl::StatusOr<SimResult> Simulate(const Network& topology, const Schedule& schedule) {
  if (absl::Status s = ValidateSchedule(schedule, topology); !s.ok()) return s;
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
    routes[i] = topology.Route(transfers[i].src, transfers[i].dst, transfers[i].path);
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

namespace {

using Uses = std::vector<std::pair<int, int>>;

// Progressive filling over the flows `uses` points at (see MaxMinRates).
std::vector<double> FillRates(const std::vector<Link>& links,
                              const std::vector<const Uses*>& uses) {
  const size_t n = uses.size();
  std::vector<double> rate(n, std::numeric_limits<double>::infinity());
  std::vector<double> residual(links.size(), 0);
  std::vector<int64_t> weight(links.size(), 0);
  std::vector<std::vector<int>> on_link(links.size());
  std::vector<int> touched;
  size_t left = 0;
  for (size_t f = 0; f < n; ++f) {
    if (uses[f]->empty()) continue;
    ++left;
    for (auto [l, k] : *uses[f]) {
      if (on_link[l].empty()) {
        touched.push_back(l);
        residual[l] = links[l].bytes_per_s;
      }
      weight[l] += k;
      on_link[l].push_back(static_cast<int>(f));
    }
  }
  std::vector<char> frozen(n, 0);
  while (left > 0) {
    int best = -1;
    double share = std::numeric_limits<double>::infinity();
    for (int l : touched) {
      if (weight[l] == 0) continue;
      const double s = std::max(0.0, residual[l]) / static_cast<double>(weight[l]);
      if (s < share) {
        share = s;
        best = l;
      }
    }
    for (int f : on_link[best]) {
      if (frozen[f]) continue;
      frozen[f] = 1;
      --left;
      rate[f] = share;
      for (auto [l, k] : *uses[f]) {
        residual[l] -= share * k;
        weight[l] -= k;
      }
    }
  }
  return rate;
}

}  // namespace

std::vector<double> MaxMinRates(const Network& topology,
                                const std::vector<std::vector<std::pair<int, int>>>& uses) {
  std::vector<const Uses*> ptrs;
  ptrs.reserve(uses.size());
  for (const auto& u : uses) ptrs.push_back(&u);
  return FillRates(topology.links(), ptrs);
}

std::vector<std::pair<int, int>> LinkUses(const Network& topology, const CoupledFlow& flow) {
  std::vector<int> all;
  for (const Hop& hop : flow.hops) {
    for (int l : topology.Route(hop.src, hop.dst, hop.path)) all.push_back(l);
  }
  std::sort(all.begin(), all.end());
  Uses uses;
  for (int l : all) {
    if (uses.empty() || uses.back().first != l) {
      uses.push_back({l, 1});
    } else {
      ++uses.back().second;
    }
  }
  return uses;
}

absl::StatusOr<CoupledResult> SimulateCoupled(const Network& topology,
                                              const std::vector<CoupledFlow>& flows) {
  const size_t n = flows.size();
  std::vector<Uses> uses(n);
  for (size_t f = 0; f < n; ++f) {
    const CoupledFlow& flow = flows[f];
    if (!NonNegative(flow.bytes) || !NonNegative(flow.start_s) || !NonNegative(flow.latency_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coupled flow ", f, ": bytes, start_s and latency_s must be finite and >= 0"));
    }
    for (size_t h = 0; h < flow.hops.size(); ++h) {
      const Hop& hop = flow.hops[h];
      if (hop.src < 0 || hop.src >= topology.hosts() || hop.dst < 0 ||
          hop.dst >= topology.hosts()) {
        return absl::InvalidArgumentError(
            absl::StrCat("coupled flow ", f, ", hop ", h, " (", hop.src, " -> ", hop.dst,
                         ") names an endpoint outside [0, ", topology.hosts(), ")"));
      }
      if (hop.path < -1 || (hop.path >= 0 && hop.path >= topology.Paths(hop.src, hop.dst))) {
        return absl::InvalidArgumentError(
            absl::StrCat("coupled flow ", f, ", hop ", h, " (", hop.src, " -> ", hop.dst,
                         ") takes route ", hop.path, ", but the pair has ",
                         topology.Paths(hop.src, hop.dst), " equal-cost routes"));
      }
    }
    uses[f] = LinkUses(topology, flow);
  }
  CoupledResult result;
  result.finish_s.assign(n, 0);
  {
    std::vector<const Uses*> all;
    for (const auto& u : uses) all.push_back(&u);
    result.initial_rate = FillRates(topology.links(), all);
  }
  using Pending = std::pair<double, int>;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;
  for (size_t f = 0; f < n; ++f) {
    pending.push({flows[f].start_s + flows[f].latency_s, static_cast<int>(f)});
  }
  std::vector<int> active;
  std::vector<double> remaining(n, 0);
  double now = 0;
  while (!pending.empty() || !active.empty()) {
    while (!pending.empty() && pending.top().first <= now) {
      const int f = pending.top().second;
      pending.pop();
      if (flows[f].bytes == 0 || uses[f].empty()) {
        result.finish_s[f] = now;
      } else {
        remaining[f] = flows[f].bytes;
        active.push_back(f);
      }
    }
    if (active.empty()) {
      if (!pending.empty()) now = pending.top().first;
      continue;
    }
    // Every event starts or finishes a flow: more than 2n + 1 means no progress (a bug).
    if (++result.events > 2 * static_cast<int64_t>(n) + 1) {
      return absl::InternalError(
          absl::StrCat("coupled flows: no progress at t = ", now, " s with ", active.size(),
                       " active flows, ", remaining[active[0]], " bytes left on flow ", active[0]));
    }
    std::vector<const Uses*> ptrs;
    ptrs.reserve(active.size());
    for (int f : active) ptrs.push_back(&uses[f]);
    const std::vector<double> rate = FillRates(topology.links(), ptrs);
    double step = std::numeric_limits<double>::infinity();
    for (size_t a = 0; a < active.size(); ++a) {
      step = std::min(step, remaining[active[a]] / rate[a]);
    }
    if (!pending.empty()) step = std::min(step, pending.top().first - now);
    if (!std::isfinite(step)) {
      return absl::InternalError(
          absl::StrCat("coupled flows: none can progress at t = ", now, " s (a link has 0 B/s)"));
    }
    now += step;
    std::vector<int> still;
    for (size_t a = 0; a < active.size(); ++a) {
      const int f = active[a];
      remaining[f] -= std::min(remaining[f], rate[a] * step);
      if (remaining[f] <= 1e-9 * flows[f].bytes) {
        result.finish_s[f] = now;
      } else {
        still.push_back(f);
      }
    }
    active.swap(still);
  }
  for (double t : result.finish_s) result.makespan_s = std::max(result.makespan_s, t);
  return result;
}

CoupledFlow RingAllreduceFlow(const Network& topology, std::span<const int> ring, double bytes,
                              std::span<const int> paths) {
  CoupledFlow flow;
  const size_t n = ring.size();
  if (n < 2) return flow;
  double slowest = 0;
  for (size_t i = 0; i < n; ++i) {
    const int src = ring[i];
    const int dst = ring[(i + 1) % n];
    flow.hops.push_back({src, dst, i < paths.size() ? paths[i] : -1});
    slowest = std::max(slowest, topology.PathLatency(src, dst));
  }
  flow.bytes = 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * bytes;
  flow.latency_s = 2.0 * static_cast<double>(n - 1) * slowest;
  return flow;
}

}  // namespace plexus::netmodel::sim
