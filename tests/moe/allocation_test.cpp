#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "plexus/moe/allocation.hpp"

namespace plexus::moe {
namespace {

TEST_CASE("Allocation follows Eq. 6.1 on a worked example", "[moe][allocation]") {
  // Ascending loads 1,1,4,4 over 5 nodes x 4 slots: 1/10*20 = 2, 1/9*18 = 2, 4/8*16 = 8, rest 8.
  const std::vector<double> loads = {4, 1, 4, 1};
  absl::StatusOr<Allocation> a = AllocateReplicas(loads, {5, 4, 2});
  REQUIRE(a.ok());
  CHECK(a->replicas == std::vector<int>{8, 2, 8, 2});
  CHECK(a->ascending == std::vector<int>{1, 3, 0, 2});
  CHECK_FALSE(a->min_replicas_lowered);
}

TEST_CASE("Allocation raises cold experts to f", "[moe][allocation]") {
  absl::StatusOr<Allocation> a = AllocateReplicas({0.01, 0.01, 0.49, 0.49}, {10, 6, 2});
  REQUIRE(a.ok());
  CHECK(a->replicas[0] == 2);
  CHECK(a->replicas[1] == 2);
  CHECK(a->replicas[2] + a->replicas[3] == 56);
}

TEST_CASE("Allocation lowers f when slots run short and says so", "[moe][allocation]") {
  // 6 experts, 2 nodes x 4 slots = 8 slots: f = 2 would need 12; lowered to floor(8/6) = 1.
  absl::StatusOr<Allocation> a = AllocateReplicas({1, 1, 1, 1, 1, 10}, {2, 4, 2});
  REQUIRE(a.ok());
  CHECK(a->min_replicas_lowered);
  CHECK(a->min_replicas == 1);
  CHECK(std::accumulate(a->replicas.begin(), a->replicas.end(), 0) == 8);
  for (int r : a->replicas) CHECK(r >= 1);
}

TEST_CASE("Allocation invariants hold on random inputs", "[moe][allocation]") {
  std::mt19937 rng(11);
  for (int it = 0; it < 2000; ++it) {
    const int nodes = 1 + rng() % 64;
    const int slots = 1 + rng() % 8;
    const int experts = 1 + rng() % std::min(nodes * slots, 96);
    const int f = 1 + rng() % 3;
    std::vector<double> loads(experts);
    for (double& l : loads) l = (rng() % 4 == 0) ? 0.0 : std::exp((rng() % 1000) / 150.0);
    if (std::accumulate(loads.begin(), loads.end(), 0.0) == 0) loads[0] = 1;
    absl::StatusOr<Allocation> a = AllocateReplicas(loads, {nodes, slots, f});
    REQUIRE(a.ok());
    CHECK(std::accumulate(a->replicas.begin(), a->replicas.end(), 0) == nodes * slots);
    CHECK(a->min_replicas_lowered == (experts * f > nodes * slots));
    for (size_t i = 0; i < a->ascending.size(); ++i) {
      CHECK(a->replicas[a->ascending[i]] >= a->min_replicas);
      if (i > 0) {
        // Non-decreasing in load.
        CHECK(a->replicas[a->ascending[i]] >= a->replicas[a->ascending[i - 1]]);
      }
    }
  }
}

TEST_CASE("Allocation rejects bad input with clear errors", "[moe][allocation]") {
  CHECK(AllocateReplicas({1, 2}, {0, 4, 2}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AllocateReplicas({1, 2}, {4, 0, 2}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AllocateReplicas({}, {4, 4, 2}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AllocateReplicas({1, -2}, {4, 4, 2}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AllocateReplicas({0, 0}, {4, 4, 2}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(AllocateReplicas({1, 2}, {4, 4, 0}).status().code() == absl::StatusCode::kInvalidArgument);
  absl::Status too_many = AllocateReplicas(std::vector<double>(9, 1.0), {2, 4, 1}).status();
  CHECK(too_many.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(too_many.message()).find("do not fit") != std::string::npos);
}

}  // namespace
}  // namespace plexus::moe
