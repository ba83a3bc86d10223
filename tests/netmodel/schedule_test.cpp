// Collective schedules (plexus/netmodel/schedule.hpp): the builders' transfers, rounds and
// dependencies; the three pricing rules on hand-computed instances; the cost models as priced
// schedules; the simulator's allreduces as placed schedules, run on a fabric.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "plexus/netmodel/flow_schedules.hpp"
#include "plexus/netmodel/flow_sim.hpp"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/netmodel/schedule.hpp"

namespace pn = plexus::netmodel;
namespace sim = plexus::netmodel::sim;
using pn::Pricing;
using pn::Schedule;

namespace {

struct Edge {
  int src, dst;
  double bytes;
  int round;
  bool operator==(const Edge&) const = default;
};

std::vector<Edge> Edges(const Schedule& s) {
  std::vector<Edge> e;
  for (const auto& t : s.transfers) e.push_back({t.src, t.dst, t.bytes, t.round});
  return e;
}

pn::CostMatrix Matrix(const std::vector<std::vector<double>>& rows) {
  pn::CostMatrix m;
  m.n = static_cast<int>(rows.size());
  for (int i = 0; i < m.n; ++i) {
    m.labels.push_back("h" + std::to_string(i));
    for (double v : rows[i]) m.latency_us.push_back(v);
  }
  return m;
}

void CheckDag(const Schedule& s) {
  for (size_t i = 0; i < s.transfers.size(); ++i) {
    for (int d : s.transfers[i].after) {
      CHECK(d >= 0);
      CHECK(static_cast<size_t>(d) < i);
      CHECK(s.transfers[d].round < s.transfers[i].round);  // rounds follow dependencies
    }
  }
}

}  // namespace

TEST_CASE("ring: 2(n-1) rounds of n hops, each after the previous receive", "[schedule]") {
  auto s = pn::RingAllreduceSchedule(4, 400);
  REQUIRE(s.ok());
  CHECK(s->name == "ring");
  CHECK(s->bytes == 400);
  REQUIRE(s->transfers.size() == 6 * 4);
  CheckDag(*s);
  for (int step = 0; step < 6; ++step) {
    for (int r = 0; r < 4; ++r) {
      const auto& t = s->transfers[step * 4 + r];
      CHECK(t.src == r);
      CHECK(t.dst == (r + 1) % 4);
      CHECK(t.bytes == 100);
      CHECK(t.round == step);
      // The transfer into r of the previous round: from r - 1.
      CHECK(t.after ==
            (step == 0 ? std::vector<int>{} : std::vector<int>{(step - 1) * 4 + (r + 3) % 4}));
    }
  }
  auto sliced = pn::RingAllreduceSchedule(3, 300, 2);
  REQUIRE(sliced.ok());
  CHECK(sliced->transfers.size() == 2 * 4 * 3);
  CHECK(sliced->transfers[0].bytes == 50);
  CHECK(pn::RingAllreduceSchedule(1, 10)->transfers.empty());
  CHECK(!pn::RingAllreduceSchedule(3, 10, 0).ok());
  CHECK(!pn::RingAllreduceSchedule(0, 10).ok());
  CHECK(!pn::RingAllreduceSchedule(3, -1).ok());
}

