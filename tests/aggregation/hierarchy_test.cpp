// The flow simulator (max-min fair sharing), the dissertation's Table 4.1, PBox's hierarchy
// chooser against the simulator, and the 2LHA plan verifier with deliberately broken plans.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "plexus/aggregation/hierarchy.hpp"
#include "plexus/aggregation/plan.hpp"
#include "plexus/netmodel/flow_schedules.hpp"
#include "plexus/netmodel/flow_sim.hpp"

namespace agg = plexus::aggregation;
namespace sim = plexus::netmodel::sim;

namespace {

sim::Network Racks(int racks, int per_rack, double bw, double oversub, double latency = 0) {
  auto t = sim::Network::Racks({.racks = racks,
                                .hosts_per_rack = per_rack,
                                .host_bytes_per_s = bw,
                                .oversubscription = oversub,
                                .host_latency_s = latency,
                                .core_latency_s = latency});
  REQUIRE(t.ok());
  return *t;
}

// Deletes step i and renumbers the dependencies (dropping those on i).
void RemoveStep(agg::Plan& plan, int i) {
  plan.steps.erase(plan.steps.begin() + i);
  for (auto& s : plan.steps) {
    std::vector<int> after;
    for (int a : s.after) {
      if (a != i) after.push_back(a > i ? a - 1 : a);
    }
    s.after = after;
  }
}

int FindStep(const agg::Plan& plan, agg::StepKind kind, int nth = 0) {
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].kind == kind && nth-- == 0) return static_cast<int>(i);
  }
  FAIL("no such step");
  return -1;
}

agg::Plan SmallPlan() {
  auto plan = agg::BuildTwoLevelPlan({{0, 1, 2}, {3, 4, 5}, {6, 7}}, 10, {.chunk_elements = 3});
  REQUIRE(plan.ok());
  return *plan;
}

}  // namespace

TEST_CASE("one flow takes latency plus bytes over bandwidth", "[flow_sim]") {
  const sim::Network t = Racks(2, 2, 100, 1, 0.5);
  sim::Schedule s{"one", {{0, 3, 200, {}}}};
  auto r = sim::Simulate(t, s);
  REQUIRE(r.ok());
  // Route host0.up, rack0.up, rack1.down, host3.down: 4 x 0.5 s, then 200 B at 100 B/s.
  CHECK(r->makespan_s == Approx(4 * 0.5 + 2.0).epsilon(1e-12));
  CHECK(r->cross_rack_link_bytes == Approx(400));
}

TEST_CASE("flows share links max-min fairly and speed up when others finish", "[flow_sim]") {
  // Uplinks of 2 x 100 / 4 = 50 B/s: the two cross-rack flows get 25 each, the intra-rack flow
  // from host 0 the rest of host 0's NIC (75), not an equal third.
  const sim::Network t = Racks(2, 2, 100, 4);
  sim::Schedule s{"three", {{0, 2, 100, {}}, {1, 3, 100, {}}, {0, 1, 100, {}}}};
  auto r = sim::Simulate(t, s);
  REQUIRE(r.ok());
  CHECK(r->finish_s[2] == Approx(100.0 / 75).epsilon(1e-12));
  CHECK(r->finish_s[0] == Approx(4.0).epsilon(1e-12));
  CHECK(r->finish_s[1] == Approx(4.0).epsilon(1e-12));

  // A dependency starts after its predecessor: 0->1 (1 s) then 1->0 (1 s).
  sim::Schedule chain{"chain", {{0, 1, 100, {}}, {1, 0, 100, {0}}}};
  auto c = sim::Simulate(t, chain);
  REQUIRE(c.ok());
  CHECK(c->makespan_s == Approx(2.0).epsilon(1e-12));
}

TEST_CASE("a Clos fabric spreads cross-leaf flows over spines", "[flow_sim]") {
  auto t = sim::Network::Clos({.leaves = 2,
                               .spines = 2,
                               .hosts_per_leaf = 2,
                               .host_bytes_per_s = 100,
                               .oversubscription = 2,
                               .host_latency_s = 0,
                               .spine_latency_s = 0});
  REQUIRE(t.ok());
  // Each leaf-spine link carries 2 * 100 / 2 / 2 = 50 B/s. 0->2 hashes to spine (0+2)%2 = 0 and
  // 1->3 to spine 0 too: they share leaf 0's 50 B/s link to spine 0, 25 each.
  sim::Schedule s{"two", {{0, 2, 100, {}}, {1, 3, 100, {}}}};
  auto r = sim::Simulate(*t, s);
  REQUIRE(r.ok());
  CHECK(r->makespan_s == Approx(4.0).epsilon(1e-12));
  CHECK(t->Route(0, 3).size() == 4);
}

