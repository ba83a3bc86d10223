// Replica selection: logarithmic gossip trigger sequences, Daronpon's redirect rule and one-hop
// limit, estimates from piggyback and gossip, and determinism of the seeded policies.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include <catch2/catch.hpp>

#include "plexus/rpc/balance.hpp"

using plexus::rpc::BalanceCall;
using plexus::rpc::BalancePolicy;
using plexus::rpc::Balancer;
using plexus::rpc::BalancerOptions;
using plexus::rpc::GossipTrigger;
using plexus::rpc::LoadReport;

namespace {

// Feeds `counts` in order and returns the announced values.
std::vector<uint32_t> Announced(GossipTrigger& trigger, const std::vector<uint32_t>& counts) {
  std::vector<uint32_t> out;
  for (uint32_t c : counts) {
    if (auto a = trigger.Observe(c)) out.push_back(*a);
  }
  return out;
}

std::vector<uint32_t> Range(uint32_t from, uint32_t to) {  // inclusive, either direction
  std::vector<uint32_t> v;
  if (from <= to) {
    for (uint32_t i = from; i <= to; ++i) v.push_back(i);
  } else {
    for (uint32_t i = from + 1; i-- > to;) v.push_back(i);
  }
  return v;
}

std::unique_ptr<Balancer> Make(BalancerOptions config) {
  auto b = Balancer::Create(config);
  REQUIRE(b.ok());
  return std::move(*b);
}

}  // namespace

TEST_CASE("gossip: 1 -> 8 announces 3 times, 8 -> 17 once (seed 2.5.5)", "[balance][gossip]") {
  GossipTrigger t(1);
  REQUIRE(Announced(t, {1}) == std::vector<uint32_t>{1});  // the state "at 1"
  CHECK(Announced(t, Range(2, 8)) == std::vector<uint32_t>{2, 4, 8});
  CHECK(t.level() == 8);
  CHECK(Announced(t, Range(9, 17)) == std::vector<uint32_t>{16});
  CHECK(t.level() == 16);
}

TEST_CASE("gossip: after announcing 2, next at 4 up or 1 down (seed 2.3.3)", "[balance][gossip]") {
  GossipTrigger t(1);
  Announced(t, {1, 2});
  CHECK(Announced(t, {3, 2, 3}).empty());
  CHECK(Announced(t, {4}) == std::vector<uint32_t>{4});
  GossipTrigger down(1);
  Announced(down, {1, 2});
  CHECK(Announced(down, {1}) == std::vector<uint32_t>{1});
}

TEST_CASE("gossip: floor 4 is silent below 4; staying in (4, 16) after 8 never gossips",
          "[balance][gossip]") {
  GossipTrigger t(4);
  CHECK(Announced(t, {0, 1, 2, 3, 2, 3, 1, 0}).empty());
  CHECK(Announced(t, Range(1, 8)) == std::vector<uint32_t>{4, 8});
  // Between 5 and 15 after announcing 8: the "no liveness guarantee" band.
  CHECK(Announced(t, {9, 12, 15, 10, 7, 5, 6, 15}).empty());
  CHECK(Announced(t, {4}) == std::vector<uint32_t>{4});
}

TEST_CASE("gossip: a sharp drop below the floor gets one final announcement", "[balance][gossip]") {
  GossipTrigger t(4);
  CHECK(Announced(t, {64}) == std::vector<uint32_t>{64});
  CHECK(Announced(t, {2}) == std::vector<uint32_t>{2});  // "below threshold"
  CHECK(t.level() == 0);
  CHECK(Announced(t, {1, 3, 0, 3}).empty());             // silent while below the floor
  CHECK(Announced(t, {5}) == std::vector<uint32_t>{5});  // first count at or above the floor again
  // Stepping down one call at a time: each halving, then the final one under the floor.
  GossipTrigger step(4);
  Announced(step, Range(1, 32));
  CHECK(Announced(step, Range(31, 0)) == std::vector<uint32_t>{16, 8, 4, 2});
  // Wobbling around the floor after announcing 4 stays silent until the count halves.
  GossipTrigger wobble(4);
  CHECK(Announced(wobble, {3, 4, 3, 4, 3, 5, 3}) == std::vector<uint32_t>{4});
  CHECK(Announced(wobble, {2}) == std::vector<uint32_t>{2});
}

TEST_CASE("gossip: floor 0 also announces zero; floor 1 does so only as the final one",
          "[balance][gossip]") {
  GossipTrigger zero(0);
  CHECK(Announced(zero, {0, 1, 0, 1, 2, 1}) == std::vector<uint32_t>{0, 1, 0, 1, 2, 1});
  GossipTrigger one(1);
  CHECK(Announced(one, {0, 1, 0, 0, 1, 2}) == std::vector<uint32_t>{1, 0, 1, 2});
}

