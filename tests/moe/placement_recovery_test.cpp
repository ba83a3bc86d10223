#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <set>

#include "plexus/moe/allocation.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/recovery.hpp"

namespace plexus::moe {
namespace {

Placement Manual(int experts, std::vector<std::vector<int>> slots) {
  Placement p;
  p.num_nodes = static_cast<int>(slots.size());
  p.slots_per_node = static_cast<int>(slots[0].size());
  p.num_experts = experts;
  p.node_slots = std::move(slots);
  return p;
}

Placement Plan(const std::vector<double>& loads, int nodes, int slots, int f,
               PlacementPolicy policy = PlacementPolicy::kMro) {
  absl::StatusOr<Allocation> a = AllocateReplicas(loads, {nodes, slots, f});
  REQUIRE(a.ok());
  absl::StatusOr<Placement> p = PlaceExperts(policy, a->replicas, nodes, slots, a->ascending);
  REQUIRE(p.ok());
  REQUIRE(ValidatePlacement(*p, a->replicas).ok());
  return *p;
}

uint64_t Recovering(const Placement& p, int k) {
  std::vector<Placement> layers{p};
  absl::StatusOr<RecoveryResult> r = RecoveryEnumerate(layers, k);
  REQUIRE(r.ok());
  return r->recovering_sets;
}

TEST_CASE("Paper example: E=4, c=4, N=5, 3 failures", "[moe][recovery]") {
  const Placement mro = Plan({1, 1, 4, 4}, 5, 4, 2);  // replicas 2, 2, 8, 8
  std::vector<Placement> layers{mro};
  absl::StatusOr<RecoveryResult> closed = RecoveryClosedForm(layers, 3);
  REQUIRE(closed.ok());
  CHECK(closed->recovering_sets == 7);
  CHECK(closed->total_sets == 10);
  CHECK(Recovering(mro, 3) == 7);
  // The other plan: the two cold experts overlap on one node only.
  const Placement other =
      Manual(4, {{0, 2, 3, 2}, {0, 1, 2, 3}, {1, 2, 3, 3}, {2, 3, 2, 3}, {2, 3, 2, 3}});
  REQUIRE(ValidatePlacement(other, std::vector<int>{2, 2, 8, 8}).ok());
  CHECK(Recovering(other, 3) == 5);
}

TEST_CASE("Paper example: E=4, c=2, N=5, 3 failures", "[moe][recovery]") {
  const Placement mro = Plan({2, 2, 3, 3}, 5, 2, 2);  // replicas 2, 2, 3, 3
  CHECK(mro.ReplicaCounts() == std::vector<int>{2, 2, 3, 3});
  CHECK(10 - Recovering(mro, 3) == 4);  // failure probability 4/10
  const Placement other = Manual(4, {{0, 2}, {0, 1}, {1, 3}, {2, 3}, {2, 3}});
  REQUIRE(ValidatePlacement(other, std::vector<int>{2, 2, 3, 3}).ok());
  CHECK(10 - Recovering(other, 3) == 7);  // 7/10
}

TEST_CASE("MRO groups experts on consecutive node groups", "[moe][placement]") {
  const std::vector<double> loads = {0.02, 0.5, 0.03, 0.01, 0.3, 0.04, 0.05, 0.05};
  absl::StatusOr<Allocation> a = AllocateReplicas(loads, {10, 4, 2});
  REQUIRE(a.ok());
  absl::StatusOr<Placement> p =
      PlaceExperts(PlacementPolicy::kMro, a->replicas, 10, 4, a->ascending);
  REQUIRE(p.ok());
  const auto nodes = p->ExpertNodes();
  // The least-loaded expert of each group of 4 lives exactly on its group's nodes, and every
  // other expert of the group is on all of them.
  int first_node = 0;
  for (int g = 0; g < 2; ++g) {
    const int least = a->ascending[g * 4];
    const int size = a->replicas[least];
    std::vector<int> group(size);
    std::iota(group.begin(), group.end(), first_node);
    CHECK(nodes[least] == group);
    for (int i = 1; i < 4; ++i) {
      const auto& holder = nodes[a->ascending[g * 4 + i]];
      for (int n : group) CHECK(std::count(holder.begin(), holder.end(), n) == 1);
    }
    first_node += size;
  }
}

TEST_CASE("Spread and compact baselines", "[moe][placement]") {
  const std::vector<int> replicas = {2, 2, 3, 5};  // 12 slots = 4 nodes x 3
  absl::StatusOr<Placement> spread = PlaceExperts(PlacementPolicy::kSpread, replicas, 4, 3);
  REQUIRE(spread.ok());
  const auto nodes = spread->ExpertNodes();
  CHECK(nodes[0].size() == 2);
  CHECK(nodes[2].size() == 3);
  CHECK(nodes[3].size() == 4);  // as many distinct nodes as exist
  absl::StatusOr<Placement> compact = PlaceExperts(PlacementPolicy::kCompact, replicas, 4, 3);
  REQUIRE(compact.ok());
  CHECK(compact->node_slots[0] == std::vector<int>{0, 0, 1});
  CHECK(compact->ExpertNodes()[3] == std::vector<int>{2, 3});
  CHECK(PlaceExperts(PlacementPolicy::kMro, {2, 2}, 4, 3).status().code() ==
        absl::StatusCode::kInvalidArgument);  // 4 replicas for 12 slots
  CHECK(PlaceExperts(PlacementPolicy::kMro, {0, 12}, 4, 3).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ParsePlacementPolicy("nope").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("MRO matches the brute-force optimum on 500 tiny instances, every k",
          "[moe][recovery][bruteforce]") {
  // Theorem 1's setting: every group of c experts is full (c divides E).
  std::mt19937 rng(2024);
  int checked = 0;
  while (checked < 500) {
    const int nodes = 2 + rng() % 5;  // 2..6
    const int slots = 1 + rng() % 3;  // 1..3
    const int groups = 1 + rng() % std::max(1, std::min(nodes, 6 / slots));
    const int experts = groups * slots;
    if (experts > nodes * slots || experts > 6) continue;
    std::vector<double> loads(experts);
    for (double& l : loads) l = 1 + rng() % 30;
    const int f = 1 + rng() % 2;
    const Placement mro = Plan(loads, nodes, slots, f);
    absl::StatusOr<BruteForceResult> best =
        BruteForceOptimalRecovery(mro.ReplicaCounts(), nodes, slots);
    REQUIRE(best.ok());
    for (int k = 0; k <= nodes; ++k) {
      INFO("N=" << nodes << " c=" << slots << " E=" << experts << " k=" << k);
      CHECK(Recovering(mro, k) == best->best_recovering_sets[k]);
    }
    ++checked;
  }
}

TEST_CASE("Brute force finds better plans than MRO for a partial last group",
          "[moe][recovery][bruteforce]") {
  // E=3, c=2: the last group {e} has 5 replicas but only 3 nodes are left; overlapping
  // supports do better (documented limitation of MRO outside Theorem 1's setting).
  const std::vector<int> replicas = {3, 5, 4};
  absl::StatusOr<Placement> mro = PlaceExperts(PlacementPolicy::kMro, replicas, 6, 2);
  REQUIRE(mro.ok());
  absl::StatusOr<BruteForceResult> best = BruteForceOptimalRecovery(replicas, 6, 2);
  REQUIRE(best.ok());
  CHECK(Recovering(*mro, 3) == 18);
  CHECK(best->best_recovering_sets[3] == 19);
  CHECK(Recovering(best->best_placement[3], 3) == 19);
}

TEST_CASE("Closed form equals enumeration; Monte Carlo brackets it", "[moe][recovery]") {
  std::mt19937 rng(5);
  for (int it = 0; it < 40; ++it) {
    const int nodes = 4 + rng() % 16;
    const int slots = 2 + rng() % 4;
    const int experts = slots * (1 + rng() % std::min(4, nodes));
    std::vector<Placement> layers;
    for (int l = 0; l < 3; ++l) {
      std::vector<double> loads(experts);
      for (double& x : loads) x = std::exp((rng() % 100) / 20.0);
      layers.push_back(Plan(loads, nodes, slots, 2));
    }
    const int k = rng() % (nodes + 1);
    absl::StatusOr<RecoveryResult> exact = RecoveryEnumerate(layers, k);
    REQUIRE(exact.ok());
    absl::StatusOr<RecoveryResult> closed = RecoveryClosedForm(layers, k);
    if (closed.ok()) {
      CHECK(closed->recovering_sets == exact->recovering_sets);
    } else {
      CHECK(closed.status().code() == absl::StatusCode::kFailedPrecondition);
    }
    absl::StatusOr<RecoveryResult> mc = RecoveryMonteCarlo(layers, k, 20000, 9, 0.999);
    REQUIRE(mc.ok());
    CHECK(mc->ci_low <= exact->probability + 1e-12);
    CHECK(mc->ci_high >= exact->probability - 1e-12);
  }
}

TEST_CASE("Closed form scales to large clusters", "[moe][recovery]") {
  std::vector<double> loads(64);
  for (size_t e = 0; e < loads.size(); ++e) loads[e] = 1.0 + static_cast<double>(e % 7);
  std::vector<Placement> layers{Plan(loads, 200, 2, 2)};
  absl::StatusOr<RecoveryResult> closed = RecoveryClosedForm(layers, 20);
  REQUIRE(closed.ok());
  CHECK(closed->exact);
  absl::StatusOr<RecoveryResult> mc = RecoveryMonteCarlo(layers, 20, 40000, 3, 0.999);
  REQUIRE(mc.ok());
  CHECK(closed->probability >= mc->ci_low);
  CHECK(closed->probability <= mc->ci_high);
  absl::StatusOr<RecoveryResult> automatic = RecoveryProbability(layers, 20);
  REQUIRE(automatic.ok());
  CHECK(automatic->method == "closed_form");
}

TEST_CASE("Recovery rejects bad input and overlapping supports", "[moe][recovery]") {
  std::vector<Placement> layers{Plan({1, 2, 3, 4}, 5, 2, 2)};
  CHECK(RecoveryClosedForm(layers, 6).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(RecoveryEnumerate(layers, -1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(RecoveryMonteCarlo(layers, 2, 0).status().code() == absl::StatusCode::kInvalidArgument);
  // A ring: every expert's two replicas overlap its neighbours'.
  std::vector<Placement> ring{Manual(4, {{0, 1}, {1, 2}, {2, 3}, {3, 0}})};
  CHECK(RecoveryClosedForm(ring, 2).status().code() == absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<RecoveryResult> automatic = RecoveryProbability(ring, 2);
  REQUIRE(automatic.ok());
  CHECK(automatic->method == "enumeration");
  CHECK(automatic->recovering_sets == 2);  // only {0,2} and {1,3} spare every expert
  CHECK(BruteForceOptimalRecovery({2, 2}, 9, 1).status().code() ==
        absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace plexus::moe
