// kBest and ExactPlacement where Lazarus's Theorem 1 does not hold (c does not divide E).
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "plexus/moe/placement.hpp"
#include "plexus/moe/placement_quality.hpp"
#include "plexus/moe/recovery.hpp"

namespace plexus::moe {
namespace {

uint64_t Recovering(const Placement& p, int k) {
  std::vector<Placement> layers{p};
  absl::StatusOr<RecoveryResult> r = RecoveryEnumerate(layers, k);
  REQUIRE(r.ok());
  return r->recovering_sets;
}

Placement Place(PlacementPolicy policy, const std::vector<int>& replicas, int nodes, int slots,
                int k) {
  absl::StatusOr<Placement> p = PlaceExperts(policy, replicas, nodes, slots, {}, k);
  REQUIRE(p.ok());
  REQUIRE(ValidatePlacement(*p, replicas).ok());
  return *p;
}

TEST_CASE("N=3, c=2, E=3, replicas (2,2,2), one failure: best recovers always, MRO does not",
          "[moe][placement]") {
  const std::vector<int> replicas{2, 2, 2};
  CHECK(Recovering(Place(PlacementPolicy::kMro, replicas, 3, 2, 1), 1) == 2);  // 2/3
  CHECK(Recovering(Place(PlacementPolicy::kSpread, replicas, 3, 2, 1), 1) == 3);
  CHECK(Recovering(Place(PlacementPolicy::kBest, replicas, 3, 2, 1), 1) == 3);  // 1
  CHECK(Recovering(Place(PlacementPolicy::kExact, replicas, 3, 2, 1), 1) == 3);
}

TEST_CASE("best keeps MRO where Theorem 1 holds", "[moe][placement]") {
  // c = 2 divides E = 4: MRO is optimal for every k, and best returns it unchanged.
  const std::vector<int> replicas{2, 2, 3, 3};
  const Placement mro = Place(PlacementPolicy::kMro, replicas, 5, 2, 1);
  for (int k = 1; k < 5; ++k) {
    CHECK(Place(PlacementPolicy::kBest, replicas, 5, 2, k).node_slots == mro.node_slots);
  }
}

TEST_CASE("exact placement equals plain brute force on the tiniest instances", "[moe][placement]") {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int nodes = std::uniform_int_distribution<int>(2, 5)(rng);
    const int slots = std::uniform_int_distribution<int>(1, 3)(rng);
    const int total = nodes * slots;
    const int experts = std::uniform_int_distribution<int>(1, std::min(total, 6))(rng);
    std::vector<int> replicas(experts, 1);
    for (int extra = total - experts; extra > 0; --extra) {
      ++replicas[std::uniform_int_distribution<int>(0, experts - 1)(rng)];
    }
    absl::StatusOr<BruteForceResult> brute = BruteForceOptimalRecovery(replicas, nodes, slots);
    REQUIRE(brute.ok());
    for (int k = 0; k <= nodes; ++k) {
      INFO("N=" << nodes << " c=" << slots << " E=" << experts << " k=" << k);
      absl::StatusOr<Placement> exact = ExactPlacement(replicas, nodes, slots, k);
      REQUIRE(exact.ok());
      REQUIRE(ValidatePlacement(*exact, replicas).ok());
      CHECK(Recovering(*exact, k) == brute->best_recovering_sets[k]);
      ++checked;
    }
  }
  CHECK(checked > 150);
}

TEST_CASE("exact placement refuses what it cannot search", "[moe][placement]") {
  std::vector<int> replicas(13, 2);
  absl::StatusOr<Placement> big = ExactPlacement(replicas, 13, 2, 1);
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(big.status().message()), Catch::Contains("at most 12 nodes"));
  absl::StatusOr<Placement> budget = ExactPlacement({1, 1, 1, 2, 2, 2, 3, 3, 3}, 6, 3, 2, 3);
  CHECK(budget.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ExactPlacement({2, 2, 2}, 3, 2, 4).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ExactPlacement({2, 2}, 3, 2, 1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(PlaceExperts(PlacementPolicy::kBest, {2, 2, 2}, 3, 2, {}, -1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("best is never below spread or compact and optimal on >= 99% of tiny instances",
          "[moe][placement]") {
  PlacementQualityOptions options;
  options.seed = 14;
  options.instances_per_class = 150;
  absl::StatusOr<std::vector<PlacementQualityRow>> rows = PlacementQualitySweep(options);
  REQUIRE(rows.ok());
  int classes = 0;
  for (const PlacementQualityRow& row : *rows) {
    INFO(row.shape << " k=" << row.failures << ": " << row.best_optimal << "/" << row.cases
                   << " optimal, MRO " << row.mro_optimal);
    CHECK(row.best_below_baseline == 0);
    CHECK(row.best_optimal <= row.cases);
    if (row.failures == -1) {
      ++classes;
      CHECK(row.cases >= 300);
      CHECK(row.best_fraction() >= 0.99);
    }
  }
  CHECK(classes == 2);
}

TEST_CASE("larger placement-quality sweep", "[.sweep]") {
  PlacementQualityOptions options;
  options.instances_per_class = 2000;
  absl::StatusOr<std::vector<PlacementQualityRow>> rows = PlacementQualitySweep(options);
  REQUIRE(rows.ok());
  for (const PlacementQualityRow& row : *rows) {
    INFO(row.shape << " k=" << row.failures);
    CHECK(row.best_below_baseline == 0);
    if (row.failures == -1) CHECK(row.best_fraction() >= 0.99);
  }
}

}  // namespace
}  // namespace plexus::moe