TEST_CASE("halving-doubling: the fold, the halving far or near first, doubling, unfold",
          "[schedule]") {
  // n = 6: p2 = 4, positions 0 -> 1 and 2 -> 3 fold in; the core is 1, 3, 4, 5.
  auto s = pn::HalvingDoublingSchedule(6, 16);
  REQUIRE(s.ok());
  CheckDag(*s);
  std::vector<Edge> want = {{0, 1, 16, 0}, {2, 3, 16, 0}};
  const int core[4] = {1, 3, 4, 5};
  auto round = [&](int mask, double bytes, int r) {
    for (int np = 0; np < 4; ++np) want.push_back({core[np], core[np ^ mask], bytes, r});
  };
  round(2, 8, 1);
  round(1, 4, 2);
  round(1, 4, 3);
  round(2, 8, 4);
  want.push_back({1, 0, 16, 5});
  want.push_back({3, 2, 16, 5});
  CHECK(Edges(*s) == want);
  // The first halving round waits for the fold into its sender: 1 <- 0 (transfer 0).
  CHECK(s->transfers[2].after == std::vector<int>{0});
  CHECK(s->transfers[4].after.empty());  // position 4 received nothing yet

  auto near = pn::HalvingDoublingSchedule(4, 16, pn::HalvingOrder::kNearFirst);
  REQUIRE(near.ok());
  CHECK(near->transfers[0].dst == 1);  // partner 0 xor 1 first, half the buffer
  CHECK(near->transfers[0].bytes == 8);
  CHECK(near->transfers[4].dst == 2);  // then 0 xor 2, a quarter
  CHECK(near->transfers[4].bytes == 4);
  CHECK(pn::HalvingDoublingSchedule(1, 16)->transfers.empty());
}

TEST_CASE("double binary tree: in-order trees, the second shifted; reduce then broadcast",
          "[schedule]") {
  // n = 4: tree 1 rooted at 1 (children 0 and 2, 2 -> 3); tree 2 rooted at 0 (children 3 and
  // 1, 1 -> 2). Broadcast only: one transfer per edge, depth-first, half the buffer each.
  auto down = pn::DoubleBinaryTreeSchedule(4, 10, /*reduce=*/false);
  REQUIRE(down.ok());
  CheckDag(*down);
  CHECK(Edges(*down) ==
        std::vector<Edge>{
            {1, 0, 5, 0}, {1, 2, 5, 0}, {2, 3, 5, 1}, {0, 3, 5, 0}, {0, 1, 5, 0}, {1, 2, 5, 1}});
  CHECK(down->transfers[2].after == std::vector<int>{1});
  CHECK(down->transfers[5].after == std::vector<int>{4});

  auto all = pn::DoubleBinaryTreeSchedule(4, 10);
  REQUIRE(all.ok());
  CheckDag(*all);
  REQUIRE(all->transfers.size() == 12);
  // Tree 1: 3 -> 2 (round 0), then 0 -> 1 and 2 -> 1 (round 1), then the broadcast.
  CHECK(Edges(*all)[0] == Edge{3, 2, 5, 0});
  CHECK(Edges(*all)[1] == Edge{0, 1, 5, 1});
  CHECK(Edges(*all)[2] == Edge{2, 1, 5, 1});
  CHECK(all->transfers[2].after == std::vector<int>{0});
  CHECK(Edges(*all)[3] == Edge{1, 0, 5, 2});
  CHECK(all->transfers[3].after == std::vector<int>{1, 2});  // the root once reduced
  CHECK(pn::DoubleBinaryTreeSchedule(1, 10)->transfers.empty());
}

TEST_CASE("bcube: a round per digit, every position to the base-1 that differ there",
          "[schedule]") {
  auto s = pn::BCubeSchedule(9, 90, 3);
  REQUIRE(s.ok());
  CheckDag(*s);
  REQUIRE(s->transfers.size() == 4 * 9 * 2);
  std::set<std::pair<int, int>> round0, round1;
  for (const auto& t : s->transfers) {
    if (t.round == 0) {
      round0.insert({t.src, t.dst});
      CHECK(t.bytes == 30);
      CHECK(t.src / 3 == t.dst / 3);
    }
    if (t.round == 1) {
      round1.insert({t.src, t.dst});
      CHECK(t.bytes == Approx(10));
      CHECK(t.src % 3 == t.dst % 3);
    }
  }
  CHECK(round0.size() == 18);
  CHECK(round1.size() == 18);
  // The all-gather runs the rounds backwards: round 2 pairs as round 1, round 3 as round 0.
  CHECK(s->transfers[18 * 2].round == 2);
  CHECK(s->transfers[18 * 2].dst % 3 == s->transfers[18 * 2].src % 3);
  auto bad = pn::BCubeSchedule(6, 1, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) == "bcube: n must be a power of its base 2; got n = 6");
  CHECK(!pn::BCubeSchedule(4, 1, 1).ok());
}

