#include "plexus/netmodel/mccs_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plexus/base/status.hpp"
#include "plexus/netmodel/flow_assign.hpp"
#include "plexus/netmodel/reorder.hpp"

namespace plexus::netmodel::sim {
namespace {

using Model = ::plexus::netmodel::Topology;

std::vector<double> Ranks(std::span<const double> v) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    const double average = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;
    for (size_t k = i; k <= j; ++k) rank[idx[k]] = average;
    i = j + 1;
  }
  return rank;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

}  // namespace

absl::StatusOr<double> Spearman(std::span<const double> x, std::span<const double> y) {
  if (x.size() != y.size() || x.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spearman: needs two samples of one size >= 2, got ", x.size(), " and ", y.size()));
  }
  const std::vector<double> rx = Ranks(x);
  const std::vector<double> ry = Ranks(y);
  const double n = static_cast<double>(x.size());
  const double mean = (n + 1) / 2;  // of ranks 1..n, ties averaged
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < rx.size(); ++i) {
    sxy += (rx[i] - mean) * (ry[i] - mean);
    sxx += (rx[i] - mean) * (rx[i] - mean);
    syy += (ry[i] - mean) * (ry[i] - mean);
  }
  if (sxx == 0 || syy == 0) {
    return absl::InvalidArgumentError("spearman: a sample is constant (no ranking)");
  }
  return sxy / std::sqrt(sxx * syy);
}

std::string_view PlacementName(Placement placement) {
  return placement == Placement::kRandom ? "random" : "compact";
}

std::string_view RingStrategyName(RingStrategy strategy) {
  switch (strategy) {
    case RingStrategy::kRandomRing:
      return "random ring";
    case RingStrategy::kOptimalRing:
      return "OR";
    case RingStrategy::kOptimalRingFfa:
      return "OR+FFA";
  }
  return "?";
}

