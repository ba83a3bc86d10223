// Topology model, cost models and rank reordering (Cloud Collectives): JSON in and out, the cost
// formulas on hand-computed instances and as the seed's closed forms computed apart from the
// schedules the models price, and the reorderer against brute force.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "plexus/collectives/probe.hpp"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/netmodel/topology.hpp"

namespace pc = plexus::collectives;
namespace pn = plexus::netmodel;
using pn::CostMatrix;
using pn::CostModel;

namespace {

CostMatrix FromRows(const std::vector<std::vector<double>>& rows) {
  CostMatrix m;
  m.n = static_cast<int>(rows.size());
  for (int i = 0; i < m.n; ++i) {
    m.labels.push_back("h" + std::to_string(i));
    for (double v : rows[i]) m.latency_us.push_back(v);
  }
  return m;
}

CostMatrix Random(int n, std::mt19937_64& rng, bool symmetric, bool bandwidth) {
  CostMatrix m;
  m.n = n;
  for (int i = 0; i < n; ++i) m.labels.push_back("h" + std::to_string(i));
  m.latency_us.assign(n * n, 0);
  // Small integers: ties are frequent, which exercises tie handling in the search.
  std::uniform_int_distribution<int> lat(1, 40);
  std::uniform_int_distribution<int> bw(1, 8);
  if (bandwidth) m.bandwidth_gbps.assign(n * n, 1);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j || (symmetric && j < i)) continue;
      m.latency_us[i * n + j] = lat(rng);
      if (bandwidth) m.bandwidth_gbps[i * n + j] = bw(rng);
      if (symmetric) {
        m.latency_us[j * n + i] = m.latency_us[i * n + j];
        if (bandwidth) m.bandwidth_gbps[j * n + i] = m.bandwidth_gbps[i * n + j];
      }
    }
  }
  return m;
}

double Cost(const CostMatrix& m, const std::vector<int>& order, pn::CostOptions o) {
  auto c = pn::OrderCost(m, order, o);
  REQUIRE(c.ok());
  return *c;
}

}  // namespace

TEST_CASE("topology JSON round trip and path latencies", "[reorder]") {
  auto fabric = pn::GenerateFabric({.pods = 2,
                                    .racks_per_pod = 2,
                                    .hosts_per_rack = 2,
                                    .nic_gbps = 10,
                                    .rack_oversubscription = 2,
                                    .pod_oversubscription = 2,
                                    .nic_latency_us = 1,
                                    .rack_latency_us = 3,
                                    .pod_latency_us = 10});
  REQUIRE(fabric.ok());
  REQUIRE(fabric->hosts.size() == 8);
  CHECK(fabric->hosts[5].name == "p1r0h1");
  CHECK(fabric->racks[0].uplink_gbps == 10);  // 2 hosts * 10 / 2
  CHECK(fabric->pods[0].uplink_gbps == 10);   // 2 racks * 10 / 2
  CHECK(fabric->LatencyUs(0, 0) == 0);
  CHECK(fabric->LatencyUs(0, 1) == 2);           // same rack: two NICs
  CHECK(fabric->LatencyUs(0, 2) == 2 + 6);       // same pod
  CHECK(fabric->LatencyUs(0, 7) == 2 + 6 + 20);  // across pods
  CHECK(fabric->Path(0, 7).size() == 6);
  CHECK(fabric->PodOf(7) == 1);
  CHECK(fabric->RackOf(7) == 3);

  auto back = pn::ParseTopology(pn::TopologyToJson(*fabric), "round trip");
  REQUIRE(back.ok());
  CHECK(pn::TopologyToJson(*back) == pn::TopologyToJson(*fabric));
  CHECK(back->LatencyUs(0, 7) == 28);
}