TEST_CASE("sharded PS, ring-chunked and the fan-out tree", "[schedule]") {
  auto ps = pn::ShardedPsSchedule(3, 30);
  REQUIRE(ps.ok());
  CheckDag(*ps);
  REQUIRE(ps->transfers.size() == 12);
  CHECK(ps->transfers[6].src == 0);  // pull: the owner of shard 0 sends it back
  CHECK(ps->transfers[6].after == std::vector<int>{2, 4});  // after 1 -> 0 and 2 -> 0
  CHECK(ps->transfers[6].round == 1);

  auto rc = pn::RingChunkedSchedule(3, 30);
  REQUIRE(rc.ok());
  CheckDag(*rc);
  CHECK(
      Edges(*rc) ==
      std::vector<Edge>{{0, 1, 30, 0}, {1, 2, 30, 1}, {2, 0, 30, 2}, {0, 1, 30, 3}, {1, 2, 30, 4}});

  // Fan-out 2 over 4: up 0<-0, 0<-1, 2<-2, 2<-3, then 0<-0, 0<-2; down mirrors it.
  auto tree = pn::FanoutTreeSchedule(4, 8, 2);
  REQUIRE(tree.ok());
  CheckDag(*tree);
  CHECK(Edges(*tree) == std::vector<Edge>{{0, 0, 8, 0},
                                          {1, 0, 8, 0},
                                          {2, 2, 8, 0},
                                          {3, 2, 8, 0},
                                          {0, 0, 8, 1},
                                          {2, 0, 8, 1},
                                          {0, 0, 8, 2},
                                          {0, 2, 8, 2},
                                          {0, 0, 8, 3},
                                          {0, 1, 8, 3},
                                          {2, 2, 8, 3},
                                          {2, 3, 8, 3}});
  CHECK(!pn::FanoutTreeSchedule(6, 8, 2).ok());
  CHECK(!pn::FanoutTreeSchedule(4, 8, 1).ok());
}

TEST_CASE("pricing: rounds add their dearest transfer, chains their sums, links the buffer",
          "[schedule]") {
  const pn::CostMatrix m = Matrix({{0, 1, 7}, {2, 0, 3}, {4, 5, 0}});
  Schedule s{"hand", {}, 100};
  s.transfers = {{0, 1, 10, {}, -1, 0},
                 {1, 2, 10, {0}, -1, 1},
                 {2, 0, 10, {}, -1, 0},
                 {0, 1, 10, {1}, -1, 2},
                 {1, 1, 10, {3}, -1, 3}};  // the last a local step
  auto price = [&](Pricing p, std::vector<int> order) {
    auto c = pn::PriceSchedule(s, p, m, order);
    REQUIRE(c.ok());
    return *c;
  };
  // Rounds: max(0->1, 2->0) + 1->2 + 0->1 = max(1, 4) + 3 + 1.
  CHECK(price(Pricing::kRounds, {0, 1, 2}) == 4 + 3 + 1);
  // Chains: 0->1, 1->2, 0->1 (1 + 3 + 1) against 2->0 alone (4).
  CHECK(price(Pricing::kChains, {0, 1, 2}) == 5);
  // Links, once each: 0->1, 1->2, 2->0.
  CHECK(price(Pricing::kLinks, {0, 1, 2}) == 1 + 3 + 4);
  // With nodes 2, 0, 1 at positions 0, 1, 2: 0->1 is 2->0 (4), 1->2 is 0->1 (1), 2->0 is 1->2 (3).
  CHECK(price(Pricing::kRounds, {2, 0, 1}) == 4 + 1 + 4);
  CHECK(price(Pricing::kLinks, {2, 0, 1}) == 4 + 1 + 3);

  pn::CostMatrix bw = m;
  bw.bandwidth_gbps.assign(9, 8);  // 1 byte = 1e-3 us
  auto links = pn::PriceSchedule(s, Pricing::kLinks, bw, {0, 1, 2});
  REQUIRE(links.ok());
  CHECK(*links == Approx(1 + 3 + 4 + 3 * 0.1));  // each link at the whole buffer, 100 bytes

  CHECK(!pn::PriceSchedule(s, Pricing::kRounds, m, {0, 1}).ok());  // position 2 has no node
  CHECK(!pn::PriceSchedule(s, Pricing::kRounds, m, {0, 1, 3}).ok());
}