absl::StatusOr<std::vector<MccsJob>> RunMccs(const MccsSpec& spec, Placement placement) {
  if (spec.job_sizes.empty()) return absl::InvalidArgumentError("mccs sim: no job sizes");
  for (int size : spec.job_sizes) {
    if (size < 2) {
      return absl::InvalidArgumentError(absl::StrCat("mccs sim: job size ", size, " < 2"));
    }
  }
  if (!(spec.load > 0 && spec.load <= 1) || !(spec.bytes > 0) || !std::isfinite(spec.bytes) ||
      spec.channels < 0 || spec.runs < 1) {
    return absl::InvalidArgumentError(
        "mccs sim: load must be in (0, 1], bytes > 0, channels >= 0, runs >= 1");
  }
  PLEXUS_ASSIGN_OR_RETURN(Network topo, Network::Clos(spec.fabric));
  const int gpus = topo.hosts();
  const int channels = spec.channels > 0 ? spec.channels : spec.fabric.spines;
  std::vector<double> capacity;
  for (const Link& l : topo.links()) capacity.push_back(l.bytes_per_s);
  const int smallest = *std::min_element(spec.job_sizes.begin(), spec.job_sizes.end());

  std::vector<MccsJob> out;
  for (int run = 0; run < spec.runs; ++run) {
    std::mt19937_64 rng(spec.seed * 1000003 + static_cast<uint64_t>(run));
    std::vector<int> free(gpus);
    std::iota(free.begin(), free.end(), 0);  // rack, host, GPU order: first fit is compact
    if (placement == Placement::kRandom) std::shuffle(free.begin(), free.end(), rng);
    const int budget = static_cast<int>(std::floor(spec.load * gpus));
    std::vector<std::vector<int>> jobs;
    for (int used = 0;;) {
      int size = spec.job_sizes[rng() % spec.job_sizes.size()];
      if (used + size > budget) size = smallest;
      if (used + size > budget) break;
      jobs.emplace_back(free.begin() + used, free.begin() + used + size);
      used += size;
    }
    const size_t first = out.size();
    for (const auto& job : jobs) {
      MccsJob j;
      j.run = run;
      j.gpus = static_cast<int>(job.size());
      std::vector<int> machines, racks;
      for (int g : job) {
        machines.push_back(topo.MachineOf(g));
        racks.push_back(topo.RackOf(g));
      }
      std::sort(machines.begin(), machines.end());
      std::sort(racks.begin(), racks.end());
      j.hosts = static_cast<int>(std::unique(machines.begin(), machines.end()) - machines.begin());
      j.racks = static_cast<int>(std::unique(racks.begin(), racks.end()) - racks.begin());
      out.push_back(j);
    }

    for (int s = 0; s < kRingStrategies; ++s) {
      const auto strategy = static_cast<RingStrategy>(s);
      // rings[job][channel]: endpoints in ring order.
      std::vector<std::vector<std::vector<int>>> rings(jobs.size());
      for (size_t k = 0; k < jobs.size(); ++k) {
        const auto& job = jobs[k];
        if (strategy == RingStrategy::kRandomRing) {
          // The user's ranks land on GPUs in no useful order; every channel follows them.
          std::mt19937_64 order_rng(spec.seed * 7919 + run * 131 + k);
          std::vector<int> ring = job;
          std::shuffle(ring.begin(), ring.end(), order_rng);
          rings[k].assign(channels, ring);
        } else {
          std::vector<Locality> where;
          for (int g : job) where.push_back({0, topo.RackOf(g), topo.MachineOf(g)});
          for (int c = 0; c < channels; ++c) {
            std::vector<int> ring;
            for (int m : LocalityRingOrder(where, c)) ring.push_back(job[m]);
            rings[k].push_back(std::move(ring));
          }
        }
      }
      // Every connection between machines is a flow; intra-machine hops take no network route.
      std::vector<Flow> flows;
      struct At {
        size_t job;
        int channel;
        size_t hop;
      };
      std::vector<At> at;
      for (size_t k = 0; k < jobs.size(); ++k) {
        std::vector<int> out_count(gpus, 0), in_count(gpus, 0);
        for (const auto& ring : rings[k]) {
          for (size_t i = 0; i < ring.size(); ++i) {
            const int a = ring[i], b = ring[(i + 1) % ring.size()];
            if (topo.MachineOf(a) == topo.MachineOf(b)) continue;
            ++out_count[a];
            ++in_count[b];
          }
        }
        for (int c = 0; c < channels; ++c) {
          const auto& ring = rings[k][c];
          for (size_t i = 0; i < ring.size(); ++i) {
            const int a = ring[i], b = ring[(i + 1) % ring.size()];
            if (topo.MachineOf(a) == topo.MachineOf(b)) continue;
            Flow f;
            f.job = static_cast<int>(k);
            f.demand = spec.fabric.host_bytes_per_s / std::max(out_count[a], in_count[b]);
            f.key = (static_cast<uint64_t>(k) << 48) ^ (static_cast<uint64_t>(c) << 40) ^
                    (static_cast<uint64_t>(a) << 20) ^ static_cast<uint64_t>(b);
            for (int p = 0; p < topo.Paths(a, b); ++p) f.routes.push_back(topo.Route(a, b, p));
            flows.push_back(std::move(f));
            at.push_back({k, c, i});
          }
        }
      }
      FlowAssignOptions assign;
      assign.policy = strategy == RingStrategy::kOptimalRingFfa ? FlowAssignPolicy::kFfa
                                                                : FlowAssignPolicy::kEcmp;
      assign.ecmp_seed = spec.seed * 31 + static_cast<uint64_t>(run);
      PLEXUS_ASSIGN_OR_RETURN(std::vector<int> route, AssignFlows(flows, capacity, assign));
      std::vector<std::vector<std::vector<int>>> paths(jobs.size());
      for (size_t k = 0; k < jobs.size(); ++k) {
        paths[k].assign(channels, std::vector<int>(jobs[k].size(), -1));
      }
      for (size_t f = 0; f < flows.size(); ++f) {
        const int p = route[f];
        paths[at[f].job][at[f].channel][at[f].hop] = flows[f].routes.size() > 1 ? p : -1;
      }
      std::vector<CoupledFlow> coupled;
      std::vector<size_t> job_of;
      for (size_t k = 0; k < jobs.size(); ++k) {
        for (int c = 0; c < channels; ++c) {
          coupled.push_back(
              RingAllreduceFlow(topo, rings[k][c], spec.bytes / channels, paths[k][c]));
          job_of.push_back(k);
        }
        int cross = 0;
        const auto& ring = rings[k][0];
        for (size_t i = 0; i < ring.size(); ++i) {
          cross += topo.RackOf(ring[i]) != topo.RackOf(ring[(i + 1) % ring.size()]);
        }
        out[first + k].cross_rack_hops[s] = cross;
      }
      std::vector<double> finish(coupled.size(), 0);
      if (spec.steady) {
        std::vector<std::vector<std::pair<int, int>>> uses;
        for (const auto& f : coupled) uses.push_back(LinkUses(topo, f));
        const std::vector<double> rate = MaxMinRates(topo, uses);
        for (size_t f = 0; f < coupled.size(); ++f) {
          finish[f] =
              coupled[f].latency_s +
              (std::isfinite(rate[f]) && coupled[f].bytes > 0 ? coupled[f].bytes / rate[f] : 0);
        }
      } else {
        PLEXUS_ASSIGN_OR_RETURN(CoupledResult r, SimulateCoupled(topo, coupled));
        finish = r.finish_s;
      }
      for (size_t f = 0; f < coupled.size(); ++f) {
        double& t = out[first + job_of[f]].seconds[s];
        t = std::max(t, finish[f]);
      }
    }
  }
  return out;
}