TEST_CASE("balancer: configuration errors name the problem", "[balance]") {
  BalancerOptions c;
  c.replicas = 0;
  auto none = Balancer::Create(c);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() == "balancer: a service needs at least one replica, got 0");
  c.replicas = 3;
  c.local = {3};
  CHECK(Balancer::Create(c).status().message() ==
        "balancer: local replica 3 is out of range (3 replicas)");
  c.local = {1, 1};
  CHECK(Balancer::Create(c).status().message() == "balancer: local replica 1 is listed twice");
  c.local = {};
  c.max_hops = 2;
  CHECK(Balancer::Create(c).status().message() ==
        "balancer: max_hops is at most 1 (one redirect), got 2");
  CHECK(plexus::rpc::ParseBalancePolicy("po2").value() == BalancePolicy::kPowerOfTwo);
  CHECK(plexus::rpc::ParseBalancePolicy("jsq").status().message() ==
        "unknown balancing policy 'jsq'; expected round_robin, random, po2 or daronpon");
}

TEST_CASE("balancer: bad reports and duplicate responses are errors, not corruption", "[balance]") {
  BalancerOptions c;
  c.replicas = 2;
  c.local = {0};
  auto b = Make(c);
  CHECK(b->OnGossip({7, 1}).message() ==
        "balancer: load report for unknown replica 7 (2 replicas)");
  CHECK(b->OnSend(2).status().message() == "balancer: send to unknown replica 2 (2 replicas)");
  CHECK(b->OnResponse(0, std::nullopt).status().message() ==
        "balancer: response from replica 0 with no call in flight (duplicate?)");
  CHECK(b->outstanding(0) == 0);
  // A report about a local replica does not override the exact count.
  REQUIRE(b->OnSend(0).ok());
  REQUIRE(b->OnGossip({0, 50}).ok());
  CHECK(b->Load(0) == 1);
}

TEST_CASE("daronpon: redirect only when estimate + delta < local count", "[balance][daronpon]") {
  BalancerOptions c;
  c.replicas = 3;
  c.local = {0};
  c.delta = 2;
  c.count_redirects = false;
  auto b = Make(c);
  for (int i = 0; i < 5; ++i) REQUIRE(b->OnSend(0).ok());  // local count 5
  REQUIRE(b->OnGossip({1, 3}).ok());                       // 3 + 2 = 5: not lower, admit
  REQUIRE(b->OnGossip({2, 4}).ok());
  auto admit = b->Pick({0, 0});
  CHECK(admit.replica == 0);
  CHECK_FALSE(admit.redirected);
  REQUIRE(b->OnGossip({2, 2}).ok());  // 2 + 2 < 5: redirect to 2, the minimum
  auto redirect = b->Pick({0, 0});
  CHECK(redirect.replica == 2);
  CHECK(redirect.redirected);
  // delta 0: the minimum whenever it is strictly lower.
  c.delta = 0;
  auto eager = Make(c);
  REQUIRE(eager->OnSend(0).ok());
  REQUIRE(eager->OnGossip({1, 1}).ok());
  REQUIRE(eager->OnGossip({2, 1}).ok());
  CHECK(eager->Pick({0, 0}).replica == 0);  // 1 + 0 is not lower than 1
  REQUIRE(eager->OnSend(0).ok());
  CHECK(eager->Pick({0, 0}).redirected);
}

TEST_CASE("daronpon with costs compares expected completion times, not counts",
          "[balance][daronpon]") {
  // Replica 0 (the target) takes 1 unit per call, replica 1 takes 4: a call waits
  // (load + 1) * cost.
  BalancerOptions c;
  c.replicas = 2;
  c.delta = 0;
  c.count_redirects = false;
  c.cost = {1, 4};
  auto b = Make(c);
  for (int i = 0; i < 3; ++i) REQUIRE(b->OnSend(0).ok());  // 0: (3 + 1) * 1 = 4
  REQUIRE(b->OnGossip({1, 0}).ok());                       // 1: (0 + 1) * 4 = 4: not lower
  CHECK(b->Pick({0, 0}).replica == 0);                     // a count rule would redirect
  REQUIRE(b->OnSend(0).ok());                              // 0: 5 > 4
  CHECK(b->Pick({0, 0}).replica == 1);
  // The other way round: the slow replica's queue of 1 sends the call to the fast one's 3.
  BalancerOptions slow = c;
  auto s = Make(slow);
  REQUIRE(s->OnSend(1).ok());                              // 1: (1 + 1) * 4 = 8
  for (int i = 0; i < 3; ++i) REQUIRE(s->OnSend(0).ok());  // 0: (3 + 1) * 1 = 4
  CHECK(s->Pick({1, 0}).replica == 0);
  // Equal costs give the rule on counts.
  c.cost = {2, 2};
  auto even = Make(c);
  REQUIRE(even->OnSend(0).ok());
  REQUIRE(even->OnGossip({1, 1}).ok());
  CHECK(even->Pick({0, 0}).replica == 0);
  // Costs are checked.
  c.cost = {1};
  CHECK(Balancer::Create(c).status().message() == "balancer: cost has 1 entries for 2 replicas");
  c.cost = {1, 0};
  CHECK(Balancer::Create(c).status().message() == "balancer: cost[1] is 0; it must be > 0");
}