TEST_CASE("bad topologies and schedules are refused with the field named", "[flow_sim]") {
  CHECK(sim::Network::Racks({.racks = 0}).status().message().find("racks") != std::string::npos);
  CHECK(!sim::Network::Racks({.racks = 1, .hosts_per_rack = 1, .oversubscription = 0.5}).ok());
  const sim::Network t = Racks(1, 2, 100, 1);
  sim::Schedule bad{"bad", {{0, 5, 1, {}}}};
  CHECK(sim::Simulate(t, bad).status().message().find("transfer 0") != std::string::npos);
  sim::Schedule cyclic{"cyclic", {{0, 1, 1, {0}}}};
  CHECK(!sim::Simulate(t, cyclic).ok());
  CHECK(!sim::HalvingDoublingSchedule(std::vector<int>{0, 1, 2}, 1).ok());
  CHECK(!sim::RingSchedule(std::vector<int>{0, 0}, 1).ok());
}

TEST_CASE("Table 4.1 is reproduced by counting the schedules", "[table41]") {
  const double s = 1 << 20;
  for (auto [n, c] : std::vector<std::pair<int, int>>{{2, 2}, {4, 2}, {8, 2}, {2, 4}, {4, 4}}) {
    INFO("N=" << n << " C=" << c);
    auto rows = agg::ReproduceTable41(n, c, s);
    REQUIRE(rows.ok());
    REQUIRE(rows->size() == 5);
    const double N = n, C = c;
    const auto& ps = (*rows)[0];
    CHECK(ps.measured.rounds == 2);
    CHECK(ps.measured.wire_bytes == Approx(2 * (N * C - 1) * s));
    CHECK(ps.measured.wire_bytes == Approx(ps.seed_bytes));
    CHECK(ps.measured.cross_rack_bytes == Approx(ps.seed_cross_rack_bytes));

    const auto& hd = (*rows)[1];
    REQUIRE(hd.available);
    CHECK(hd.measured.rounds == static_cast<int>(hd.seed_rounds));
    CHECK(hd.measured.wire_bytes == Approx(hd.seed_bytes - 2 * s));  // 2(NC-1)S vs 2NCS
    CHECK(hd.measured.cross_rack_bytes == Approx(2 * (C - 1) * s));
    if (n == c) CHECK(hd.measured.cross_rack_bytes == Approx(hd.seed_cross_rack_bytes));

    const auto& ring = (*rows)[2];
    CHECK(ring.measured.rounds == 2 * n * c - 1);
    CHECK(ring.measured.wire_bytes == Approx(ring.seed_bytes));
    CHECK(ring.measured.cross_rack_bytes == Approx((2 * C - 1) * s));
    CHECK(ring.measured.cross_rack_bytes == Approx(ring.seed_cross_rack_bytes));

    const auto& tree = (*rows)[3];
    CHECK(tree.available == !(n == 2 && c == 4));  // 8 ranks are not a power of fan-out 4
    if (tree.available) {
      CHECK(tree.measured.rounds == static_cast<int>(std::lround(tree.seed_rounds)));
      CHECK(tree.measured.logical_bytes == Approx(tree.seed_bytes));
      CHECK(tree.measured.wire_bytes == Approx(2 * (N * C - 1) * s));
      CHECK(tree.measured.cross_rack_bytes == Approx(2 * (C - 1) * s));
    }

    const auto& two = (*rows)[4];
    CHECK(two.measured.rounds == 4);
    CHECK(two.measured.wire_bytes == Approx(two.seed_bytes));
    CHECK(two.measured.cross_rack_bytes == Approx(two.seed_cross_rack_bytes));
  }
}

