// The 2LHA plan executor and the latency probe over real communicators (ranks as threads, TCP
// on 127.0.0.1 or shm): the executor's sums equal EvaluatePlan bit for bit.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/ranks.hpp"
#include "plexus/aggregation/executor.hpp"
#include "plexus/aggregation/plan.hpp"
#include "plexus/aggregation/plink.hpp"

namespace agg = plexus::aggregation;
using plexus::collectives::Communicator;
using plexus::collectives::CommunicatorOptions;
using plexus::collectives::testing::RunRanks;

namespace {

std::vector<std::vector<float>> Inputs(int n, int elements) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<float>> in(n, std::vector<float>(elements));
  for (auto& v : in) {
    for (float& x : v) x = u(rng) * 1e3f;  // non-integers: the summation order shows
  }
  return in;
}

CommunicatorOptions Options() {
  CommunicatorOptions o;
  o.timeout = absl::Seconds(20);
  return o;
}

}  // namespace

TEST_CASE("the executor reproduces the plan's reference bit for bit", "[executor]") {
  const std::vector<std::vector<int>> groups = {{0, 3, 5}, {1, 4}, {2, 6, 7}};
  const int n = 8, elements = 1000;
  auto plan = agg::BuildTwoLevelPlan(groups, elements, {.chunk_elements = 96});
  REQUIRE(plan.ok());
  const auto in = Inputs(n, elements);
  auto expect = agg::EvaluatePlan(*plan, in, 0.125f);
  REQUIRE(expect.ok());
  std::vector<std::vector<float>> out = in;
  // Over tcp and over shm (the transport of ranks on one host).
  CommunicatorOptions options = Options();
  options.transport_policy = plexus::collectives::TransportPolicy::kUniform;
  options.device.backend =
      GENERATE(plexus::transport::Backend::kTcp, plexus::transport::Backend::kShm);
  auto errors = RunRanks(n, options, [&](int rank, Communicator& comm) -> std::string {
    absl::Status s = agg::ExecutePlan(comm, *plan, out[rank], {.scale = 0.125f});
    return s.ok() ? "" : std::string(s.message());
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << " backend " << static_cast<int>(options.device.backend));
    CHECK(errors[r] == "");
    CHECK(std::memcmp(out[r].data(), (*expect)[r].data(), elements * sizeof(float)) == 0);
  }
  // The plan sums in its own order, which differs from a plain left-to-right sum somewhere.
  bool differs = false;
  for (int k = 0; k < elements && !differs; ++k) {
    float plain = 0;
    for (int u = 0; u < n; ++u) plain += in[u][k];
    differs = plain * 0.125f != out[0][k];
  }
  CHECK(differs);
}

TEST_CASE("the executor refuses a buffer of the wrong size and a plan of another size",
          "[executor]") {
  auto plan = agg::BuildTwoLevelPlan({{0}, {1}}, 10, {.chunk_elements = 4});
  REQUIRE(plan.ok());
  auto errors = RunRanks(2, Options(), [&](int, Communicator& comm) -> std::string {
    std::vector<float> small(9);
    return std::string(agg::ExecutePlan(comm, *plan, small).message());
  });
  CHECK(errors[0].find("buffer of 9") != std::string::npos);
  auto three = agg::BuildTwoLevelPlan({{0, 1, 2}}, 10);
  REQUIRE(three.ok());
  errors = RunRanks(2, Options(), [&](int, Communicator& comm) -> std::string {
    std::vector<float> buf(10);
    return std::string(agg::ExecutePlan(comm, *three, buf).message());
  });
  CHECK(errors[1].find("the plan 3 nodes") != std::string::npos);
}

TEST_CASE("latency probing fills a symmetric matrix, bounded by its deadline", "[probe]") {
  for (int n : {3, 4}) {
    INFO(n << " ranks");
    std::vector<agg::Matrix> got(n);
    auto errors = RunRanks(n, Options(), [&](int rank, Communicator& comm) -> std::string {
      auto m = agg::ProbeLatencies(comm, {.probes_per_pair = 6});
      if (!m.ok()) return std::string(m.status().message());
      got[rank] = *m;
      return "";
    });
    for (int r = 0; r < n; ++r) {
      REQUIRE(errors[r] == "");
      CHECK(got[r] == got[0]);
    }
    CHECK(agg::CheckDistances(got[0]).ok());
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (i != j) CHECK(got[0][i][j] > 0);
      }
    }
  }
  auto errors = RunRanks(2, Options(), [&](int, Communicator& comm) -> std::string {
    auto m = agg::ProbeLatencies(comm, {.deadline = absl::ZeroDuration()});
    return m.ok() ? "" : std::string(m.status().message());
  });
  CHECK(errors[0].find("before round 0") != std::string::npos);
}

TEST_CASE("a rank that never joins fails the plan on the others within the timeout", "[executor]") {
  auto plan = agg::BuildTwoLevelPlan({{0, 1}, {2}}, 64, {.chunk_elements = 16});
  REQUIRE(plan.ok());
  CommunicatorOptions o = Options();
  o.timeout = absl::Seconds(2);
  const auto start = std::chrono::steady_clock::now();
  auto errors = RunRanks(3, o, [&](int rank, Communicator& comm) -> std::string {
    if (rank == 2) return "";  // never executes its part of the plan
    std::vector<float> buf(64, 1.0f);
    return std::string(agg::ExecutePlan(comm, *plan, buf).message());
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].find("plan executor, rank " + std::to_string(r)) != std::string::npos);
  }
  CHECK(seconds < 1.25 * 2 + 0.5 + 2);  // the timeout, plus rank 2's bounded teardown
}