TEST_CASE("topology JSON errors name the element", "[reorder]") {
  auto bad_rack = pn::ParseTopology(
      R"({"pods":[{"name":"p","uplink_gbps":1}],"racks":[{"name":"r","pod":"p","uplink_gbps":1}],
          "hosts":[{"name":"h","rack":"r9","nic_gbps":1}]})",
      "t.json");
  REQUIRE_FALSE(bad_rack.ok());
  CHECK(std::string(bad_rack.status().message()) == "t.json: hosts[0].rack: no rack named 'r9'");
  auto misspelt = pn::ParseTopology(
      R"({"pods":[{"name":"p","uplink_gbps":1,"latency":3}],"racks":[],"hosts":[]})", "t.json");
  REQUIRE_FALSE(misspelt.ok());
  CHECK(std::string(misspelt.status().message()).find("pods[0].latency: unknown field") !=
        std::string::npos);
  auto dup = pn::ParseTopology(
      R"({"pods":[{"name":"p","uplink_gbps":1},{"name":"p","uplink_gbps":1}],"racks":[],"hosts":[]})",
      "t.json");
  REQUIRE_FALSE(dup.ok());
  CHECK(std::string(dup.status().message()) == "t.json: pods[1].name: duplicate name 'p'");
  auto zero = pn::ParseTopology(
      R"({"pods":[{"name":"p","uplink_gbps":0}],"racks":[],"hosts":[{"name":"h","rack":"r","nic_gbps":1}]})",
      "t.json");
  REQUIRE_FALSE(zero.ok());
  CHECK(std::string(zero.status().message()) ==
        "t.json: pods[0]: capacity must be in 1e-06..1e+06 Gbps, got 0");
  // Latencies that would sum to inf are refused where they are given.
  auto slow = pn::ParseTopology(
      R"({"pods":[{"name":"p","uplink_gbps":1,"uplink_latency_us":1e308}],"racks":[],
          "hosts":[{"name":"h","rack":"r","nic_gbps":1}]})",
      "t.json");
  REQUIRE_FALSE(slow.ok());
  CHECK(std::string(slow.status().message()) ==
        "t.json: pods[0]: latency must be in 0..8.33333e+07 us, got 1e+308");
}

TEST_CASE("a generated fabric's size is checked as a product", "[reorder]") {
  auto huge = pn::GenerateFabric({.pods = 4096, .racks_per_pod = 100, .hosts_per_rack = 100});
  REQUIRE_FALSE(huge.ok());
  CHECK(std::string(huge.status().message()) ==
        "fabric: 4096 pods x 100 racks x 100 hosts = 40960000 hosts; at most 4096 are supported "
        "(the latency matrix has hosts^2 entries: 1677721600000000 here, 16777216 at the limit)");
  CHECK_FALSE(pn::CheckFabricSize({.pods = 256, .racks_per_pod = 10, .hosts_per_rack = 10}).ok());
  CHECK(pn::CheckFabricSize({.pods = 16, .racks_per_pod = 16, .hosts_per_rack = 16}).ok());
}

TEST_CASE("cost matrix JSON round trip and errors", "[reorder]") {
  CostMatrix m = FromRows({{0, 1.5, 2}, {1.5, 0, 3}, {2, 3, 0}});
  m.bandwidth_gbps = {1, 2, 3, 2, 1, 4, 3, 4, 1};
  auto back = pn::ParseCostMatrix(pn::CostMatrixToJson(m), "m");
  REQUIRE(back.ok());
  CHECK(back->labels == m.labels);
  CHECK(back->latency_us == m.latency_us);
  CHECK(back->bandwidth_gbps == m.bandwidth_gbps);
  // 1e6 bytes over 2 Gbps = 4000 us, plus 1.5 us.
  CHECK(back->Cost(0, 1, 1e6) == Approx(4001.5));

  auto inf =
      pn::ParseCostMatrix(R"({"labels":["a","b"],"latency_us":[[0,1e308],[1e308,0]]})", "m.json");
  REQUIRE_FALSE(inf.ok());
  CHECK(std::string(inf.status().message()) ==
        "m.json: cost matrix: latency_us[0][1] must be in 0..1e+09 (microseconds), got 1e+308");
  auto thin = pn::ParseCostMatrix(
      R"({"labels":["a","b"],"latency_us":[[0,1],[1,0]],"bandwidth_gbps":[[0,1e-300],[1,0]]})",
      "m.json");
  REQUIRE_FALSE(thin.ok());
  CHECK(std::string(thin.status().message()) ==
        "m.json: cost matrix: bandwidth_gbps[0][1] must be in 1e-06..1e+06 (Gbit/s), got 1e-300");

  auto ragged = pn::ParseCostMatrix(R"({"labels":["a","b"],"latency_us":[[0,1],[1]]})", "m.json");
  REQUIRE_FALSE(ragged.ok());
  CHECK(std::string(ragged.status().message()) ==
        "m.json: latency_us[1]: expected an array of 2 numbers");
  auto diag = pn::ParseCostMatrix(R"({"labels":["a","b"],"latency_us":[[1,1],[1,0]]})", "m.json");
  REQUIRE_FALSE(diag.ok());
  CHECK(std::string(diag.status().message()) ==
        "m.json: cost matrix: latency_us[0][0] must be 0, got 1");
}

