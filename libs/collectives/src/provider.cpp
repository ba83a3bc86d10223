// The strategy provider: MCCS's locality-aware rings, flow assignment of the rings' connections
// to equal-cost routes (pinned by source addresses) and QoS windows per communicator, and the
// glue that creates a communicator from a provider's answer (plexus/collectives/provider.hpp).
#include "plexus/collectives/provider.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/base/status.hpp"

namespace plexus::collectives {
using netmodel::AssignFlows;
using netmodel::CostMatrix;
using netmodel::Flow;
using netmodel::FlowAssignOptions;
using netmodel::Locality;
using netmodel::LocalityRingOrder;
using netmodel::Reorder;
using netmodel::ReorderResult;
using netmodel::Topology;

namespace {

bool SameRack(const Locality& a, const Locality& b) { return a.pod == b.pod && a.rack == b.rack; }

// The latency matrix between the ranks of `ranks` on `topology` (Locality::host indexes hosts).
absl::StatusOr<CostMatrix> RankLatencies(const Topology& topology,
                                         const std::vector<RankPlacement>& ranks) {
  CostMatrix m;
  m.n = static_cast<int>(ranks.size());
  m.latency_us.assign(static_cast<size_t>(m.n) * m.n, 0);
  for (int i = 0; i < m.n; ++i) {
    const int h = ranks[i].locality.host;
    if (h < 0 || static_cast<size_t>(h) >= topology.hosts.size()) {
      return absl::InvalidArgumentError(absl::StrCat("strategy provider: rank ", i,
                                                     " sits on host ", h, " but the topology has ",
                                                     topology.hosts.size(), " hosts"));
    }
    m.labels.push_back(topology.hosts[h].name);
  }
  for (int i = 0; i < m.n; ++i) {
    for (int j = 0; j < m.n; ++j) {
      if (i == j) continue;
      const int a = ranks[i].locality.host, b = ranks[j].locality.host;
      m.latency_us[static_cast<size_t>(i) * m.n + j] = a == b ? 0 : 2 * topology.LatencyUs(a, b);
    }
  }
  return m;
}

}  // namespace

absl::StatusOr<std::vector<Strategy>> DefaultStrategyProvider::Choose(
    std::span<const StrategyRequest> communicators) {
  const DefaultProviderOptions& o = options_;
  if (o.ring == DefaultProviderOptions::Ring::kReorder) {
    if (!o.topology.has_value()) {
      return absl::InvalidArgumentError(
          "strategy provider: ring = kReorder needs DefaultProviderOptions::topology");
    }
    PLEXUS_RETURN_IF_ERROR(options_.topology->Validate());
  }
  if (o.routes < 0 || o.channels < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "strategy provider: routes (", o.routes, ") and channels (", o.channels, ") must be >= 0"));
  }
  if (!(o.route_bytes_per_s > 0) || !(o.nic_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        "strategy provider: route_bytes_per_s and nic_bytes_per_s must be > 0");
  }
  int routes = o.routes;
  if (routes == 0) {
    for (const StrategyRequest& req : communicators) {
      for (const RankPlacement& p : req.ranks) {
        routes = std::max(routes, static_cast<int>(p.route_addresses.size()));
      }
    }
    routes = std::max(routes, 1);
  }

  std::vector<Strategy> out(communicators.size());
  // Racks (pod, rack) -> dense index: each has `routes` uplinks and downlinks, route k's pair.
  std::map<std::pair<int, int>, int> rack_index;
  std::vector<Flow> flows;
  struct FlowOwner {
    size_t request;
    int channel;
    int rank;
  };
  std::vector<FlowOwner> owners;
  for (size_t q = 0; q < communicators.size(); ++q) {
    const StrategyRequest& req = communicators[q];
    const int n = static_cast<int>(req.ranks.size());
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("strategy provider: communicator ", q, " (job ", req.job, ") has no ranks"));
    }
    if (req.channels < 0 || req.channels > 64) {
      return absl::InvalidArgumentError(absl::StrCat("strategy provider: communicator ", q,
                                                     " asks for ", req.channels,
                                                     " channels (0 to 64)"));
    }
    Strategy& s = out[q];
    std::vector<Locality> where(n);
    for (int r = 0; r < n; ++r) where[r] = req.ranks[r].locality;
    switch (o.ring) {
      case DefaultProviderOptions::Ring::kIdentity:
        s.ring_order.resize(n);
        std::iota(s.ring_order.begin(), s.ring_order.end(), 0);
        break;
      case DefaultProviderOptions::Ring::kLocality:
        s.ring_order = LocalityRingOrder(where, 0);
        break;
      case DefaultProviderOptions::Ring::kReorder: {
        PLEXUS_ASSIGN_OR_RETURN(CostMatrix m, RankLatencies(*o.topology, req.ranks));
        absl::StatusOr<ReorderResult> r = Reorder(m, o.reorder);
        if (!r.ok()) {
          return absl::Status(r.status().code(),
                              absl::StrCat("strategy provider: reordering communicator ", q, ": ",
                                           std::string(r.status().message())));
        }
        s.ring_order = r->order;
        break;
      }
    }
    s.algorithms = o.algorithms;
    s.channels = req.channels > 0 ? req.channels : o.channels > 0 ? o.channels : routes;
    s.channels = std::min(s.channels, 64);
    s.qos = o.qos;
    for (const auto& [job, schedule] : o.qos_of) {
      if (job == req.job) s.qos = schedule;
    }
    PLEXUS_RETURN_IF_ERROR(s.qos.Validate());
    if (n == 1) continue;
    // One flow per channel and rank: the rank's connection to its ring successor.
    for (int c = 0; c < s.channels; ++c) {
      for (int p = 0; p < n; ++p) {
        const int src = s.ring_order[p];
        const int dst = s.ring_order[(p + 1) % n];
        Flow f;
        f.job = req.job;
        f.high_priority = req.high_priority;
        f.demand = o.nic_bytes_per_s / s.channels;
        f.key = (static_cast<uint64_t>(req.job) << 40) ^ (static_cast<uint64_t>(c) << 20) ^
                (static_cast<uint64_t>(src) << 10) ^ static_cast<uint64_t>(dst);
        const Locality& a = where[src];
        const Locality& b = where[dst];
        if (SameRack(a, b)) {
          f.routes = {{}};  // no shared link: nothing to balance
        } else {
          const int ra = rack_index.try_emplace({a.pod, a.rack}, rack_index.size()).first->second;
          const int rb = rack_index.try_emplace({b.pod, b.rack}, rack_index.size()).first->second;
          for (int k = 0; k < routes; ++k) {
            f.routes.push_back({(ra * routes + k) * 2, (rb * routes + k) * 2 + 1});
          }
        }
        flows.push_back(std::move(f));
        owners.push_back({q, c, src});
      }
    }
  }
  const std::vector<double> capacity(std::max<size_t>(rack_index.size() * routes * 2, 1),
                                     o.route_bytes_per_s);
  FlowAssignOptions fa;
  fa.policy = o.flow_policy;
  fa.ecmp_seed = o.ecmp_seed;
  fa.reserved_routes = o.reserved_routes;
  PLEXUS_ASSIGN_OR_RETURN(std::vector<int> assigned, AssignFlows(flows, capacity, fa));

  for (size_t q = 0; q < communicators.size(); ++q) {
    Strategy& s = out[q];
    const int n = static_cast<int>(communicators[q].ranks.size());
    if (n > 1) s.routes.assign(s.channels, std::vector<int>(n, 0));
  }
  for (size_t f = 0; f < flows.size(); ++f) {
    out[owners[f].request].routes[owners[f].channel][owners[f].rank] = assigned[f];
  }
  for (size_t q = 0; q < communicators.size(); ++q) {
    Strategy& s = out[q];
    const StrategyRequest& req = communicators[q];
    const int n = static_cast<int>(req.ranks.size());
    s.addresses.assign(n, std::vector<std::string>(s.channels));
    if (s.routes.empty()) continue;
    for (int r = 0; r < n; ++r) {
      const std::vector<std::string>& aliases = req.ranks[r].route_addresses;
      if (aliases.empty()) continue;
      for (int c = 0; c < s.channels; ++c) {
        s.addresses[r][c] = aliases[s.routes[c][r] % aliases.size()];
      }
    }
  }
  return out;
}

