// Hierarchical reduction across racks (PBox, dissertation ch. 2) and the dissertation's Table
// 4.1 (rounds, bytes on the wire and cross-rack bytes of allreduce algorithms), counted on the
// flow simulator's schedules.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/flow_sim.hpp"

namespace plexus::aggregation {

// How the per-rack boxes exchange their rack sums.
enum class CrossRack { kShardedPs, kRing };

// The inequality's inputs: N workers and one parameter box per rack, R racks; bandwidths in
// bytes per second (B_PBox: a box's NICs together; B_Core: a rack's share of the core, i.e. its
// uplink; B_Wkr: a worker's NIC).
struct HierarchyModel {
  int workers_per_rack = 1;  // N
  int racks = 1;             // R
  double pbox_bytes_per_s = 0;
  double core_bytes_per_s = 0;
  double worker_bytes_per_s = 0;
  CrossRack cross = CrossRack::kShardedPs;
};

// Times per byte of model (seconds per byte), as the seed's model writes them:
//   flat      = N (R-1) / (R B_Core)                (every worker's shards for other racks)
//   local     = max(N / B_PBox, 1 / B_Wkr)          (the rack's aggregation, racks in parallel)
//   cross (C) = (R-1) / (R B_bn), B_bn = min(B_PBox, B_Core)  (sharded; the seed uses the same
//                                                   expression, "≈", for a ring of racks)
// The hierarchy pays when flat > local + C.
struct HierarchyChoice {
  double flat_s_per_byte = 0;
  double local_s_per_byte = 0;
  double cross_s_per_byte = 0;
  bool use_hierarchy = false;
  std::string explanation;  // the inequality with numbers
};

absl::StatusOr<HierarchyChoice> ChooseHierarchy(const HierarchyModel& model);

// Hosts of a PBox deployment: per rack, its workers and its box.
struct PboxLayout {
  std::vector<std::vector<int>> workers;
  std::vector<int> pbox;
};

// The layout on Topology::Racks with hosts_per_rack = N + 1: the last host of a rack is its box.
PboxLayout RackPboxLayout(int racks, int workers_per_rack);

// Without the hierarchy: the boxes form one sharded PS; every worker pushes 1/R of its buffer
// to every rack's box and pulls the reduced shard back.
absl::StatusOr<netmodel::sim::Schedule> PboxFlatSchedule(const PboxLayout& layout, double bytes);

// PBox's hierarchical reduction: workers push to their rack's box; the boxes exchange rack sums
// (a sharded PS among the boxes, or a ring allreduce); each box optimizes and sends the result
// to its workers.
absl::StatusOr<netmodel::sim::Schedule> PboxHierarchicalSchedule(const PboxLayout& layout,
                                                                 double bytes, CrossRack cross);

// One row of Table 4.1 for NC nodes on C racks of N, S bytes per node: the seed's formulas and
// values next to what the flow schedule counts with ranks laid out rack by rack.
struct Table41Row {
  std::string name;
  std::string rounds_formula, bytes_formula, cross_rack_formula;  // as printed in the seed
  double seed_rounds = 0, seed_bytes = 0, seed_cross_rack_bytes = 0;
  bool available = true;  // false: N, C do not fit the algorithm (note says why)
  netmodel::sim::Counts measured;
  std::string note;  // where a count differs from the seed's formula, and why
};

// N >= 1, C >= 2 (the seed's cross-rack formulas assume at least two racks), S > 0. The 2-level
// row uses BuildTwoLevelPlan with the racks as groups and N chunks.
absl::StatusOr<std::vector<Table41Row>> ReproduceTable41(int n, int c, double s);

// The rows as a text table (bytes in units of S): per column the seed's formula, the seed's value
// and the counted one, then the notes. plexus-agg-sim and plexus-bench-aggregation print this.
std::string FormatTable41(const std::vector<Table41Row>& rows, int n, int c, double s);

}  // namespace plexus::aggregation