TEST_CASE("cost models on hand-computed instances", "[reorder]") {
  // Four nodes, symmetric: a = 0-1, b = 0-2, ...
  const CostMatrix m =
      FromRows({{0, 1, 10, 100}, {1, 0, 1000, 10000}, {10, 1000, 0, 5}, {100, 10000, 5, 0}});
  pn::CostOptions ring{.model = CostModel::kRing};
  CHECK(Cost(m, {0, 1, 2, 3}, ring) == 1 + 1000 + 5 + 100);
  CHECK(Cost(m, {0, 1, 3, 2}, ring) == 1 + 10000 + 5 + 10);
  CHECK(Cost(m, {1, 0, 2, 3}, ring) == 1 + 10 + 5 + 10000);

  // Halving-doubling, n = 4: rounds mask 2 (0-2, 1-3), mask 1 (0-1, 2-3), then 1, then 2.
  pn::CostOptions hd{.model = CostModel::kHalvingDoubling};
  CHECK(Cost(m, {0, 1, 2, 3}, hd) == 2 * (std::max(10.0, 10000.0) + std::max(1.0, 5.0)));
  CHECK(Cost(m, {0, 2, 1, 3}, hd) == 2 * (std::max(1.0, 5.0) + std::max(10.0, 10000.0)));
  // Positions 0-2 hold nodes 0 and 3 (100), 1-3 nodes 1 and 2 (1000); 0-1: 1, 2-3: 5.
  CHECK(Cost(m, {0, 1, 3, 2}, hd) == 2 * (1000 + 5));
  // n = 3 folds: position 0 -> 1 first, core {1, 2}, then 1 -> 0.
  const CostMatrix m3 = FromRows({{0, 2, 7}, {2, 0, 3}, {7, 3, 0}});
  CHECK(Cost(m3, {0, 1, 2}, hd) == 2 + 3 + 3 + 2);

  // Double binary tree, n = 4: tree 1 over indices 0..3: root 1, children 0 and 2, 2 -> 3;
  // tree 2 = indices shifted down by one: root 0, children 3 and 1, 1 -> 2. Paths of positions.
  pn::CostOptions dbt{.model = CostModel::kDoubleBinaryTree, .bytes = 0};
  // order = identity: tree 1 paths 1-0 (1), 1-2-3 (1000 + 5); tree 2 paths 0-3 (100), 0-1-2
  // (1+1000).
  CHECK(Cost(m, {0, 1, 2, 3}, dbt) == 1005);

  // BCube with base 2 has the pairs of halving-doubling over a power of two: equal costs.
  pn::CostOptions bcube{.model = CostModel::kBCube, .bcube_base = 2};
  std::mt19937_64 rng(3);
  const CostMatrix m8 = Random(8, rng, true, false);
  std::vector<int> order = {3, 1, 4, 0, 5, 2, 7, 6};
  CHECK(Cost(m8, order, bcube) == Cost(m8, order, hd));
  // BCube base 4 over 4 nodes: one round where everyone talks to everyone, twice.
  pn::CostOptions b4{.model = CostModel::kBCube, .bcube_base = 4};
  CHECK(Cost(m, {0, 1, 2, 3}, b4) == 2 * 10000);
  auto not_power = pn::OrderCost(m3, {0, 1, 2}, b4);
  REQUIRE_FALSE(not_power.ok());
  CHECK(std::string(not_power.status().message()).find("power of its base 4; got n = 3") !=
        std::string::npos);
  auto bad_order = pn::OrderCost(m, {0, 1, 1, 3}, ring);
  REQUIRE_FALSE(bad_order.ok());
  CHECK(std::string(bad_order.status().message()).find("order[2] = 1") != std::string::npos);
}

TEST_CASE("halving-doubling equals twice the seed's formula over a power of two", "[reorder]") {
  // Seed: C_hd = sum_i MAX_j c_{j, j xor 2^i}: latency only, so the sizes do not matter.
  std::mt19937_64 rng(11);
  for (int n : {2, 4, 8, 16}) {
    const CostMatrix m = Random(n, rng, true, false);
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    double seed = 0;
    for (int bit = 1; bit < n; bit *= 2) {
      double worst = 0;
      for (int j = 0; j < n; ++j) worst = std::max(worst, m.latency(order[j], order[j ^ bit]));
      seed += worst;
    }
    CHECK(Cost(m, order, {.model = CostModel::kHalvingDoubling}) == 2 * seed);
  }
}

