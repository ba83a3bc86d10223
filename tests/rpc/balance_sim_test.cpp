// The Daronpon simulator reproduces the seed's qualitative orderings with fixed seeds (small
// runs; the full sweeps are in docs/rpc_balance.md).
#include <catch2/catch.hpp>

#include "simulator.hpp"

using plexus::rpc::sim::Service;
using plexus::rpc::sim::SimConfig;
using plexus::rpc::sim::SimResult;
using plexus::rpc::sim::Simulate;

namespace {

SimResult Run(const std::string& policy, double load, Service service, uint32_t floor = 4) {
  SimConfig c;
  c.policy = policy;
  c.load = load;
  c.service = service;
  c.gossip_floor = floor;
  c.requests = 60000;
  c.seed = 7;
  auto r = Simulate(c);
  REQUIRE(r.ok());
  REQUIRE(r->completed == c.requests);
  return *r;
}

}  // namespace

TEST_CASE("sim: daronpon p99 beats random and stale po2 at 70% load, exponential", "[sim]") {
  const SimResult random = Run("random", 0.7, Service::kExponential);
  const SimResult po2 = Run("po2", 0.7, Service::kExponential);
  const SimResult daronpon = Run("daronpon", 0.7, Service::kExponential);
  const SimResult jsq = Run("jsq", 0.7, Service::kExponential);
  INFO("p99 random " << random.p99_us << " po2 " << po2.p99_us << " daronpon " << daronpon.p99_us
                     << " jsq " << jsq.p99_us);
  CHECK(daronpon.p99_us <= po2.p99_us);
  CHECK(daronpon.p99_us < random.p99_us);
  CHECK(jsq.p99_us <= daronpon.p99_us);
}

TEST_CASE("sim: gossip with floor 4 is under a fifth of floor 1", "[sim]") {
  const SimResult one = Run("daronpon", 0.7, Service::kExponential, 1);
  const SimResult four = Run("daronpon", 0.7, Service::kExponential, 4);
  INFO("gossip/request floor 1 " << one.gossip_fraction() << " floor 4 " << four.gossip_fraction());
  CHECK(four.gossip_fraction() * 5 < one.gossip_fraction());
}

TEST_CASE("sim: the p99 gain over random is larger for exponential and bimodal than constant",
          "[sim]") {
  // In microseconds saved; as a ratio the three are close in this model (docs/rpc_balance.md).
  auto gain = [](Service s) {
    return Run("random", 0.7, s).p99_us - Run("daronpon", 0.7, s).p99_us;
  };
  const double constant = gain(Service::kConstant);
  const double exponential = gain(Service::kExponential);
  const double bimodal = gain(Service::kBimodal);
  INFO("random - daronpon p99 (us): constant " << constant << " exponential " << exponential
                                               << " bimodal " << bimodal);
  CHECK(constant > 0);
  CHECK(exponential > 1.5 * constant);
  CHECK(bimodal > 1.5 * constant);
}

TEST_CASE("sim: redirects follow capacity under heterogeneity (seed 2.5.4: 3 servers)", "[sim]") {
  // The seed's setup: three servers, one per ToR, one of them with 3 cores.
  auto redirect_share = [](uint32_t fast_cores, SimResult* out) {
    SimConfig c;
    c.policy = "daronpon";
    c.load = 0.8;
    c.service = Service::kExponential;
    c.servers_per_rack = 1;
    c.clients = 3;
    c.cores = {fast_cores, 1, 1};
    c.requests = 60000;
    c.seed = 7;
    auto r = Simulate(c);
    REQUIRE(r.ok());
    *out = *r;
    return double(r->redirected_to[0]) / r->redirects;
  };
  SimResult homogeneous, heterogeneous;
  const double even = redirect_share(1, &homogeneous);
  const double skewed = redirect_share(3, &heterogeneous);
  INFO("share of redirects to server 0: 1 core " << even << ", 3 cores " << skewed);
  CHECK(even < 0.45);
  CHECK(skewed > 0.55);
  // Server 0 holds 3 of 5 cores: it serves well over the third that a blind choice sends it.
  CHECK(heterogeneous.served[0] * 2 > heterogeneous.completed);
}

TEST_CASE("sim: bad configurations are errors naming the field", "[sim]") {
  SimConfig c;
  c.policy = "lsq";
  CHECK(Simulate(c).status().message() ==
        "unknown policy 'lsq'; expected random, round_robin, po2, jsq, periodic or daronpon");
  c.policy = "daronpon";
  c.cores = {1, 2};
  CHECK(Simulate(c).status().message() == "cores lists 2 servers, the topology has 6");
  c.cores = {};
  c.load = 0;
  CHECK(Simulate(c).status().message() == "load must be in 0.01..2, got 0");
  c.load = 1e-300;  // a load that would never end the simulation
  CHECK(Simulate(c).status().message() == "load must be in 0.01..2, got 1e-300");
}