TEST_CASE("rack-by-rack layout gives the minimum cross-rack bytes (brute force)", "[table41]") {
  const double s = 1024;
  for (auto [n, c] : std::vector<std::pair<int, int>>{{4, 2}, {2, 4}}) {
    INFO("N=" << n << " C=" << c);
    const int p = n * c;
    std::vector<int> hosts(p);
    std::iota(hosts.begin(), hosts.end(), 0);
    std::vector<sim::Schedule> schedules{*sim::ShardedPsSchedule(hosts, s),
                                         *sim::HalvingDoublingSchedule(hosts, s),
                                         *sim::RingChunkedSchedule(hosts, s)};
    if (c == 2) schedules.push_back(*sim::TreeSchedule(hosts, s, c));
    // Every assignment of ranks to racks with n ranks each.
    std::vector<int> rack_of(p);
    for (int h = 0; h < p; ++h) rack_of[h] = h / n;
    std::vector<double> contiguous, best;
    for (const auto& sched : schedules) {
      contiguous.push_back(sim::Count(sched, rack_of).cross_rack_bytes);
      best.push_back(contiguous.back());
    }
    std::vector<int> layout = rack_of;
    int placements = 0;
    do {
      ++placements;
      for (size_t k = 0; k < schedules.size(); ++k) {
        best[k] = std::min(best[k], sim::Count(schedules[k], layout).cross_rack_bytes);
      }
    } while (std::next_permutation(layout.begin(), layout.end()));
    CHECK(placements == (c == 2 ? 70 : 2520));
    for (size_t k = 0; k < schedules.size(); ++k) {
      INFO(schedules[k].name);
      CHECK(best[k] == Approx(contiguous[k]));
    }
  }
}

TEST_CASE("the PBox inequality says when the hierarchy pays, and the simulator agrees",
          "[hierarchy]") {
  const int n = 8, racks = 4;
  const double worker = 7e9, pbox = 70e9;
  const double bytes = 100e6;
  for (bool oversubscribed : {true, false}) {
    INFO("oversubscribed core: " << oversubscribed);
    // hosts_per_rack = 9 (8 workers + the box); uplink = 9 * 7e9 / oversubscription.
    const double oversub = oversubscribed ? 6.3 : 1.0;
    const double core = 9 * worker / oversub;
    auto choice = agg::ChooseHierarchy({.workers_per_rack = n,
                                        .racks = racks,
                                        .pbox_bytes_per_s = pbox,
                                        .core_bytes_per_s = core,
                                        .worker_bytes_per_s = worker});
    REQUIRE(choice.ok());
    INFO(choice->explanation);
    CHECK(choice->use_hierarchy == oversubscribed);
    CHECK(choice->flat_s_per_byte == Approx(n * (racks - 1.0) / (racks * core)));
    CHECK(choice->local_s_per_byte == Approx(1 / worker));
    CHECK(choice->cross_s_per_byte == Approx((racks - 1.0) / (racks * std::min(pbox, core))));

    sim::Network t = Racks(racks, n + 1, worker, oversub);
    const agg::PboxLayout layout = agg::RackPboxLayout(racks, n);
    for (int box : layout.pbox) REQUIRE(t.SetHostBandwidth(box, pbox, pbox).ok());
    auto flat = sim::Simulate(t, *agg::PboxFlatSchedule(layout, bytes));
    REQUIRE(flat.ok());
    for (auto cross : {agg::CrossRack::kShardedPs, agg::CrossRack::kRing}) {
      auto hier = sim::Simulate(t, *agg::PboxHierarchicalSchedule(layout, bytes, cross));
      REQUIRE(hier.ok());
      INFO("flat " << flat->makespan_s << " s, hierarchical " << hier->makespan_s << " s");
      CHECK((hier->makespan_s < flat->makespan_s) == oversubscribed);
      // Cross-rack bytes drop by 1/N with the hierarchy (sharded exchange).
      if (cross == agg::CrossRack::kShardedPs) {
        CHECK(hier->cross_rack_link_bytes * n == Approx(flat->cross_rack_link_bytes));
      }
    }
  }
  CHECK(!agg::ChooseHierarchy({.workers_per_rack = 0}).ok());
}

TEST_CASE("a 2LHA plan verifies and evaluates to the exact sum", "[plan]") {
  const agg::Plan plan = SmallPlan();
  REQUIRE(agg::VerifyPlan(plan).ok());
  CHECK(plan.chunks.size() == 4);
  // GMs spread over groups, LMs over members.
  std::vector<int> gm_count(8, 0);
  for (const auto& c : plan.chunks) ++gm_count[c.gm];
  CHECK(*std::max_element(gm_count.begin(), gm_count.end()) == 1);
  std::vector<std::vector<float>> in(8, std::vector<float>(10));
  for (int u = 0; u < 8; ++u) {
    for (int k = 0; k < 10; ++k) in[u][k] = static_cast<float>(u + 10 * k);
  }
  auto out = agg::EvaluatePlan(plan, in, 0.5f);
  REQUIRE(out.ok());
  for (int u = 0; u < 8; ++u) {
    for (int k = 0; k < 10; ++k) CHECK((*out)[u][k] == 0.5f * static_cast<float>(28 + 80 * k));
  }
  const std::vector<int> rounds = agg::CommunicationRounds(plan);
  CHECK(*std::max_element(rounds.begin(), rounds.end()) == 4);
}

