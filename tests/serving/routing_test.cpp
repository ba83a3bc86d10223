// Share-following routing: smooth weighted round robin, and by request id for joins.
#include <catch2/catch.hpp>
#include <vector>

#include "plexus/serving/routing.hpp"

namespace plexus::serving {
namespace {

TEST_CASE("smooth round robin follows the weights within one pick", "[serving]") {
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  SmoothRoundRobin rr(weights);
  std::vector<int> count(3, 0);
  for (int n = 1; n <= 10'000; ++n) {
    ++count[rr.Next()];
    for (size_t i = 0; i < 3; ++i) REQUIRE(std::abs(count[i] - n * weights[i]) <= 1.0);
  }
}

TEST_CASE("routing by id follows the weights over consecutive ids, the same for every caller",
          "[serving]") {
  const std::vector<double> weights = {0.6, 0.25, 0.15};
  const RouteById route(weights), again(weights);
  SmoothRoundRobin rr(weights);
  std::vector<int> count(3, 0);
  for (uint64_t id = 0; id < 10'000; ++id) {
    const size_t pick = route(id);
    REQUIRE(pick == again(id));
    if (id < 4096) REQUIRE(pick == rr.Next());  // the round robin's own order, id by id
    ++count[pick];
  }
  for (size_t i = 0; i < 3; ++i) {
    INFO("worker " << i << " got " << count[i]);
    CHECK(std::abs(count[i] / 10'000.0 - weights[i]) < 0.02 * weights[i]);
  }
  CHECK(RouteById({1.0})(7) == 0);
  CHECK(RouteById({})(7) == 0);
}

}  // namespace
}  // namespace plexus::serving
