// The flow-level simulator on Clos and tree fabrics (max-min rates checked by hand), flow
// assignment (ECMP collisions that FFA avoids, the seed's FFA and PFA examples), locality-aware
// rings, MCCS's table on a scaled-down fabric, and Spearman's rank correlation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "plexus/netmodel/flow_assign.hpp"
#include "plexus/netmodel/flow_schedules.hpp"
#include "plexus/netmodel/flow_sim.hpp"
#include "plexus/netmodel/mccs_sim.hpp"
#include "plexus/netmodel/topology.hpp"

namespace pn = plexus::netmodel;
namespace sim = plexus::netmodel::sim;

namespace {

sim::Network Clos(int leaves, int spines, int hosts_per_leaf, double bw, double oversub,
                  int nics = 1, double nvlink = 0) {
  auto t = sim::Network::Clos({.leaves = leaves,
                               .spines = spines,
                               .hosts_per_leaf = hosts_per_leaf,
                               .host_bytes_per_s = bw,
                               .oversubscription = oversub,
                               .host_latency_s = 0,
                               .spine_latency_s = 0,
                               .nics_per_host = nics,
                               .nvlink_bytes_per_s = nvlink});
  REQUIRE(t.ok());
  return *t;
}

sim::Network Racks(int racks, int per_rack, double bw, double oversub) {
  auto t = sim::Network::Racks({.racks = racks,
                                .hosts_per_rack = per_rack,
                                .host_bytes_per_s = bw,
                                .oversubscription = oversub,
                                .host_latency_s = 0,
                                .core_latency_s = 0});
  REQUIRE(t.ok());
  return *t;
}

std::vector<double> Capacities(const sim::Network& t) {
  std::vector<double> c;
  for (const auto& l : t.links()) c.push_back(l.bytes_per_s);
  return c;
}

// One flow per (src, dst) pair, every equal-cost route of the topology a candidate.
pn::Flow FlowOf(const sim::Network& t, int job, int src, int dst, uint64_t key) {
  pn::Flow f;
  f.job = job;
  f.key = key;
  for (int p = 0; p < t.Paths(src, dst); ++p) f.routes.push_back(t.Route(src, dst, p));
  return f;
}

}  // namespace

TEST_CASE("coupled flows share links max-min fairly, counting every crossing", "[flow_sim]") {
  // Racks of 2 hosts, NICs 100 B/s, uplinks 2 x 100 / 4 = 50 B/s. R crosses rack0.up twice
  // (0->2 and 1->3): 2r <= 50, r = 25. S (0->1) shares host0.up with R: gets 100 - 25 = 75.
  const sim::Network t = Racks(2, 2, 100, 4);
  const sim::CoupledFlow r{{{0, 2, -1}, {1, 3, -1}}, 100, 0, 0};
  const sim::CoupledFlow s{{{0, 1, -1}}, 150, 0, 0};
  auto rates = sim::MaxMinRates(t, {sim::LinkUses(t, r), sim::LinkUses(t, s)});
  REQUIRE(rates.size() == 2);
  CHECK(rates[0] == 25.0);
  CHECK(rates[1] == 75.0);
  CHECK(sim::LinkUses(t, r) ==
        std::vector<std::pair<int, int>>{{0, 1}, {2, 1}, {5, 1}, {7, 1}, {8, 2}, {11, 2}});

  // Uplinks of 200 B/s: host0.up (100) is the bottleneck, 50 each; S (100 B) ends at 2 s, then
  // R (300 B, 200 left) alone gets 100 B/s on host0.up and 200 / 2 on the uplink: ends at 4 s.
  const sim::Network wide = Racks(2, 2, 100, 1);
  const sim::CoupledFlow r2{{{0, 2, -1}, {1, 3, -1}}, 300, 0, 0};
  const sim::CoupledFlow s2{{{0, 1, -1}}, 100, 0, 0};
  auto run = sim::SimulateCoupled(wide, {r2, s2});
  REQUIRE(run.ok());
  CHECK(run->initial_rate == std::vector<double>{50.0, 50.0});
  CHECK(run->finish_s[1] == Approx(2.0).epsilon(1e-12));
  CHECK(run->finish_s[0] == Approx(4.0).epsilon(1e-12));
  CHECK(run->makespan_s == Approx(4.0).epsilon(1e-12));

  // A start time and a latency delay a flow; a flow without links ends after its latency.
  const sim::CoupledFlow late{{{2, 3, -1}}, 100, 1.0, 0.5};
  const sim::CoupledFlow local{{}, 100, 0, 0.25};
  auto delayed = sim::SimulateCoupled(wide, {late, local});
  REQUIRE(delayed.ok());
  CHECK(delayed->finish_s[0] == Approx(2.5).epsilon(1e-12));
  CHECK(delayed->finish_s[1] == Approx(0.25).epsilon(1e-12));
}