namespace {

// The seed's closed forms, computed here apart from the schedules the cost models price.
double RingFormula(const CostMatrix& m, const std::vector<int>& o, double s) {
  const int n = m.n;
  double c = 0;
  if (n < 2) return 0;
  for (int i = 0; i < n; ++i) c += m.Cost(o[i], o[(i + 1) % n], s);  // C_r = sum_i c_{i,i+1}(S)
  return c;
}

// Sum over rounds of the dearest pair: the fold in, halving (partners j xor m, m = p2/2 .. 1,
// carrying S m / p2), doubling (m = 1 .. p2/2), the fold out.
double HalvingDoublingFormula(const CostMatrix& m, const std::vector<int>& o, double s) {
  const int n = m.n;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  std::vector<int> core;
  for (int k = 0; k < rem; ++k) core.push_back(2 * k + 1);
  for (int p = 2 * rem; p < n; ++p) core.push_back(p);
  double total = 0;
  auto fold = [&](bool in) {
    double worst = 0;
    for (int k = 0; k < rem; ++k) {
      worst = std::max(worst,
                       in ? m.Cost(o[2 * k], o[2 * k + 1], s) : m.Cost(o[2 * k + 1], o[2 * k], s));
    }
    total += worst;
  };
  auto round = [&](int mask) {
    double worst = 0;
    for (int j = 0; j < p2; ++j) {
      worst = std::max(worst, m.Cost(o[core[j]], o[core[j ^ mask]], s * mask / p2));
    }
    total += worst;
  };
  fold(true);
  for (int mask = p2 / 2; mask >= 1; mask /= 2) round(mask);
  for (int mask = 1; mask < p2; mask *= 2) round(mask);
  fold(false);
  return total;
}

// C_dbt = max(T_1, T_2): T(i, j) = 0 for i >= j, else the dearer of c_{m, mid(child range)}(S/2)
// + T(child range) over both children, m = mid(i, j); tree 2 is tree 1 with indices minus one.
double TreeFormula(const CostMatrix& m, const std::vector<int>& o, double s, int i, int j,
                   int shift) {
  const int n = m.n;
  auto at = [&](int index) { return o[((index + shift) % n + n) % n]; };
  const int mid = (i + j) / 2;
  double worst = 0;
  if (i < mid) {
    worst = std::max(worst, m.Cost(at(mid), at((i + mid - 1) / 2), s / 2) +
                                TreeFormula(m, o, s, i, mid - 1, shift));
  }
  if (mid < j) {
    worst = std::max(worst, m.Cost(at(mid), at((mid + 1 + j) / 2), s / 2) +
                                TreeFormula(m, o, s, mid + 1, j, shift));
  }
  return worst;
}

// C_b = sum over the reduce-scatter rounds i, then the all-gather rounds backwards, of
// MAX_j MAX_k c_{j, j + (k - digit_i(j)) B^i}(S / B^{i+1}).
double BCubeFormula(const CostMatrix& m, const std::vector<int>& o, double s, int base) {
  const int n = m.n;
  int digits = 0;
  for (int p = 1; p < n; p *= base) ++digits;
  std::vector<double> rounds;
  for (int i = 0, stride = 1; i < digits; ++i, stride *= base) {
    double worst = 0;
    for (int j = 0; j < n; ++j) {
      const int digit = (j / stride) % base;
      for (int k = 0; k < base; ++k) {
        if (k == digit) continue;
        worst =
            std::max(worst, m.Cost(o[j], o[j + (k - digit) * stride], s / std::pow(base, i + 1)));
      }
    }
    rounds.push_back(worst);
  }
  double total = 0;
  for (double r : rounds) total += r;
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) total += *it;
  return total;
}

}  // namespace