TEST_CASE("the cost models are their schedules priced", "[schedule]") {
  pn::CostMatrix m = Matrix({{0, 3, 9, 4, 2, 8, 1, 6},
                             {5, 0, 2, 7, 3, 3, 9, 1},
                             {2, 8, 0, 1, 6, 4, 4, 2},
                             {7, 1, 5, 0, 9, 2, 3, 8},
                             {3, 6, 2, 8, 0, 5, 1, 4},
                             {9, 2, 7, 3, 1, 0, 6, 5},
                             {4, 9, 3, 6, 5, 2, 0, 7},
                             {1, 5, 8, 2, 7, 6, 3, 0}});
  m.bandwidth_gbps.assign(64, 2);
  const std::vector<int> order = {5, 2, 7, 0, 3, 6, 1, 4};
  for (int model = 0; model < 4; ++model) {
    const pn::CostOptions options{
        .model = static_cast<pn::CostModel>(model), .bytes = 3e4, .bcube_base = 2};
    for (int n : {5, 8}) {
      if (options.model == pn::CostModel::kBCube && n != 8) continue;
      pn::CostMatrix sub = m;
      std::vector<int> o(order.begin(), order.begin() + n);
      if (n < 8) {
        sub = Matrix({});
        sub.n = n;
        for (int i = 0; i < n; ++i) {
          sub.labels.push_back("h");
          for (int j = 0; j < n; ++j) {
            sub.latency_us.push_back(m.latency(i, j));
            sub.bandwidth_gbps.push_back(2);
          }
        }
        o = {3, 0, 4, 1, 2};
      }
      auto schedule = pn::CostModelSchedule(n, options);
      REQUIRE(schedule.ok());
      auto priced = pn::PriceSchedule(*schedule, pn::CostModelPricing(options.model), sub, o);
      auto cost = pn::OrderCost(sub, o, options);
      REQUIRE(priced.ok());
      REQUIRE(cost.ok());
      INFO(pn::CostModelName(options.model) << " n " << n);
      CHECK(*priced == *cost);
    }
  }
  CHECK(pn::CostModelPricing(pn::CostModel::kRing) == Pricing::kLinks);
  CHECK(pn::CostModelPricing(pn::CostModel::kHalvingDoubling) == Pricing::kRounds);
  CHECK(pn::CostModelPricing(pn::CostModel::kDoubleBinaryTree) == Pricing::kChains);
  CHECK(pn::CostModelPricing(pn::CostModel::kBCube) == Pricing::kRounds);
}