CostMatrix FairShareMatrix(const Model& model) {
  const int n = static_cast<int>(model.hosts.size());
  std::vector<int> in_rack(model.racks.size(), 0), in_pod(model.pods.size(), 0);
  for (int h = 0; h < n; ++h) {
    ++in_rack[model.RackOf(h)];
    ++in_pod[model.PodOf(h)];
  }
  CostMatrix m;
  m.n = n;
  m.latency_us.assign(static_cast<size_t>(n) * n, 0);
  m.bandwidth_gbps.assign(static_cast<size_t>(n) * n, 1);
  for (const auto& h : model.hosts) m.labels.push_back(h.name);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      double share = std::numeric_limits<double>::infinity();
      for (const Model::Link& l : model.Path(i, j)) {
        const int below = l.kind == Model::LinkKind::kHost   ? 1
                          : l.kind == Model::LinkKind::kRack ? in_rack[l.index]
                                                             : in_pod[l.index];
        share = std::min(share, model.Capacity(l) / below);
      }
      const size_t k = static_cast<size_t>(i) * n + j;
      m.bandwidth_gbps[k] = share;
      m.latency_us[k] = 2 * model.LatencyUs(i, j);
    }
  }
  return m;
}

absl::StatusOr<SpreadResult> RunSpread(const SpreadSpec& spec) {
  if (spec.orders < 1 || spec.correlation_orders < 2 || !(spec.bytes > 0) ||
      !(spec.reorder_seconds > 0)) {
    return absl::InvalidArgumentError(
        "spread: orders >= 1, correlation_orders >= 2, bytes > 0 and reorder_seconds > 0");
  }
  std::mt19937_64 rng(spec.seed);
  CostMatrix latency, bandwidth;
  Network net;
  std::vector<int> endpoint_of;  // node -> endpoint of `net`
  if (!spec.clos) {
    PLEXUS_ASSIGN_OR_RETURN(Model fabric, GenerateFabric(spec.fabric));
    const int n = static_cast<int>(fabric.hosts.size());
    if (n < 3) return absl::InvalidArgumentError("spread: needs at least 3 hosts");
    std::vector<int> host_of(n);
    std::iota(host_of.begin(), host_of.end(), 0);
    std::shuffle(host_of.begin(), host_of.end(), rng);
    Model t = fabric;
    for (int i = 0; i < n; ++i) t.hosts[i] = fabric.hosts[host_of[i]];
    PLEXUS_RETURN_IF_ERROR(t.Validate());
    latency = LatencyFromTopology(t, {.noise = spec.noise, .seed = spec.seed});
    bandwidth = latency;
    bandwidth.bandwidth_gbps = FairShareMatrix(t).bandwidth_gbps;
    PLEXUS_ASSIGN_OR_RETURN(net, Network::Tree(t));
    endpoint_of.resize(n);
    std::iota(endpoint_of.begin(), endpoint_of.end(), 0);
  } else {
    PLEXUS_ASSIGN_OR_RETURN(net, Network::Clos(spec.clos_fabric));
    const int n = net.hosts();
    if (n < 3) return absl::InvalidArgumentError("spread: needs at least 3 hosts");
    endpoint_of.resize(n);
    std::iota(endpoint_of.begin(), endpoint_of.end(), 0);
    std::shuffle(endpoint_of.begin(), endpoint_of.end(), rng);
    // What a prober sees: round trips times a lognormal factor; fair shares: the NIC inside a
    // leaf, the leaf's uplink over its hosts across leaves.
    const ClosSpec& c = spec.clos_fabric;
    const double nic_gbps = c.host_bytes_per_s * 8e-9;
    const double cross_gbps = std::min(nic_gbps, nic_gbps / c.oversubscription);
    std::normal_distribution<double> gauss(0, 1);
    latency.n = bandwidth.n = n;
    latency.latency_us.assign(static_cast<size_t>(n) * n, 0);
    bandwidth.bandwidth_gbps.assign(static_cast<size_t>(n) * n, nic_gbps);
    for (int i = 0; i < n; ++i) latency.labels.push_back(absl::StrCat("host", endpoint_of[i]));
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const int a = endpoint_of[i], b = endpoint_of[j];
        const double rtt = 2e6 * net.PathLatency(a, b) * std::exp(spec.noise * gauss(rng));
        latency.latency_us[static_cast<size_t>(i) * n + j] = rtt;
        latency.latency_us[static_cast<size_t>(j) * n + i] = rtt;
        if (net.RackOf(a) != net.RackOf(b)) {
          bandwidth.bandwidth_gbps[static_cast<size_t>(i) * n + j] = cross_gbps;
          bandwidth.bandwidth_gbps[static_cast<size_t>(j) * n + i] = cross_gbps;
        }
      }
    }
    bandwidth.labels = latency.labels;
    bandwidth.latency_us = latency.latency_us;
  }
  const int n = static_cast<int>(endpoint_of.size());
  const uint64_t ecmp_seed = spec.seed * 131 + 7;
  std::vector<double> capacity;
  for (const Link& l : net.links()) capacity.push_back(l.bytes_per_s);
  auto time_ms = [&](const std::vector<int>& order) -> absl::StatusOr<double> {
    std::vector<int> ring;
    for (int node : order) ring.push_back(endpoint_of[node]);
    // One connection per hop; on a Clos, ECMP hashes it onto a spine.
    std::vector<Flow> flows;
    for (size_t i = 0; i < ring.size(); ++i) {
      const int a = ring[i], b = ring[(i + 1) % ring.size()];
      Flow f;
      f.key = (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
      for (int p = 0; p < std::max(1, net.Paths(a, b)); ++p) f.routes.push_back(net.Route(a, b, p));
      flows.push_back(std::move(f));
    }
    FlowAssignOptions ecmp;
    ecmp.policy = FlowAssignPolicy::kEcmp;
    ecmp.ecmp_seed = ecmp_seed;
    PLEXUS_ASSIGN_OR_RETURN(std::vector<int> route, AssignFlows(flows, capacity, ecmp));
    for (size_t i = 0; i < route.size(); ++i) {
      if (flows[i].routes.size() < 2) route[i] = -1;
    }
    PLEXUS_ASSIGN_OR_RETURN(
        CoupledResult r, SimulateCoupled(net, {RingAllreduceFlow(net, ring, spec.bytes, route)}));
    return r.makespan_s * 1e3;
  };
  const CostOptions ring{.model = CostModel::kRing, .bytes = spec.bytes};
  SpreadResult result;
  result.n = n;
  std::vector<double> random_lat, random_bw;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int k = 0; k < spec.orders; ++k) {
    std::shuffle(order.begin(), order.end(), rng);
    PLEXUS_ASSIGN_OR_RETURN(double ms, time_ms(order));
    result.random_ms.push_back(ms);
    PLEXUS_ASSIGN_OR_RETURN(double cl, OrderCost(latency, order, ring));
    PLEXUS_ASSIGN_OR_RETURN(double cb, OrderCost(bandwidth, order, ring));
    random_lat.push_back(cl);
    random_bw.push_back(cb);
  }
  result.median_random_cost_us = Median(random_lat);
  ReorderOptions options{.cost = ring, .seed = spec.seed};
  options.time_limit = absl::Seconds(spec.reorder_seconds);
  PLEXUS_ASSIGN_OR_RETURN(ReorderResult chosen, Reorder(latency, options));
  result.reordered_cost_us = chosen.cost;
  PLEXUS_ASSIGN_OR_RETURN(result.reordered_ms, time_ms(chosen.order));

  // Orders from the reordered one to random ones: k random swaps, k from 0 to 2n - 1 on a
  // geometric scale (the seed took orders at the 10i-th percentiles of its solver's range).
  std::vector<double> times, lat, bw;
  for (int i = 0; i < spec.correlation_orders; ++i) {
    const double e = static_cast<double>(i) / (spec.correlation_orders - 1);
    const int swaps = static_cast<int>(std::floor(std::pow(2.0 * n, e))) - 1;
    std::vector<int> o = chosen.order;
    for (int s = 0; s < swaps; ++s) std::swap(o[rng() % n], o[rng() % n]);
    PLEXUS_ASSIGN_OR_RETURN(double ms, time_ms(o));
    PLEXUS_ASSIGN_OR_RETURN(double cl, OrderCost(latency, o, ring));
    PLEXUS_ASSIGN_OR_RETURN(double cb, OrderCost(bandwidth, o, ring));
    times.push_back(ms);
    lat.push_back(cl);
    bw.push_back(cb);
  }
  auto rho = [](std::span<const double> a, std::span<const double> b) {
    auto r = Spearman(a, b);
    return r.ok() ? *r : std::numeric_limits<double>::quiet_NaN();
  };
  result.spearman_latency = rho(lat, times);
  result.spearman_bandwidth = rho(bw, times);
  result.spearman_latency_random = rho(random_lat, result.random_ms);
  result.spearman_bandwidth_random = rho(random_bw, result.random_ms);
  return result;
}

}  // namespace plexus::netmodel::sim