TEST_CASE("the verifier rejects broken plans, naming the step", "[plan]") {
  SECTION("a missing send") {
    agg::Plan plan = SmallPlan();
    RemoveStep(plan, FindStep(plan, agg::StepKind::kSend));
    const auto s = agg::VerifyPlan(plan);
    CHECK(s.message().find("no earlier send") != std::string::npos);
  }
  SECTION("a contribution left out of a sum") {
    agg::Plan plan = SmallPlan();
    const int agg_step = FindStep(plan, agg::StepKind::kAggregate);
    plan.steps[agg_step].after.pop_back();
    // The GM then holds a partial sum when it optimizes.
    CHECK(agg::VerifyPlan(plan).message().find("partial sum") != std::string::npos);
  }
  SECTION("a receive never consumed") {
    agg::Plan plan;
    plan.nodes = 2;
    plan.groups = {{0, 1}};
    plan.chunks = {{0, 1, 1, {1}}};
    plan.steps = {
        {agg::StepKind::kSend, 0, 0, {1}, {}},       {agg::StepKind::kReceive, 1, 0, {0}, {}},
        {agg::StepKind::kAggregate, 1, 0, {}, {1}},  {agg::StepKind::kOptimize, 1, 0, {}, {2}},
        {agg::StepKind::kBroadcast, 1, 0, {0}, {3}}, {agg::StepKind::kReceive, 0, 0, {1}, {}, true},
        {agg::StepKind::kSend, 0, 0, {1}, {5}},      {agg::StepKind::kReceive, 1, 0, {0}, {}}};
    CHECK(agg::VerifyPlan(plan).message().find("step 7") != std::string::npos);
    CHECK(agg::VerifyPlan(plan).message().find("never aggregated") != std::string::npos);
    plan.steps.resize(6);
    CHECK(agg::VerifyPlan(plan).ok());
  }
  SECTION("a contribution counted twice") {
    agg::Plan plan = SmallPlan();
    const int agg_step = FindStep(plan, agg::StepKind::kAggregate);
    plan.steps[agg_step].after.push_back(plan.steps[agg_step].after.front());
    CHECK(agg::VerifyPlan(plan).message().find("second time") != std::string::npos);
  }
  SECTION("no optimizer") {
    agg::Plan plan = SmallPlan();
    RemoveStep(plan, FindStep(plan, agg::StepKind::kOptimize));
    CHECK(agg::VerifyPlan(plan).message().find("not optimized") != std::string::npos);
  }
  SECTION("two optimizers") {
    agg::Plan plan = SmallPlan();
    const int opt = FindStep(plan, agg::StepKind::kOptimize);
    agg::Step copy = plan.steps[opt];
    copy.after = {opt};
    plan.steps.insert(plan.steps.begin() + opt + 1, copy);
    for (size_t i = opt + 2; i < plan.steps.size(); ++i) {
      for (int& a : plan.steps[i].after) {
        if (a > opt) ++a;
      }
    }
    CHECK(agg::VerifyPlan(plan).message().find("optimizes a second time") != std::string::npos);
  }
  SECTION("a member left out of the broadcast") {
    agg::Plan plan = SmallPlan();
    RemoveStep(plan, static_cast<int>(plan.steps.size()) - 1);
    CHECK(agg::VerifyPlan(plan).message().find("never received") != std::string::npos);
  }
  SECTION("an optimizer on a partial sum") {
    agg::Plan plan;
    plan.nodes = 2;
    plan.groups = {{0, 1}};
    plan.chunks = {{0, 1, 1, {1}}};
    plan.steps = {{agg::StepKind::kSend, 0, 0, {1}, {}},
                  {agg::StepKind::kReceive, 1, 0, {0}, {}},
                  {agg::StepKind::kOptimize, 1, 0, {}, {}},
                  {agg::StepKind::kAggregate, 1, 0, {}, {1, 2}}};
    const auto s = agg::VerifyPlan(plan);
    CHECK(s.message().find("step 2") != std::string::npos);
    CHECK(s.message().find("partial sum") != std::string::npos);
  }
  SECTION("groups that do not partition the nodes") {
    CHECK(!agg::BuildTwoLevelPlan({{0, 1}, {1, 2}}, 4).ok());
    CHECK(!agg::BuildTwoLevelPlan({{0, 1}, {}}, 4).ok());
  }
}
