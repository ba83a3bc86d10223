// A flow-level network simulator: transfers with dependencies (a DAG) run over a topology of
// hosts, racks with oversubscribed uplinks, or a leaf/spine (Clos) fabric; the links are shared
// max-min fairly (progressive filling), recomputed at every flow start and completion (event
// driven). Used to count rounds, bytes on the wire and cross-rack bytes of an allreduce
// schedule, and to estimate its completion time on a fabric without running it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::collectives::sim {

// One direction of a cable (or of a NIC): capacity in bytes per second, propagation latency.
struct Link {
  double bytes_per_s = 0;
  double latency_s = 0;
  bool cross_rack = false;  // above the top-of-rack switch (rack uplinks, spine links)
  std::string name;         // "host3.up", "rack1.down", "leaf0-spine2"
};

// Hosts on racks of `hosts_per_rack`; every host has a NIC of `host_bytes_per_s` each way;
// every rack's uplink to a non-blocking core carries hosts_per_rack * host_bytes_per_s /
// oversubscription each way.
struct RackSpec {
  int racks = 1;
  int hosts_per_rack = 1;
  double host_bytes_per_s = 1.25e9;  // 10 Gbit/s
  double oversubscription = 1;       // >= 1: uplink = rack's host bandwidth / this
  double host_latency_s = 5e-6;      // NIC to top-of-rack switch, each way
  double core_latency_s = 20e-6;     // top-of-rack to core, each way
};

// Leaf/spine: `leaves` leaf switches of `hosts_per_leaf` hosts each, every leaf cabled to every
// spine; a leaf's total uplink is hosts_per_leaf * host_bytes_per_s / oversubscription, split
// evenly over the spines. A flow between leaves takes the spine (src + dst) % spines (a fixed
// ECMP hash).
struct ClosSpec {
  int leaves = 1;
  int spines = 1;
  int hosts_per_leaf = 1;
  double host_bytes_per_s = 1.25e9;
  double oversubscription = 1;
  double host_latency_s = 5e-6;
  double spine_latency_s = 20e-6;
};

class Topology {
 public:
  static absl::StatusOr<Topology> Racks(const RackSpec& spec);
  static absl::StatusOr<Topology> Clos(const ClosSpec& spec);

  int hosts() const { return static_cast<int>(rack_of_.size()); }
  int racks() const { return racks_; }
  int RackOf(int host) const { return rack_of_[host]; }
  const std::vector<int>& rack_of() const { return rack_of_; }
  const std::vector<Link>& links() const { return links_; }

  // The links a flow from `src` to `dst` crosses (empty when src == dst).
  std::vector<int> Route(int src, int dst) const;
  // Sum of the route's propagation latencies.
  double PathLatency(int src, int dst) const;

  // Changes one host's NIC (a parameter box with ten NICs, a throttled VM).
  absl::Status SetHostBandwidth(int host, double up_bytes_per_s, double down_bytes_per_s);
  // Adds `extra_s` to the latency of the host's NIC in both directions (a noisy neighbour).
  absl::Status AddHostLatency(int host, double extra_s);

 private:
  int racks_ = 0;
  int spines_ = 0;  // 0: racks with a non-blocking core
  int hosts_per_rack_ = 0;
  std::vector<int> rack_of_;
  std::vector<Link> links_;
};

// One transfer of `bytes` from host `src` to host `dst`, started when every transfer in
// `after` (indices of EARLIER transfers) has finished. src == dst is a local step (a node that
// is its own parent in a tree): it takes no time and no link, and is counted apart.
struct Transfer {
  int src = 0;
  int dst = 0;
  double bytes = 0;
  std::vector<int> after;
};

struct Schedule {
  std::string name;
  std::vector<Transfer> transfers;
};

// Checks hosts in [0, hosts), dependencies on earlier transfers only, bytes finite and >= 0.
// Errors name the transfer.
absl::Status ValidateSchedule(const Schedule& schedule, int hosts);

struct Counts {
  int rounds = 0;               // longest dependency chain, in transfers (local steps count)
  double wire_bytes = 0;        // sum over transfers with src != dst
  double logical_bytes = 0;     // sum over all transfers, local ones included
  double cross_rack_bytes = 0;  // sum over transfers whose ends are on different racks
  int64_t transfers = 0;        // with src != dst
};

// Counts a schedule; `rack_of[h]` is host h's rack. The schedule must be valid.
Counts Count(const Schedule& schedule, std::span<const int> rack_of);

struct SimResult {
  double makespan_s = 0;
  std::vector<double> finish_s;      // per transfer
  std::vector<double> link_bytes;    // per link of the topology
  double cross_rack_link_bytes = 0;  // bytes carried by links marked cross_rack
  int64_t events = 0;
};

// Runs the schedule on the topology: a transfer starts once its dependencies are done plus its
// path latency, then shares every link on its route max-min fairly with the other active
// transfers until its bytes are through.
absl::StatusOr<SimResult> Simulate(const Topology& topology, const Schedule& schedule);

}  // namespace plexus::collectives::sim