TEST_CASE("every cost model equals the seed's closed form", "[reorder]") {
  std::mt19937_64 rng(23);
  for (int n = 1; n <= 17; ++n) {
    for (bool bandwidth : {false, true}) {
      const CostMatrix m = Random(n, rng, /*symmetric=*/false, bandwidth);
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      const double s = 12345;
      INFO("n " << n << (bandwidth ? " with bandwidth" : ""));
      // Integer latencies alone add exactly in any order; bandwidth terms up to rounding.
      auto same = [&](double cost, double formula) {
        if (bandwidth) {
          CHECK(cost == Approx(formula).epsilon(1e-12));
        } else {
          CHECK(cost == formula);
        }
      };
      same(Cost(m, order, {.model = CostModel::kRing, .bytes = s}), RingFormula(m, order, s));
      same(Cost(m, order, {.model = CostModel::kHalvingDoubling, .bytes = s}),
           HalvingDoublingFormula(m, order, s));
      const double dbt = n < 2 ? 0
                               : std::max(TreeFormula(m, order, s, 0, n - 1, 0),
                                          TreeFormula(m, order, s, 0, n - 1, -1));
      same(Cost(m, order, {.model = CostModel::kDoubleBinaryTree, .bytes = s}), dbt);
      for (int base : {2, 3, 4}) {
        int power = 1;
        while (power < n) power *= base;
        if (power != n) continue;
        same(Cost(m, order, {.model = CostModel::kBCube, .bytes = s, .bcube_base = base}),
             BCubeFormula(m, order, s, base));
      }
    }
  }
}

TEST_CASE("tournament rounds: disjoint pairs, every pair once", "[reorder]") {
  for (int n = 1; n <= 12; ++n) {
    const auto rounds = pc::TournamentRounds(n);
    CHECK(static_cast<int>(rounds.size()) == (n < 2 ? 0 : (n % 2 == 0 ? n - 1 : n)));
    std::set<std::pair<int, int>> seen;
    for (const auto& round : rounds) {
      std::set<int> busy;
      CHECK(static_cast<int>(round.size()) == n / 2);
      for (auto [a, b] : round) {
        CHECK(a < b);
        CHECK(busy.insert(a).second);
        CHECK(busy.insert(b).second);
        CHECK(seen.insert({a, b}).second);
      }
    }
    CHECK(static_cast<int>(seen.size()) == n * (n - 1) / 2);
  }
}

TEST_CASE("probe rows: symmetrised by the max, loopback cost subtracted", "[reorder]") {
  // rtt[i][j]: rank i's p10 RTT to j.
  const std::vector<double> rtt = {0, 30, 12, 40, 0, 8, 10, 9, 0};
  const std::vector<double> self = {4, 6, 2};
  const CostMatrix m = pc::LatencyMatrixFromRtts({"a", "b", "c"}, rtt, self, true);
  CHECK(m.labels == std::vector<std::string>{"a", "b", "c"});
  CHECK(m.latency_us == std::vector<double>{0, 40 - 5, 12 - 3, 40 - 5, 0, 9 - 4, 12 - 3, 9 - 4, 0});
  const CostMatrix raw = pc::LatencyMatrixFromRtts({"a", "b", "c"}, rtt, self, false);
  CHECK(raw.latency_us == std::vector<double>{0, 40, 12, 40, 0, 9, 12, 9, 0});
  // Never below zero: a pair cheaper than the loopback.
  const CostMatrix floor = pc::LatencyMatrixFromRtts({"a", "b"}, {0, 1, 1, 0}, {5, 5}, true);
  CHECK(floor.latency_us == std::vector<double>{0, 0, 0, 0});
}

TEST_CASE("percentile by nearest rank", "[reorder]") {
  CHECK(pc::Percentile({}, 0.1) == 0);
  CHECK(pc::Percentile({5, 1, 4, 2, 3, 10, 9, 8, 7, 6}, 0.1) == 1);
  CHECK(pc::Percentile({5, 1, 4, 2, 3, 10, 9, 8, 7, 6}, 0.5) == 5);
  CHECK(pc::Percentile({5, 1, 4, 2, 3, 10, 9, 8, 7, 6, 11}, 0.1) == 2);
  CHECK(pc::Percentile({3}, 0) == 3);
}

