// What the network looks like to a job: a topology model (hosts in racks in pods, each element
// with an uplink of given capacity and latency) and a cost matrix between nodes (measured by the
// latency prober, plexus/collectives/probe.hpp, or derived from a topology). Both read and write
// JSON; docs/netmodel.md, "Topology model and cost matrix".
//
//   auto fabric = GenerateFabric({.pods = 16, .racks_per_pod = 4, .hosts_per_rack = 8});
//   CostMatrix latency = LatencyFromTopology(fabric, {.noise = 0.1, .seed = 7});
//   std::string text = TopologyToJson(fabric);   // and ParseTopology(text, "fabric.json")
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::netmodel {

// A three-level tree: host -> rack switch -> pod switch -> core. Each element names its parent
// and owns the link to it (its uplink). The path between two hosts climbs to their lowest common
// ancestor; a pair on one host crosses no link.
struct Topology {
  struct Pod {
    std::string name;
    double uplink_gbps = 0;        // pod <-> core, per direction
    double uplink_latency_us = 0;  // one way
  };
  struct Rack {
    std::string name;
    std::string pod;
    double uplink_gbps = 0;  // rack <-> pod
    double uplink_latency_us = 0;
  };
  struct Host {
    std::string name;
    std::string rack;
    double nic_gbps = 0;  // host <-> rack
    double nic_latency_us = 0;
  };
  std::vector<Pod> pods;
  std::vector<Rack> racks;
  std::vector<Host> hosts;

  // A link is the uplink of one element: kind and index into pods/racks/hosts.
  enum class LinkKind : uint8_t { kHost, kRack, kPod };
  struct Link {
    LinkKind kind;
    int index;
    bool operator==(const Link&) const = default;
  };
  // The links host a's traffic to host b crosses (both directions share a link's capacity
  // model: capacity is per direction, so a->b and b->a do not compete). Empty when a == b.
  // Requires a valid topology (Validate()).
  std::vector<Link> Path(int a, int b) const;
  double Capacity(const Link& link) const;  // Gbps
  // One-way latency between hosts: the sum of the path's link latencies.
  double LatencyUs(int a, int b) const;
  // Rack and pod index of a host (Validate() resolves names to indices).
  int RackOf(int host) const { return host_rack_[host]; }
  int PodOf(int host) const { return rack_pod_[host_rack_[host]]; }

  // Checks names are unique and non-empty, parents exist, capacities > 0, latencies >= 0;
  // resolves parents. Errors name the element ("hosts[3].rack: no rack named 'r9'").
  absl::Status Validate();

 private:
  std::vector<int> host_rack_;
  std::vector<int> rack_pod_;
};

// Reads a topology from JSON text:
//   {"pods":  [{"name": "p0", "uplink_gbps": 400, "uplink_latency_us": 10}],
//    "racks": [{"name": "r0", "pod": "p0", "uplink_gbps": 200, "uplink_latency_us": 4}],
//    "hosts": [{"name": "h0", "rack": "r0", "nic_gbps": 25, "nic_latency_us": 2}]}
// Unknown fields are errors; `what` names the input in errors (a file name). Validated.
absl::StatusOr<Topology> ParseTopology(std::string_view json_text, std::string_view what);
std::string TopologyToJson(const Topology& topology);

// A generated fabric: pods x racks_per_pod x hosts_per_rack hosts named p<i>, p<i>r<j>,
// p<i>r<j>h<k>. Rack uplinks carry hosts_per_rack * nic_gbps / rack_oversubscription, pod
// uplinks racks_per_pod * rack uplink / pod_oversubscription (oversubscribed fabrics: > 1).
struct FabricSpec {
  int pods = 16;
  int racks_per_pod = 4;
  int hosts_per_rack = 8;
  double nic_gbps = 25;
  double rack_oversubscription = 2;
  double pod_oversubscription = 4;
  double nic_latency_us = 2;
  double rack_latency_us = 5;
  double pod_latency_us = 20;
};
// The most hosts a generated fabric may have: its latency matrix has hosts^2 entries, and the
// fabric, the matrix and its JSON text must fit in a workstation's memory in seconds.
inline constexpr int64_t kMaxFabricHosts = 4096;
// InvalidArgument naming the sizes when pods x racks_per_pod x hosts_per_rack (the product, not
// only each factor) is out of range, or a size is below 1.
absl::Status CheckFabricSize(const FabricSpec& spec);
absl::StatusOr<Topology> GenerateFabric(const FabricSpec& spec);

// Costs between the n nodes of a job (a node is a rank, or a host): latency_us[i*n + j] is the
// cost of a message from node i to node j, in microseconds; optionally bandwidth_gbps[i*n + j]
// (then a transfer of S bytes costs latency + S / bandwidth). labels[i] names node i's host
// (used for rankfiles and hostfiles; several nodes may share a host).
struct CostMatrix {
  int n = 0;
  std::vector<std::string> labels;
  std::vector<double> latency_us;
  std::vector<double> bandwidth_gbps;  // empty: latency only

  double latency(int i, int j) const { return latency_us[static_cast<size_t>(i) * n + j]; }
  // Cost of moving `bytes` from i to j, in microseconds.
  double Cost(int i, int j, double bytes) const {
    const size_t k = static_cast<size_t>(i) * n + j;
    double c = latency_us[k];
    if (!bandwidth_gbps.empty() && bytes > 0) c += bytes * 8e-3 / bandwidth_gbps[k];
    return c;
  }
  // n >= 1, sizes match, latencies in [0, kMaxLatencyUs] with a diagonal of 0, bandwidths
  // off the diagonal in [kMinBandwidthGbps, kMaxBandwidthGbps].
  absl::Status Validate() const;
};
// Bounds on a cost matrix's cells, so that every cost summed from them stays finite (1e308
// latencies printed inf costs): 1000 s, and 1 kbit/s to 1 Pbit/s.
inline constexpr double kMaxLatencyUs = 1e9;
inline constexpr double kMinBandwidthGbps = 1e-6;
inline constexpr double kMaxBandwidthGbps = 1e6;

// {"labels": [...], "latency_us": [[...], ...], "bandwidth_gbps": [[...], ...]} (the last one
// optional); rows must have n entries. Validated.
absl::StatusOr<CostMatrix> ParseCostMatrix(std::string_view json_text, std::string_view what);
std::string CostMatrixToJson(const CostMatrix& matrix);

// Latencies between the hosts of `topology`, as the seed's probes would see them: the path's
// one-way latency, doubled (a round trip), times a lognormal factor exp(noise * N(0,1)) per
// pair, symmetric; `tenant_fraction` of hosts (noisy neighbours) add tenant_extra_us to every
// pair they are in. Deterministic for a seed.
struct LatencyNoise {
  double noise = 0.1;
  double tenant_fraction = 0.05;
  double tenant_extra_us = 50;
  uint64_t seed = 1;
};
CostMatrix LatencyFromTopology(const Topology& topology, const LatencyNoise& noise);

}  // namespace plexus::netmodel