TEST_CASE("the simulator's allreduces are the schedules placed on hosts", "[schedule]") {
  const std::vector<int> hosts = {6, 1, 4, 0, 7, 2, 5, 3};
  auto same = [&](const absl::StatusOr<Schedule>& placed, const absl::StatusOr<Schedule>& over) {
    REQUIRE(placed.ok());
    REQUIRE(over.ok());
    auto mapped = pn::PlaceSchedule(*over, hosts);
    REQUIRE(mapped.ok());
    CHECK(placed->name == mapped->name);
    CHECK(Edges(*placed) == Edges(*mapped));
    for (size_t i = 0; i < placed->transfers.size(); ++i) {
      CHECK(placed->transfers[i].after == over->transfers[i].after);
    }
  };
  same(sim::RingSchedule(hosts, 800, 2), pn::RingAllreduceSchedule(8, 800, 2));
  same(sim::ShardedPsSchedule(hosts, 800), pn::ShardedPsSchedule(8, 800));
  same(sim::RingChunkedSchedule(hosts, 800, 3), pn::RingChunkedSchedule(8, 800, 3));
  same(sim::HalvingDoublingSchedule(hosts, 800),
       pn::HalvingDoublingSchedule(8, 800, pn::HalvingOrder::kNearFirst));
  same(sim::TreeSchedule(hosts, 800, 2), pn::FanoutTreeSchedule(8, 800, 2));
  CHECK(!pn::PlaceSchedule(*pn::RingAllreduceSchedule(9, 1), hosts).ok());

  // The simulator runs any of them: the cost models' halving-doubling with its fold, over
  // 6 hosts on two racks, takes 1 + 2 + 2 + 1 dependent rounds.
  auto fabric = sim::Network::Racks({.racks = 2, .hosts_per_rack = 3});
  REQUIRE(fabric.ok());
  auto hd = pn::HalvingDoublingSchedule(6, 6e6);
  REQUIRE(hd.ok());
  auto placed = pn::PlaceSchedule(*hd, std::vector<int>{0, 3, 1, 4, 2, 5});
  REQUIRE(placed.ok());
  auto run = sim::Simulate(*fabric, *placed);
  REQUIRE(run.ok());
  CHECK(run->makespan_s > 0);
  CHECK(sim::Count(*placed, fabric->rack_of()).rounds == 6);
  auto dbt = pn::DoubleBinaryTreeSchedule(6, 6e6);
  REQUIRE(dbt.ok());
  CHECK(sim::Simulate(*fabric, *dbt).ok());
}

namespace {

// What each position holds of each piece: the set of positions whose contribution it sums
// (bit p: position p's), as a symbolic execution of a schedule that checks what the pieces say.
using Holdings = std::vector<std::vector<uint64_t>>;  // [position][piece]

// Runs `s` over `start`, run by run (consecutive transfers of one round): every send of a run
// reads what its sender held before the run. A combining receive adds the sender's set (and
// must not count a contribution twice); any other receive replaces the receiver's. Returns an
// empty string or the first violation.
std::string Execute(const Schedule& s, int n, Holdings& held) {
  const int pieces = s.pieces;
  if (pieces < 1) return "no pieces";
  std::vector<std::vector<uint8_t>> sent_on(n, std::vector<uint8_t>(pieces, 1));
  for (size_t begin = 0; begin < s.transfers.size();) {
    size_t end = begin;
    while (end < s.transfers.size() && s.transfers[end].round == s.transfers[begin].round) ++end;
    const Holdings before = held;
    for (size_t i = begin; i < end; ++i) {
      const auto& t = s.transfers[i];
      for (int x = 0; x < t.piece_count; ++x) {
        const int q = (t.first_piece + x) % pieces;
        const uint64_t in = before[t.src][q];
        if (in == 0) return "transfer " + std::to_string(i) + " sends a piece its sender lacks";
        if (t.combine) {
          if ((held[t.dst][q] & in) != 0) {
            return "transfer " + std::to_string(i) + " counts a contribution twice";
          }
          held[t.dst][q] |= in;
        } else {
          // A result may replace a partial sum only once that partial sum has been sent on.
          if (held[t.dst][q] != 0 && !sent_on[t.dst][q] && (held[t.dst][q] & ~in) == 0 &&
              held[t.dst][q] != in) {
            return "transfer " + std::to_string(i) + " overwrites a partial sum not sent on";
          }
          held[t.dst][q] = in;
        }
        sent_on[t.dst][q] = 0;
      }
    }
    for (size_t i = begin; i < end; ++i) {
      const auto& t = s.transfers[i];
      for (int x = 0; x < t.piece_count; ++x) sent_on[t.src][(t.first_piece + x) % pieces] = 1;
    }
    begin = end;
  }
  return "";
}

Holdings Everyone(int n, int pieces) {
  Holdings h(n, std::vector<uint64_t>(pieces));
  for (int p = 0; p < n; ++p) {
    for (int q = 0; q < pieces; ++q) h[p][q] = uint64_t{1} << p;
  }
  return h;
}

}  // namespace