namespace {

// Reorder (annealing, then branch and bound) against brute force on random instances.
void CheckExact(int n, int instances, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int k = 0; k < instances; ++k) {
    for (CostModel model : {CostModel::kRing, CostModel::kHalvingDoubling,
                            CostModel::kDoubleBinaryTree, CostModel::kBCube}) {
      pn::CostOptions cost{.model = model, .bytes = 1e5};
      if (model == CostModel::kBCube) {
        if (n == 4 || n == 8) {
          cost.bcube_base = 2;
        } else if (n == 9) {
          cost.bcube_base = 3;
        } else {
          continue;
        }
      }
      const bool symmetric = k % 3 != 2;
      const bool bandwidth = k % 2 == 1;
      const CostMatrix m = Random(n, rng, symmetric, bandwidth);
      auto brute = pn::BruteForceReorder(m, cost);
      REQUIRE(brute.ok());
      // Weak annealing on odd instances, so that branch and bound has to find the optimum.
      pn::ReorderOptions options{.cost = cost, .seed = seed + k};
      if (k % 2 == 1) {
        options.anneal_runs = 1;
        options.anneal_moves = 5;
      }
      auto r = pn::Reorder(m, options);
      REQUIRE(r.ok());
      INFO("n " << n << " instance " << k << " model " << pn::CostModelName(model)
                << (symmetric ? " symmetric" : " asymmetric")
                << (bandwidth ? " with bandwidth" : ""));
      CHECK(r->proven_optimal);
      // Equal up to rounding: rotations of one ring add the same hop costs in other orders.
      CHECK(r->cost == Approx(brute->cost).epsilon(1e-12));
      CHECK(Cost(m, r->order, cost) == r->cost);
    }
  }
}

}  // namespace

TEST_CASE("reorder finds the exact optimum for n <= 9 (brute force)", "[reorder]") {
  for (int n = 1; n <= 8; ++n) CheckExact(n, 6, 100 + n);
  CheckExact(9, 2, 109);
}

// n = 10: 3.6 million orders per brute force; labelled slow (collectives_reorder_slow).
TEST_CASE("reorder finds the exact optimum for n = 10 (brute force)", "[.][slow]") {
  CheckExact(10, 2, 110);
}

TEST_CASE("reorder beats the identity on a clustered instance and reports progress", "[reorder]") {
  // 9 nodes in 3 clusters of 3, interleaved: the identity crosses clusters at every hop.
  const int n = 9;
  CostMatrix m;
  m.n = n;
  for (int i = 0; i < n; ++i) m.labels.push_back("h" + std::to_string(i));
  m.latency_us.assign(n * n, 0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) m.latency_us[i * n + j] = i % 3 == j % 3 ? 1 : 100;
    }
  }
  int calls = 0;
  pn::ReorderOptions options;
  options.progress = [&](double, double) { ++calls; };
  auto r = pn::Reorder(m, options);
  REQUIRE(r.ok());
  CHECK(r->identity_cost == 9 * 100);
  CHECK(r->cost == 3 * 100 + 6 * 1);  // three intra-cluster runs joined by three crossings
  CHECK(r->proven_optimal);
  CHECK(calls == options.anneal_runs);
}

TEST_CASE("launcher files follow the order", "[reorder]") {
  CostMatrix m = FromRows({{0, 1, 1}, {1, 0, 1}, {1, 1, 0}});
  m.labels = {"a", "b", "a"};
  const std::vector<int> order = {2, 1, 0};
  CHECK(pn::FormatRankfile(m, order) == "rank 0=a slot=0\nrank 1=b slot=0\nrank 2=a slot=1\n");
  CHECK(pn::FormatHostfile(m, order) == "a slots=1\nb slots=1\na slots=1\n");
  CHECK(pn::FormatRankAssignment(m, order) == "a RANK=2\nb RANK=1\na RANK=0\n");
}

TEST_CASE("generated latency matrices are symmetric, noisy and deterministic", "[reorder]") {
  auto fabric = pn::GenerateFabric({.pods = 2, .racks_per_pod = 2, .hosts_per_rack = 2});
  REQUIRE(fabric.ok());
  const CostMatrix a =
      pn::LatencyFromTopology(*fabric, {.noise = 0.2, .tenant_fraction = 0, .seed = 5});
  const CostMatrix b =
      pn::LatencyFromTopology(*fabric, {.noise = 0.2, .tenant_fraction = 0, .seed = 5});
  CHECK(a.latency_us == b.latency_us);
  REQUIRE(a.Validate().ok());
  for (int i = 0; i < a.n; ++i) {
    for (int j = 0; j < a.n; ++j) {
      CHECK(a.latency(i, j) == a.latency(j, i));
      if (i != j) {
        const double base = 2 * fabric->LatencyUs(i, j);
        CHECK(a.latency(i, j) > base * std::exp(-0.2 * 6));
        CHECK(a.latency(i, j) < base * std::exp(0.2 * 6));
      }
    }
  }
  const CostMatrix none = pn::LatencyFromTopology(*fabric, {.noise = 0, .tenant_fraction = 0});
  CHECK(none.latency(0, 7) == 2 * fabric->LatencyUs(0, 7));
}
