// Cloud Collectives rank reordering: cost models of collective algorithms over a cost matrix
// (plexus/netmodel/topology.hpp), each a schedule priced (plexus/netmodel/schedule.hpp), and a
// search for the order of nodes that minimises one: simulated annealing, then branch and bound that
// proves the result optimal for small n. docs/netmodel.md, "Rank reordering".
//
//   CostMatrix c = ...;                       // ProbeLatency(...) or ParseCostMatrix(...)
//   auto r = Reorder(c, {.model = CostModel::kRing});
//   options.ring_order = r->order;            // CommunicatorOptions: rank order[i] at position i
//   std::string rankfile = FormatRankfile(c, r->order);   // or relaunch with these ranks
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/netmodel/schedule.hpp"
#include "plexus/netmodel/topology.hpp"

namespace plexus::netmodel {

// A cost model is a schedule (CostModelSchedule) and the rule that prices it (CostModelPricing).
enum class CostModel : uint8_t {
  kRing,              // RingAllreduceSchedule, kLinks: the sum of the n hop costs around the ring
  kHalvingDoubling,   // HalvingDoublingSchedule (far first), kRounds: the slowest pair per round
  kDoubleBinaryTree,  // DoubleBinaryTreeSchedule's broadcast, kChains: the dearest root-to-leaf
                      // path of either in-order binary tree
  kBCube,             // BCubeSchedule, kRounds: one round per base-B digit, each way
};
std::string_view CostModelName(CostModel model);
// "ring", "halving-doubling" (or "hd"), "double-binary-tree" (or "dbt"), "bcube".
absl::StatusOr<CostModel> ParseCostModel(std::string_view name);

struct CostOptions {
  CostModel model = CostModel::kRing;
  // The collective's buffer (bytes); only matters when the matrix has bandwidths.
  double bytes = 100e6;
  int bcube_base = 4;  // kBCube: n must be a power of it
};

// The schedule a model prices over n positions, and how it prices it. InvalidArgument when n < 1,
// bytes < 0, or BCube's n is not a power of its base.
absl::StatusOr<Schedule> CostModelSchedule(int n, const CostOptions& options);
Pricing CostModelPricing(CostModel model);

// The cost (microseconds) of running the model with node order[p] at position p (order is a
// permutation of 0..n-1). InvalidArgument when order is not a permutation of the matrix's nodes,
// or BCube's n is not a power of its base.
absl::StatusOr<double> OrderCost(const CostMatrix& matrix, const std::vector<int>& order,
                                 const CostOptions& options);

struct ReorderOptions {
  CostOptions cost;
  uint64_t seed = 1;
  // Simulated annealing: independent runs (the best is kept) and moves per run (0 = scaled with
  // n and the model's evaluation cost).
  int anneal_runs = 4;
  int64_t anneal_moves = 0;
  // Scale of the starting temperature (the mean cost increase of a random move, accepted with
  // probability 1/e); 0 accepts no increase: a greedy descent (random restarts of it are the
  // benchmark's baseline).
  double anneal_temperature = 1.0;
  // Ring: end each run with 2-opt descent to a local minimum (symmetric matrices).
  bool polish = true;
  // Branch and bound runs after annealing when n <= exact_max_n, within exact_node_limit
  // search nodes and time_limit; the result is proven optimal when it finishes.
  int exact_max_n = 12;
  int64_t exact_node_limit = 50'000'000;
  // Stops annealing, then branch and bound, once this much time has passed in all (the best
  // order so far is kept; not proven optimal when branch and bound is cut short).
  absl::Duration time_limit = absl::Seconds(60);
  // Called now and then with a fraction done (0..1) and the best cost so far; may be empty.
  std::function<void(double fraction, double best_cost)> progress = nullptr;
};

struct ReorderResult {
  std::vector<int> order;  // position -> node
  double cost = 0;         // OrderCost of order
  double identity_cost = 0;
  bool proven_optimal = false;  // branch and bound finished: no order costs less
  int64_t anneal_moves = 0;
  int64_t exact_nodes = 0;
};

absl::StatusOr<ReorderResult> Reorder(const CostMatrix& matrix, const ReorderOptions& options);

// Exhaustive search over all n! orders (tests, n <= 11): the minimum cost and an order reaching it.
absl::StatusOr<ReorderResult> BruteForceReorder(const CostMatrix& matrix,
                                                const CostOptions& options);

// Launcher inputs for order (position i -> node order[i], whose host is matrix.labels[order[i]]):
// Open MPI rankfile: "rank <i>=<host> slot=<k>" (k counts ranks placed on that host so far);
std::string FormatRankfile(const CostMatrix& matrix, const std::vector<int>& order);
// Open MPI hostfile: "<host> slots=1" per rank in order (keeps the order with one rank per host;
// use the rankfile when hosts repeat);
std::string FormatHostfile(const CostMatrix& matrix, const std::vector<int>& order);
// torchrun / plexus-run: the RANK each node takes, one line per node in matrix order:
// "<host> RANK=<i>" (with one node per host and --nproc_per_node=1, torchrun's --node_rank=<i>).
std::string FormatRankAssignment(const CostMatrix& matrix, const std::vector<int>& order);

}  // namespace plexus::netmodel