TEST_CASE("executable schedules: the pieces they name compute the collective", "[schedule]") {
  for (int n = 1; n <= 17; ++n) {
    INFO("n = " << n);
    const uint64_t all = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    const bool p2 = (n & (n - 1)) == 0;
    auto check_allreduce = [&](const absl::StatusOr<Schedule>& s) {
      REQUIRE(s.ok());
      INFO(s->name);
      Holdings held = Everyone(n, s->pieces);
      REQUIRE(Execute(*s, n, held) == "");
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < s->pieces; ++q) CHECK(held[p][q] == all);
      }
    };
    check_allreduce(pn::RingAllreduceSchedule(n, 1));
    check_allreduce(pn::RingAllreduceSchedule(n, 1, 3));
    check_allreduce(pn::HalvingDoublingSchedule(n, 1));
    check_allreduce(pn::HalvingDoublingSchedule(n, 1, pn::HalvingOrder::kNearFirst));
    check_allreduce(pn::RecursiveDoublingSchedule(n, 1));
    if (n >= 2) check_allreduce(pn::DoubleBinaryTreeSchedule(n, 1));
    check_allreduce(pn::ShardedPsSchedule(n, 1));

    // Reduce-scatters: position p ends with its piece summed over everyone (the ring's p + 1).
    auto rs = pn::RingAllreduceSchedule(n, 1, 1, pn::Phases::kReduceScatter);
    REQUIRE(rs.ok());
    Holdings held = Everyone(n, n);
    REQUIRE(Execute(*rs, n, held) == "");
    for (int p = 0; p < n; ++p) CHECK(held[p][(p + 1) % n] == all);
    // All-gathers: position p starts with only its piece (the ring's p + 1), ends with all.
    auto gathers = [&](const absl::StatusOr<Schedule>& s, int shift) {
      REQUIRE(s.ok());
      INFO(s->name);
      Holdings h(n, std::vector<uint64_t>(n));
      for (int p = 0; p < n; ++p) h[p][(p + shift) % n] = uint64_t{1} << ((p + shift) % n);
      REQUIRE(Execute(*s, n, h) == "");
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < n; ++q) CHECK(h[p][q] == uint64_t{1} << q);
      }
    };
    gathers(pn::RingAllreduceSchedule(n, 1, 1, pn::Phases::kAllGather), 1);
    gathers(pn::BruckAllgatherSchedule(n, 1), 0);
    if (p2) {
      auto halving = pn::HalvingDoublingSchedule(n, 1, pn::HalvingOrder::kFarFirst,
                                                 pn::Phases::kReduceScatter);
      REQUIRE(halving.ok());
      Holdings h = Everyone(n, n);
      REQUIRE(Execute(*halving, n, h) == "");
      for (int p = 0; p < n; ++p) CHECK(h[p][p] == all);
      gathers(
          pn::HalvingDoublingSchedule(n, 1, pn::HalvingOrder::kFarFirst, pn::Phases::kAllGather),
          0);
    } else {
      CHECK(!pn::HalvingDoublingSchedule(n, 1, pn::HalvingOrder::kFarFirst,
                                         pn::Phases::kReduceScatter)
                 .ok());
    }
  }
}

TEST_CASE("the symbolic execution catches a wrong piece", "[schedule]") {
  // The checker itself: a ring whose all-gather forwards the wrong piece leaves a hole.
  auto s = pn::RingAllreduceSchedule(4, 1);
  REQUIRE(s.ok());
  s->transfers.back().first_piece = (s->transfers.back().first_piece + 1) % 4;
  Holdings held = Everyone(4, 4);
  const std::string error = Execute(*s, 4, held);
  bool complete = error.empty();
  for (int p = 0; p < 4 && complete; ++p) {
    for (int q = 0; q < 4; ++q) complete = complete && held[p][q] == 15;
  }
  CHECK(!complete);
  // Counting a contribution twice is refused.
  auto twice = pn::RecursiveDoublingSchedule(2, 1);
  REQUIRE(twice.ok());
  twice->transfers.push_back(twice->transfers.front());
  twice->transfers.back().round = 9;
  Holdings h2 = Everyone(2, 1);
  CHECK(Execute(*twice, 2, h2) == "transfer 2 counts a contribution twice");
}
