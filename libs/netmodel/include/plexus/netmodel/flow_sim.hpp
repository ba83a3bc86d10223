// A flow-level network simulator: transfers with dependencies (a DAG) run over a topology of
// hosts, racks with oversubscribed uplinks, or a leaf/spine (Clos) fabric; the links are shared
// max-min fairly (progressive filling), recomputed at every flow start and completion (event
// driven). Used to count rounds, bytes on the wire and cross-rack bytes of an allreduce
// schedule, and to estimate its completion time on a fabric without running it.
//
// Endpoints: a schedule's "hosts" are the topology's endpoints. On a multi-NIC Clos fabric
// (ClosSpec::nics_per_host > 1) an endpoint is one NIC with its GPU; endpoints of one machine
// talk over the machine's internal fabric (NVLink), not the network. Equal-cost routes: a
// transfer between leaves may name its spine (`Transfer::path`, chosen by flow assignment,
// plexus/netmodel/flow_assign.hpp); without one it takes the topology's fixed hash.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/netmodel/schedule.hpp"
#include "plexus/netmodel/topology.hpp"

namespace plexus::netmodel::sim {

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
// spine; every host has `nics_per_host` NICs of host_bytes_per_s each way (one endpoint per NIC:
// endpoint e is NIC e % nics_per_host of host e / nics_per_host). A leaf's total uplink is
// hosts_per_leaf * nics_per_host * host_bytes_per_s / oversubscription, split evenly over the
// spines (one cable per leaf and spine). A flow between leaves has `spines` equal-cost routes;
// without an assigned one it takes spine (src + dst) % spines (a fixed hash). Transfers between
// NICs of one host cross `nvlink_bytes_per_s` links (one per endpoint and direction), or no link
// at all when that is 0 (the machine's fabric is never the bottleneck).
struct ClosSpec {
  int leaves = 1;
  int spines = 1;
  int hosts_per_leaf = 1;
  double host_bytes_per_s = 1.25e9;
  double oversubscription = 1;
  double host_latency_s = 5e-6;
  double spine_latency_s = 20e-6;
  int nics_per_host = 1;
  double nvlink_bytes_per_s = 0;
};

class Network {
 public:
  static absl::StatusOr<Network> Racks(const RackSpec& spec);
  static absl::StatusOr<Network> Clos(const ClosSpec& spec);
  // The three-level tree of a topology model (hosts in racks in pods under a non-blocking core;
  // plexus/netmodel/topology.hpp): every host, rack and pod uplink a link per direction
  // (Gbps and one-way µs converted to bytes/s and s). One route per pair. Validates the model.
  static absl::StatusOr<Network> Tree(const ::plexus::netmodel::Topology& model);

  // Endpoints (hosts, or NICs of multi-NIC hosts): the range of a schedule's src and dst.
  int hosts() const { return static_cast<int>(rack_of_.size()); }
  int racks() const { return racks_; }
  int spines() const { return spines_; }
  int RackOf(int host) const { return rack_of_[host]; }
  // The machine an endpoint belongs to (itself unless the Clos has several NICs per host).
  int MachineOf(int host) const { return host / nics_per_host_; }
  int nics_per_host() const { return nics_per_host_; }
  const std::vector<int>& rack_of() const { return rack_of_; }
  const std::vector<Link>& links() const { return links_; }

  // Equal-cost routes between two endpoints: the spines for a pair on different leaves of a
  // Clos, else 1 (0 when src == dst).
  int Paths(int src, int dst) const;
  // The links a flow from `src` to `dst` crosses on route `path` (in [0, Paths(src, dst)), or
  // -1 for the fixed hash); empty when src == dst or they are NICs of one host without NVLink
  // links. `path` must be in range.
  std::vector<int> Route(int src, int dst, int path = -1) const;
  // Sum of the route's propagation latencies (every route of a pair has the same).
  double PathLatency(int src, int dst) const;

  // Changes one host's NIC (a parameter box with ten NICs, a throttled VM).
  absl::Status SetHostBandwidth(int host, double up_bytes_per_s, double down_bytes_per_s);
  // Adds `extra_s` to the latency of the host's NIC in both directions (a noisy neighbour).
  absl::Status AddHostLatency(int host, double extra_s);

 private:
  int racks_ = 0;
  int spines_ = 0;  // 0: racks with a non-blocking core
  int hosts_per_rack_ = 0;
  int nics_per_host_ = 1;
  int nvlink_base_ = -1;          // first NVLink link (endpoint e: base + 2e up, + 1 down), or -1
  std::vector<int> pod_of_rack_;  // Tree(): rack -> pod; empty otherwise
  std::vector<int> rack_of_;
  std::vector<Link> links_;
};

// A schedule's transfers name endpoints here (schedule.hpp; PlaceSchedule puts hosts at a
// schedule's positions); src == dst is a local step: it takes no time and no link, and is
// counted apart. `Transfer::path` picks an equal-cost route (Network::Paths).
using ::plexus::netmodel::Schedule;
using ::plexus::netmodel::Transfer;

// Checks hosts in [0, hosts), dependencies on earlier transfers only, bytes finite and >= 0,
// and (with a topology) paths in range. Errors name the transfer.
absl::Status ValidateSchedule(const Schedule& schedule, int hosts);
absl::Status ValidateSchedule(const Schedule& schedule, const Network& network);

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
absl::StatusOr<SimResult> Simulate(const Network& network, const Schedule& schedule);

// Max-min fair rates of flows that each cross links a given number of times and move at one
// rate on all of them (a pipelined ring channel: every hop carries the same bytes, the slowest
// paces the rest). `uses[f]` lists (link, times) for flow f; a link's capacity is shared so
// that sum over flows of rate * times <= capacity, by progressive filling (every connection on
// a link counts once: per-flow fairness). A flow with no link gets +infinity.
std::vector<double> MaxMinRates(const Network& network,
                                const std::vector<std::vector<std::pair<int, int>>>& uses);

// One hop of a coupled flow: a connection from src to dst on equal-cost route `path`.
struct Hop {
  int src = 0;
  int dst = 0;
  int path = -1;
};

// A pipelined collective channel as one fluid flow: every hop carries `bytes` at the same rate.
// It becomes active at start_s + latency_s and finishes when its bytes are through.
struct CoupledFlow {
  std::vector<Hop> hops;
  double bytes = 0;
  double start_s = 0;
  double latency_s = 0;
};

struct CoupledResult {
  double makespan_s = 0;
  std::vector<double> finish_s;      // per flow
  std::vector<double> initial_rate;  // bytes/s each flow gets while every flow is active
  int64_t events = 0;
};

// The links a coupled flow crosses and how many of its hops cross each (sorted by link); hops
// must be valid (SimulateCoupled checks them).
std::vector<std::pair<int, int>> LinkUses(const Network& network, const CoupledFlow& flow);

// Event-driven: rates are recomputed (MaxMinRates) whenever a flow starts or finishes.
absl::StatusOr<CoupledResult> SimulateCoupled(const Network& network,
                                              const std::vector<CoupledFlow>& flows);

// The coupled flow of one channel of a ring allreduce over `ring` (endpoints in ring order,
// hop i from ring[i] to ring[i+1], on route paths[i] when i < paths.size(), else the hash): each
// hop carries 2(n-1)/n of `bytes`, and the 2(n-1) steps each wait out the slowest hop's latency.
CoupledFlow RingAllreduceFlow(const Network& network, std::span<const int> ring, double bytes,
                              std::span<const int> paths = {});

}  // namespace plexus::netmodel::sim