TEST_CASE("a ring allreduce channel carries 2(n-1)/n of the buffer", "[flow_sim]") {
  // Four hosts on one rack of 100 B/s NICs: every hop at 100 B/s, 2 * 3/4 * 400 = 600 B.
  const sim::Network t = Racks(1, 4, 100, 1);
  const std::vector<int> ring{0, 1, 2, 3};
  const sim::CoupledFlow f = sim::RingAllreduceFlow(t, ring, 400);
  CHECK(f.hops.size() == 4);
  CHECK(f.bytes == 600.0);
  auto r = sim::SimulateCoupled(t, {f});
  REQUIRE(r.ok());
  CHECK(r->makespan_s == Approx(6.0).epsilon(1e-12));
  // The transfer-level simulator agrees on the unsliced ring schedule when the hops are alike:
  // 6 steps of 100 B at 100 B/s.
  auto schedule = sim::RingSchedule(ring, 400);
  REQUIRE(schedule.ok());
  auto dag = sim::Simulate(t, *schedule);
  REQUIRE(dag.ok());
  CHECK(dag->makespan_s == Approx(6.0).epsilon(1e-12));
}

TEST_CASE("multi-NIC Clos: NICs of one host talk over NVLink, leaves over any spine",
          "[flow_sim]") {
  const sim::Network t = Clos(2, 4, 2, 100, 2, /*nics=*/4);
  CHECK(t.hosts() == 16);
  CHECK(t.MachineOf(5) == 1);
  CHECK(t.RackOf(7) == 0);
  CHECK(t.RackOf(8) == 1);
  CHECK(t.Route(0, 3).empty());  // same machine, no NVLink links: free
  CHECK(t.Paths(0, 3) == 1);
  CHECK(t.Paths(0, 4) == 1);  // same leaf
  CHECK(t.Paths(0, 8) == 4);
  // Leaf uplink 2 hosts x 4 NICs x 100 / 2 = 400, 100 per spine cable.
  const auto route = t.Route(0, 8, 3);
  REQUIRE(route.size() == 4);
  CHECK(t.links()[route[1]].name == "leaf0-spine3.up");
  CHECK(t.links()[route[1]].bytes_per_s == 100.0);
  CHECK(t.links()[route[2]].name == "leaf1-spine3.down");
  CHECK(t.links()[route[0]].name == "host0.nic0.up");

  const sim::Network nv = Clos(1, 1, 1, 100, 1, 2, /*nvlink=*/1000);
  const auto local = nv.Route(0, 1);
  REQUIRE(local.size() == 2);
  CHECK(nv.links()[local[0]].bytes_per_s == 1000.0);

  // A route outside the pair's equal-cost set is refused, naming the transfer.
  sim::Schedule bad{"bad", {{0, 8, 10, {}, 4}}};
  auto r = sim::Simulate(t, bad);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find("transfer 0 (0 -> 8) takes route 4") != std::string::npos);
  auto c = sim::SimulateCoupled(t, {sim::CoupledFlow{{{0, 4, 1}}, 1, 0, 0}});
  REQUIRE(!c.ok());
  CHECK(c.status().message().find("hop 0 (0 -> 4) takes route 1") != std::string::npos);
}

