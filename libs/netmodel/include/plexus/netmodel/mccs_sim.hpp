// Experiments on the flow-level simulator (flow_sim.hpp), reproducing two published results
// (docs/netmodel.md, "Reproductions"):
//  - MCCS's 768-GPU table (seed 000 §4.6.5): jobs of 16 or 32 GPUs on a leaf/spine fabric with
//    8 NICs per host, ring allreduce with a random ring, the locality-aware optimal ring (OR,
//    ECMP routes) and OR with fair flow assignment (FFA), under random and compact placement;
//  - Cloud Collectives' spread of random orders (seed 001 ch. 5, seed 002): ring allreduce times
//    of random orders on an oversubscribed three-level fabric, against the reordered order, and
//    the rank correlation between the cost models and the simulator.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/flow_sim.hpp"
#include "plexus/netmodel/topology.hpp"

namespace plexus::netmodel::sim {

// Spearman's rank correlation of x and y (ties get their average rank; Pearson over ranks).
// InvalidArgument when the sizes differ or are < 2, or a side is constant.
absl::StatusOr<double> Spearman(std::span<const double> x, std::span<const double> y);

enum class Placement : uint8_t { kRandom, kCompact };
std::string_view PlacementName(Placement placement);

// The three columns of the table.
enum class RingStrategy : uint8_t { kRandomRing, kOptimalRing, kOptimalRingFfa };
inline constexpr int kRingStrategies = 3;
std::string_view RingStrategyName(RingStrategy strategy);

struct MccsSpec {
  // 24 leaves x 4 hosts x 8 NICs = 768 GPUs, 16 spines; 200 Gbps NICs and leaf-spine cables
  // (leaf uplink 16 x 200 = 3200 Gbps for 32 x 200 Gbps of NICs: oversubscription 2).
  ClosSpec fabric = {.leaves = 24,
                     .spines = 16,
                     .hosts_per_leaf = 4,
                     .host_bytes_per_s = 25e9,
                     .oversubscription = 2,
                     .host_latency_s = 1e-6,
                     .spine_latency_s = 1e-6,
                     .nics_per_host = 8,
                     .nvlink_bytes_per_s = 0};
  std::vector<int> job_sizes = {16, 32};  // GPUs, drawn with equal probability
  double load = 1.0;     // fraction of the GPUs handed to jobs (the last job may not fit)
  double bytes = 100e6;  // allreduce buffer (ResNet-50's 100 MB)
  int channels = 0;      // rings per job; 0: one per equal-cost route (the spines), as the seed
  // Steady: every job trains, so all allreduces overlap for good (time = bytes / the max-min
  // rate with every job active). Once: all start together and speed up as others finish.
  bool steady = true;
  int runs = 5;
  uint64_t seed = 1;
};

struct MccsJob {
  int run = 0;
  int gpus = 0;
  int hosts = 0;  // machines it spans
  int racks = 0;
  std::array<double, kRingStrategies> seconds{};       // allreduce time per strategy
  std::array<int, kRingStrategies> cross_rack_hops{};  // per channel, over its ring
};

// Places jobs (random: GPUs drawn uniformly from the free ones; compact: first fit in rack, host,
// GPU order, so a job fills a rack before the next), builds every job's rings per strategy,
// assigns routes (ECMP hashes per connection for the random ring and OR; FFA over every job's
// connections for OR+FFA, demand = the NIC's rate over the connections leaving it) and
// simulates. One entry per job and run.
absl::StatusOr<std::vector<MccsJob>> RunMccs(const MccsSpec& spec, Placement placement);

struct SpreadSpec {
  FabricSpec fabric;  // 16 pods x 4 racks x 8 hosts = 512 hosts by default
  // Instead: a leaf/spine fabric whose cross-leaf connections ECMP hashes onto spines (32 leaves
  // x 16 hosts = 512, 8 spines, 25 Gbps NICs, oversubscription 2).
  bool clos = false;
  ClosSpec clos_fabric = {.leaves = 32,
                          .spines = 8,
                          .hosts_per_leaf = 16,
                          .host_bytes_per_s = 25e9 / 8,
                          .oversubscription = 2,
                          .host_latency_s = 2e-6,
                          .spine_latency_s = 10e-6,
                          .nics_per_host = 1,
                          .nvlink_bytes_per_s = 0};
  double noise = 0.1;
  int orders = 500;              // random orders timed
  int correlation_orders = 100;  // orders spanning optimal .. random for the rank correlation
  double bytes = 100e6;
  uint64_t seed = 1;
  double reorder_seconds = 60;  // time limit of the reordering
};

struct SpreadResult {
  int n = 0;
  std::vector<double> random_ms;  // ring allreduce time of each random order
  double reordered_ms = 0;
  double reordered_cost_us = 0;
  double median_random_cost_us = 0;
  // Spearman between the simulator's times and the ring cost over the latency matrix, and over
  // the latency + fair-share bandwidth matrix: on the orders spanning optimal .. random, and on
  // the random orders alone.
  double spearman_latency = 0;
  double spearman_bandwidth = 0;
  double spearman_latency_random = 0;
  double spearman_bandwidth_random = 0;
};

// Hosts of the generated fabric handed out in a random order (a cloud's VM list); the reorderer
// sees only the noisy latency matrix (LatencyFromTopology, or path round trips times a lognormal
// factor on a Clos), the simulator the fabric (each hop one connection, ECMP-hashed on a Clos).
absl::StatusOr<SpreadResult> RunSpread(const SpreadSpec& spec);

// The fair-share bandwidth matrix of a topology model: for each pair the least, over the links
// of its path, of capacity / hosts below the link (what a pair can expect when every host is
// busy); latency as LatencyFromTopology's without noise.
CostMatrix FairShareMatrix(const ::plexus::netmodel::Topology& model);

}  // namespace plexus::netmodel::sim