CommunicatorOptions ApplyStrategy(const CommunicatorOptions& options, const Strategy& strategy,
                                  int rank) {
  CommunicatorOptions out = options;
  if (!strategy.ring_order.empty()) out.ring_order = strategy.ring_order;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    if (strategy.algorithms.Get(kind) != Algorithm::kAuto) {
      out.algorithms.Set(kind, strategy.algorithms.Get(kind));
    }
  }
  if (strategy.channels > 0) out.channels = strategy.channels;
  if (rank >= 0 && static_cast<size_t>(rank) < strategy.addresses.size()) {
    const std::vector<std::string>& mine = strategy.addresses[rank];
    if (std::any_of(mine.begin(), mine.end(), [](const std::string& a) { return !a.empty(); })) {
      out.channel_local_addresses = mine;
    }
  }
  if (strategy.qos.enabled()) out.qos = strategy.qos;
  return out;
}

int CrossRackHops(std::span<const Locality> ranks, const std::vector<int>& ring_order) {
  const int n = static_cast<int>(ring_order.size());
  int hops = 0;
  for (int p = 0; p < n && n > 1; ++p) {
    if (!SameRack(ranks[ring_order[p]], ranks[ring_order[(p + 1) % n]])) ++hops;
  }
  return hops;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateWithProvider(transport::Rendezvous& rendezvous,
                                                                 CommunicatorOptions options,
                                                                 StrategyProvider& provider,
                                                                 const RankPlacement& here) {
  for (const std::string& a : here.route_addresses) {
    if (a.find_first_of(",|") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rendezvous.rank(), ": route address '", a, "' contains ',' or '|'"));
    }
  }
  const std::string mine =
      absl::StrCat(here.locality.pod, ",", here.locality.rack, ",", here.locality.host, "|",
                   absl::StrJoin(here.route_addresses, ","));
  PLEXUS_ASSIGN_OR_RETURN(
      const std::vector<std::string> all,
      rendezvous.AllGather("plexus/coll/provider/placement", mine, options.connect_timeout));
  StrategyRequest request;
  request.channels = options.channels;
  for (size_t r = 0; r < all.size(); ++r) {
    const std::vector<std::string> parts = absl::StrSplit(all[r], absl::MaxSplits('|', 1));
    const std::vector<std::string> where =
        parts.empty() ? std::vector<std::string>() : absl::StrSplit(parts[0], ',');
    RankPlacement p;
    if (parts.size() != 2 || where.size() != 3 || !absl::SimpleAtoi(where[0], &p.locality.pod) ||
        !absl::SimpleAtoi(where[1], &p.locality.rack) ||
        !absl::SimpleAtoi(where[2], &p.locality.host)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", rendezvous.rank(), ": malformed placement of rank ", r, ": '", all[r], "'"));
    }
    if (!parts[1].empty()) p.route_addresses = absl::StrSplit(parts[1], ',');
    request.ranks.push_back(std::move(p));
  }
  absl::StatusOr<std::vector<Strategy>> chosen = provider.Choose({&request, 1});
  if (!chosen.ok()) {
    return absl::Status(chosen.status().code(),
                        absl::StrCat("rank ", rendezvous.rank(), ": the strategy provider: ",
                                     std::string(chosen.status().message())));
  }
  if (chosen->size() != 1) {
    return absl::InternalError(absl::StrCat("rank ", rendezvous.rank(),
                                            ": the strategy provider returned ", chosen->size(),
                                            " strategies for 1 communicator"));
  }
  return Communicator::Create(rendezvous,
                              ApplyStrategy(options, chosen->front(), rendezvous.rank()));
}

}  // namespace plexus::collectives