TEST_CASE("a tree topology routes through rack and pod uplinks", "[flow_sim]") {
  auto model = pn::GenerateFabric({.pods = 2,
                                   .racks_per_pod = 2,
                                   .hosts_per_rack = 2,
                                   .nic_gbps = 8,
                                   .rack_oversubscription = 2,
                                   .pod_oversubscription = 2});
  REQUIRE(model.ok());
  auto t = sim::Network::Tree(*model);
  REQUIRE(t.ok());
  CHECK(t->hosts() == 8);
  CHECK(t->Route(0, 1).size() == 2);
  CHECK(t->Route(0, 2).size() == 4);
  CHECK(t->Route(0, 4).size() == 6);
  // Rack uplink 2 x 8 / 2 = 8 Gbps = 1e9 B/s; pod uplink 2 x 8 / 2 = 8 Gbps.
  const auto route = t->Route(0, 4);
  CHECK(t->links()[route[1]].bytes_per_s == 1e9);
  CHECK(t->links()[route[2]].name == "p0.up");
  CHECK(t->links()[route[3]].name == "p1.down");
  CHECK(t->PathLatency(0, 4) == Approx(2 * (2 + 5 + 20) * 1e-6));
}

TEST_CASE("ECMP hashes two flows onto one spine; FFA puts them on two", "[flow_assign]") {
  // 2 leaves x 2 hosts, 2 spines, NICs 100 B/s, no oversubscription: one cable per leaf and
  // spine of 100 B/s. Flows 0->2 and 1->3 collide under ECMP when their hashes agree mod 2.
  const sim::Network t = Clos(2, 2, 2, 100, 1);
  const std::vector<double> capacity = Capacities(t);
  const std::vector<pn::Flow> flows{FlowOf(t, 0, 0, 2, 11), FlowOf(t, 0, 1, 3, 22)};
  uint64_t seed = 0;
  for (; seed < 64; ++seed) {
    if (pn::EcmpHash(11, seed) % 2 == pn::EcmpHash(22, seed) % 2) break;
  }
  REQUIRE(seed < 64);
  pn::FlowAssignOptions options;
  options.policy = pn::FlowAssignPolicy::kEcmp;
  options.ecmp_seed = seed;
  auto ecmp = pn::AssignFlows(flows, capacity, options);
  REQUIRE(ecmp.ok());
  CHECK((*ecmp)[0] == (*ecmp)[1]);
  auto simulate = [&](const std::vector<int>& routes) {
    sim::Schedule s{"two", {{0, 2, 100, {}, routes[0]}, {1, 3, 100, {}, routes[1]}}};
    auto r = sim::Simulate(t, s);
    REQUIRE(r.ok());
    return r->makespan_s;
  };
  CHECK(simulate(*ecmp) == Approx(2.0).epsilon(1e-12));  // 50 B/s each on the shared cable

  // FFA: the first flow takes spine 0; on spine 0 the second would be 1 over a 100 B/s cable
  // already carrying 1, on spine 1 not: it takes spine 1, whatever the hash seed.
  for (uint64_t s = 0; s < 8; ++s) {
    options.policy = pn::FlowAssignPolicy::kFfa;
    options.ecmp_seed = s;
    auto ffa = pn::AssignFlows(flows, capacity, options);
    REQUIRE(ffa.ok());
    CHECK(*ffa == std::vector<int>{0, 1});
    CHECK(simulate(*ffa) == Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("FFA gives every route a flow of each job; PFA dedicates one to the priority job",
          "[flow_assign]") {
  // The seed's example: jobs A and B each have 2 flows from rack 0 to rack 1, 2 routes.
  const sim::Network t = Clos(2, 2, 2, 100, 1);
  const std::vector<double> capacity = Capacities(t);
  std::vector<pn::Flow> flows{FlowOf(t, 0, 0, 2, 1), FlowOf(t, 0, 1, 3, 2), FlowOf(t, 1, 0, 3, 3),
                              FlowOf(t, 1, 1, 2, 4)};
  pn::FlowAssignOptions options;
  options.policy = pn::FlowAssignPolicy::kFfa;
  auto ffa = pn::AssignFlows(flows, capacity, options);
  REQUIRE(ffa.ok());
  // Round-robin A0, B0, A1, B1: A0 -> 0 (a tie), B0 -> 1 (spine 0 carries A0), A1 ties and
  // goes where A has nothing (1), B1 -> 0 (spine 1's leaf-0 cable carries two).
  CHECK(*ffa == std::vector<int>{0, 1, 1, 0});

  for (auto& f : flows) f.high_priority = f.job == 0;
  options.policy = pn::FlowAssignPolicy::kPfa;
  options.reserved_routes = {0};
  auto pfa = pn::AssignFlows(flows, capacity, options);
  REQUIRE(pfa.ok());
  CHECK(*pfa == std::vector<int>{0, 0, 1, 1});

  // Without a reservation PFA is FFA with the low-priority flows placed first.
  options.reserved_routes.clear();
  auto plain = pn::AssignFlows(flows, capacity, options);
  REQUIRE(plain.ok());
  // B0 -> 0, B1 -> 1, A0 ties (both spines carry one B flow) -> 0, A1 -> 1.
  CHECK(*plain == std::vector<int>{0, 1, 0, 1});

  // Bad input names the flow.
  std::vector<pn::Flow> none{pn::Flow{}};
  auto err = pn::AssignFlows(none, capacity, {});
  REQUIRE(!err.ok());
  CHECK(err.status().message().find("flow 0 (job 0) has no route") != std::string::npos);
  std::vector<pn::Flow> far(1);
  far[0].routes = {{999}};
  CHECK(pn::AssignFlows(far, capacity, {}).status().message().find("link 999") !=
        std::string::npos);
  CHECK(pn::ParseFlowAssignPolicy("pfa").value() == pn::FlowAssignPolicy::kPfa);
  CHECK(!pn::ParseFlowAssignPolicy("hedera").ok());
}

TEST_CASE("locality-aware rings group by pod, rack and host and rotate per channel",
          "[flow_assign]") {
  const std::vector<pn::Locality> where{{0, 1, 2}, {0, 0, 0}, {0, 1, 2},
                                        {0, 0, 1}, {0, 0, 0}, {0, 1, 2}};
  CHECK(pn::LocalityRingOrder(where) == std::vector<int>{1, 4, 3, 0, 2, 5});
  CHECK(pn::LocalityRingOrder(where, 1) == std::vector<int>{4, 1, 3, 2, 5, 0});
  CHECK(pn::LocalityRingOrder(where, 7) == pn::LocalityRingOrder(where, 1));  // mod 2 and mod 3
}

TEST_CASE("the MCCS table on a scaled-down fabric orders the strategies", "[mccs]") {
  // 4 leaves x 2 hosts x 4 NICs = 32 GPUs, 4 spines, oversubscription 2; jobs of 8 GPUs.
  sim::MccsSpec spec;
  spec.fabric = {.leaves = 4,
                 .spines = 4,
                 .hosts_per_leaf = 2,
                 .host_bytes_per_s = 100,
                 .oversubscription = 2,
                 .host_latency_s = 0,
                 .spine_latency_s = 0,
                 .nics_per_host = 4};
  spec.job_sizes = {8};
  spec.bytes = 4000;
  spec.runs = 2;
  spec.seed = 3;

  // Compact: each job is one leaf (2 hosts x 4 GPUs). OR: per channel 2 hops leave a host,
  // rotated over the 4 NICs; 4 channels of 1000 B, each hop 2 x 7/8 x 1000 = 1750 B, one
  // connection per NIC and direction: 100 B/s, 17.5 s. Nothing crosses a spine, so FFA changes
  // nothing.
  auto compact = sim::RunMccs(spec, sim::Placement::kCompact);
  REQUIRE(compact.ok());
  REQUIRE(compact->size() == 8);
  for (const auto& j : *compact) {
    CHECK(j.hosts == 2);
    CHECK(j.racks == 1);
    CHECK(j.seconds[1] == Approx(17.5).epsilon(1e-12));
    CHECK(j.seconds[2] == j.seconds[1]);
    CHECK(j.cross_rack_hops[1] == 0);
    CHECK(j.seconds[0] > j.seconds[1]);  // random rings leave hosts at most hops
  }

  // Random placement: the optimal ring beats the random one, and FFA beats ECMP, on average.
  auto random = sim::RunMccs(spec, sim::Placement::kRandom);
  REQUIRE(random.ok());
  double mean[3] = {0, 0, 0};
  for (const auto& j : *random) {
    for (int s = 0; s < 3; ++s) mean[s] += j.seconds[0] / j.seconds[s] / random->size();
    CHECK(j.cross_rack_hops[1] <= j.cross_rack_hops[0]);
  }
  CHECK(mean[0] == 1.0);
  CHECK(mean[1] > 1.0);
  CHECK(mean[2] > mean[1]);
}

TEST_CASE("Spearman's rank correlation on known inputs", "[spearman]") {
  const std::vector<double> x{1, 2, 3, 4, 5};
  CHECK(sim::Spearman(x, std::vector<double>{10, 20, 30, 40, 1000}).value() == Approx(1.0));
  CHECK(sim::Spearman(x, std::vector<double>{5, 4, 3, 2, 1}).value() == Approx(-1.0));
  // Ties get their average rank: y ranks 1, 2, 3.5, 5, 3.5; rho = 8 / sqrt(10 * 9.5).
  CHECK(sim::Spearman(x, std::vector<double>{5, 6, 7, 8, 7}).value() ==
        Approx(8 / std::sqrt(95.0)).epsilon(1e-12));
  CHECK(!sim::Spearman(x, std::vector<double>{1, 1, 1, 1, 1}).ok());
  CHECK(!sim::Spearman(x, std::vector<double>{1, 2}).ok());
}

TEST_CASE("the spread: the reordered ring beats every random order, tree and Clos", "[mccs]") {
  sim::SpreadSpec spec;
  spec.fabric = {.pods = 2, .racks_per_pod = 2, .hosts_per_rack = 4};
  spec.orders = 30;
  spec.correlation_orders = 12;
  spec.reorder_seconds = 10;
  for (bool clos : {false, true}) {
    INFO((clos ? "clos" : "tree"));
    spec.clos = clos;
    spec.clos_fabric.leaves = 4;
    spec.clos_fabric.hosts_per_leaf = 4;
    spec.clos_fabric.spines = 2;
    auto r = sim::RunSpread(spec);
    REQUIRE(r.ok());
    CHECK(r->n == 16);
    REQUIRE(r->random_ms.size() == 30);
    CHECK(r->reordered_ms < *std::min_element(r->random_ms.begin(), r->random_ms.end()));
    CHECK(r->reordered_cost_us < r->median_random_cost_us);
    // From the reordered order to random ones, cost and time rise together.
    CHECK(r->spearman_latency > 0.5);
    CHECK(r->spearman_bandwidth > 0.5);
  }
}

TEST_CASE("regression pin: the 768-GPU table docs/netmodel.md quotes", "[mccs][pin]") {
  // plexus-mccs-sim table's defaults (about a second): 24 leaves x 4 hosts x 8 NICs, 16 spines.
  // The expected speedups are the simulator's own outputs when the table was written (the
  // seed's paper reports the same ordering, not these values): a pin against unintended
  // change, not an independent oracle.
  const sim::MccsSpec spec;
  const double expected[2][3] = {{1.0, 1.30, 1.97}, {1.0, 6.83, 8.07}};
  for (int p = 0; p < 2; ++p) {
    const auto placement = p == 0 ? sim::Placement::kRandom : sim::Placement::kCompact;
    INFO(sim::PlacementName(placement));
    auto jobs = sim::RunMccs(spec, placement);
    REQUIRE(jobs.ok());
    for (int s = 0; s < 3; ++s) {
      double mean = 0;
      for (const auto& j : *jobs) mean += j.seconds[0] / j.seconds[s] / jobs->size();
      CHECK(mean == Approx(expected[p][s]).margin(0.005));
    }
  }
}

TEST_CASE("a tree topology refuses an invalid model, naming the element", "[flow_sim]") {
  pn::Topology model;
  model.pods = {{"p0", 100, 1}};
  model.racks = {{"r0", "p0", 100, 1}};
  model.hosts = {{"h0", "r9", 25, 1}};
  auto t = sim::Network::Tree(model);
  REQUIRE(!t.ok());
  CHECK(t.status().message().find("r9") != std::string::npos);
}