TEST_CASE("daronpon: one hop at most", "[balance][daronpon]") {
  BalancerOptions c;
  c.replicas = 2;
  c.local = {0};
  c.delta = 0;
  auto b = Make(c);
  for (int i = 0; i < 10; ++i) REQUIRE(b->OnSend(0).ok());
  // Already redirected once: admitted here however loaded it is.
  auto choice = b->Pick({0, 1});
  CHECK(choice.replica == 0);
  CHECK_FALSE(choice.redirected);
  CHECK(b->Pick({0, 0}).redirected);
}

TEST_CASE("daronpon: counted redirects spread a burst instead of herding it",
          "[balance][daronpon]") {
  BalancerOptions c;
  c.replicas = 3;
  c.local = {0};
  c.delta = 1;
  auto b = Make(c);
  for (int i = 0; i < 8; ++i) REQUIRE(b->OnSend(0).ok());
  REQUIRE(b->OnGossip({1, 0}).ok());
  REQUIRE(b->OnGossip({2, 0}).ok());
  // Each redirect raises the target's estimate by one until its next report.
  std::vector<uint32_t> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(b->Pick({0, 0}).replica);
  CHECK(std::count(picks.begin(), picks.end(), 1u) == 3);
  CHECK(std::count(picks.begin(), picks.end(), 2u) == 3);
  CHECK(b->Load(1) == 3);
  CHECK(b->Load(2) == 3);
  // Load 3 + delta 1 < 8 still; a report of the true count replaces the estimate.
  REQUIRE(b->OnGossip({1, 9}).ok());
  REQUIRE(b->OnGossip({2, 9}).ok());
  CHECK_FALSE(b->Pick({0, 0}).redirected);
}

TEST_CASE("daronpon: gossip from local sends, estimates from piggybacked responses",
          "[balance][daronpon]") {
  BalancerOptions c;
  c.replicas = 2;
  c.local = {0};
  c.gossip_floor = 4;
  auto b = Make(c);
  std::vector<LoadReport> gossip;
  for (int i = 0; i < 9; ++i) {
    auto g = b->OnSend(0);
    REQUIRE(g.ok());
    if (*g) gossip.push_back(**g);
  }
  CHECK(gossip == std::vector<LoadReport>{{0, 4}, {0, 8}});
  CHECK(b->LocalLoads() == std::vector<LoadReport>{{0, 9}});
  // Remote replica 1: our own calls count until a response carries its real count.
  REQUIRE(b->OnSend(1).ok());
  REQUIRE(b->OnSend(1).ok());
  CHECK(b->Load(1) == 2);
  auto r = b->OnResponse(1, 7u);
  REQUIRE(r.ok());
  CHECK_FALSE(r->has_value());  // remote replicas never gossip
  CHECK(b->Load(1) == 7);
  CHECK(b->outstanding(1) == 1);
}

TEST_CASE("daronpon: no local replica picks the least loaded estimate", "[balance][daronpon]") {
  BalancerOptions c;
  c.replicas = 3;
  auto b = Make(c);
  REQUIRE(b->OnGossip({0, 5}).ok());
  REQUIRE(b->OnGossip({1, 2}).ok());
  REQUIRE(b->OnGossip({2, 6}).ok());
  auto choice = b->Pick({});
  CHECK(choice.replica == 1);
}

TEST_CASE("round robin and po2 are deterministic for a seed", "[balance]") {
  BalancerOptions c;
  c.replicas = 4;
  c.policy = BalancePolicy::kRoundRobin;
  auto rr = Make(c);
  std::vector<uint32_t> seq;
  for (int i = 0; i < 6; ++i) seq.push_back(rr->Pick({}).replica);
  CHECK(seq == std::vector<uint32_t>{0, 1, 2, 3, 0, 1});

  c.policy = BalancePolicy::kPowerOfTwo;
  c.seed = 42;
  auto p1 = Make(c);
  auto p2 = Make(c);
  c.seed = 43;
  auto p3 = Make(c);
  std::vector<uint32_t> a, b, d;
  for (int i = 0; i < 64; ++i) {
    a.push_back(p1->Pick({}).replica);
    b.push_back(p2->Pick({}).replica);
    d.push_back(p3->Pick({}).replica);
  }
  CHECK(a == b);
  CHECK(a != d);
  // Po2 picks the lighter of its two: any pair holding the heavily loaded replica 3 also holds
  // a lighter one, so 3 is never picked.
  for (int i = 0; i < 20; ++i) REQUIRE(p1->OnSend(3).ok());
  for (int i = 0; i < 64; ++i) CHECK(p1->Pick({}).replica != 3);
}
