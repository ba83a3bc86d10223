// plexus-rpc-sim: the Daronpon replica-selection simulator (see docs/rpc_balance.md).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "simulator.hpp"

namespace {

using plexus::rpc::sim::SimConfig;
using plexus::rpc::sim::SimResult;

constexpr char kDescription[] =
    "Discrete-event simulator of replica selection across racks (Daronpon, seed 003 ch. 2): "
    "leaf-spine racks, ToR dispatchers, FCFS servers; random, round_robin, po2 (stale), jsq "
    "(oracle), periodic gossip and daronpon, running the library's balancer code.";

struct Args {
  SimConfig base;
  std::string service = "exp";
  std::vector<std::string> policies = {"random", "po2", "periodic", "daronpon", "jsq"};
  std::vector<double> loads = {0.3, 0.5, 0.6, 0.7, 0.8, 0.9};
  std::vector<uint32_t> floors = {0, 1, 2, 4, 8};
  uint32_t fast_cores = 3;
  bool json = false;
};

void AddCommon(CLI::App* sub, Args& a) {
  using plexus::tooling::AddNumber;
  SimConfig& c = a.base;
  AddNumber<uint32_t>(sub, "--racks", &c.racks, "racks (ToRs)", 1, 64);
  AddNumber<uint32_t>(sub, "--servers-per-rack", &c.servers_per_rack, "replicas per rack", 1, 64);
  AddNumber<uint32_t>(sub, "--clients", &c.clients, "open-loop Poisson clients", 1, 1024);
  AddNumber<double>(sub, "--hop-us", &c.hop_us, "latency of each link (us)", 0, 1e6);
  sub->add_option("--service", a.service, "service time: constant | exp | bimodal")
      ->capture_default_str();
  AddNumber<double>(sub, "--mean-us", &c.mean_us, "mean service time (us)", 0.001, 1e6);
  AddNumber<uint64_t>(sub, "--requests", &c.requests, "requests per run (memory: ~100 B each)", 1,
                      10000000);
  AddNumber<uint64_t>(sub, "--seed", &c.seed, "RNG seed", 0, UINT64_MAX);
  AddNumber<uint32_t>(sub, "--delta", &c.delta, "Daronpon redirect threshold (calls)", 0, 1 << 20);
  AddNumber<uint32_t>(sub, "--gossip-floor", &c.gossip_floor, "lower gossip threshold", 0, 1 << 20);
  AddNumber<double>(sub, "--gossip-period-us", &c.gossip_period_us,
                    "period of the periodic-gossip baseline (us)", 0.001, 1e6);
  plexus::tooling::AddNumberList<uint32_t>(
      sub, "--cores", &c.cores, "cores per server, rack-major (default 1 each)", 1, 1024);
  sub->add_flag("--piggyback-responses,!--no-piggyback-responses", c.piggyback_responses,
                "responses update the client's ToR on the way back (daronpon)")
      ->capture_default_str();
  sub->add_flag("--piggyback-redirects,!--no-piggyback-redirects", c.piggyback_redirects,
                "redirected calls carry their first ToR's counts (daronpon)")
      ->capture_default_str();
  plexus::tooling::AddJsonFlag(sub, &a.json);
}

plexus::tooling::Figure MakeFigure(const std::string& name, double value, const std::string& unit,
                                   const SimConfig& c, const SimResult& r) {
  plexus::tooling::Figure f;
  f.figure = name;
  f.value = value;
  f.unit = unit;
  f.extra = {{"policy", c.policy},
             {"load", c.load},
             {"service", plexus::rpc::sim::ServiceName(c.service)},
             {"p50_us", r.p50_us},
             {"p99_us", r.p99_us},
             {"p999_us", r.p999_us},
             {"redirect_frac", r.redirect_fraction()},
             {"gossip_frac", r.gossip_fraction()},
             {"gossip_floor", c.gossip_floor},
             {"requests", r.completed},
             {"piggyback_responses", c.piggyback_responses},
             {"seed", c.seed}};
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool("plexus-rpc-sim", kDescription);
  Args a;
  CLI::App* sweep = tool.Subcommand("sweep", "p99 latency against load for each policy");
  AddCommon(sweep, a);
  sweep->add_option("--policies", a.policies, "policies to compare")->delimiter(',');
  plexus::tooling::AddNumberList(sweep, "--loads", &a.loads, "offered loads (fraction of capacity)",
                                 plexus::rpc::sim::kMinLoad, plexus::rpc::sim::kMaxLoad);
  CLI::App* gossip =
      tool.Subcommand("gossip", "Daronpon's gossip traffic against the lower threshold (floor)");
  AddCommon(gossip, a);
  plexus::tooling::AddNumberList<uint32_t>(gossip, "--floors", &a.floors, "gossip floors to try", 0,
                                           1 << 20);
  plexus::tooling::AddNumber<double>(gossip, "--load", &a.base.load, "offered load",
                                     plexus::rpc::sim::kMinLoad, plexus::rpc::sim::kMaxLoad);
  CLI::App* hetero = tool.Subcommand(
      "hetero", "one fast server (--fast-cores): p99 and where redirects go, against load");
  AddCommon(hetero, a);
  hetero->add_option("--policies", a.policies, "policies to compare")->delimiter(',');
  plexus::tooling::AddNumberList(hetero, "--loads", &a.loads,
                                 "offered loads (fraction of total capacity)",
                                 plexus::rpc::sim::kMinLoad, plexus::rpc::sim::kMaxLoad);
  plexus::tooling::AddNumber<uint32_t>(hetero, "--fast-cores", &a.fast_cores,
                                       "cores of server 0 (the others have 1)", 1, 1024);
  tool.app().require_subcommand(1);
  if (auto code = tool.Parse(argc, argv)) return *code;

  auto service = plexus::rpc::sim::ParseService(a.service);
  if (!service.ok()) return tool.Usage(std::string(service.status().message()));
  a.base.service = *service;
  for (const std::string& policy : a.policies) {
    if (policy != "random" && policy != "round_robin" && policy != "po2" && policy != "jsq" &&
        policy != "periodic" && policy != "daronpon") {
      return tool.Usage("--policies: unknown policy '" + policy +
                        "'; expected random, round_robin, po2, jsq, periodic or daronpon");
    }
  }
  plexus::tooling::FigureWriter out("rpc_balance_sim", a.json);
  auto run = [&](const SimConfig& c) -> absl::StatusOr<SimResult> {
    std::fprintf(stderr, "plexus-rpc-sim: %s load %.2f %s floor %u ...\n", c.policy.c_str(), c.load,
                 a.service.c_str(), c.gossip_floor);
    return plexus::rpc::sim::Simulate(c);
  };

  if (sweep->parsed() || hetero->parsed()) {
    SimConfig c = a.base;
    if (hetero->parsed()) {
      c.cores.assign(c.racks * c.servers_per_rack, 1);
      c.cores[0] = a.fast_cores;
    }
    for (const std::string& policy : a.policies) {
      for (double load : a.loads) {
        c.policy = policy;
        c.load = load;
        auto r = run(c);
        if (!r.ok()) return tool.Fail(r.status());
        plexus::tooling::Figure f = MakeFigure("p99", r->p99_us, "us", c, *r);
        if (hetero->parsed()) {
          uint64_t to_fast = r->redirected_to[0];
          f.extra["fast_served_frac"] = double(r->served[0]) / r->completed;
          f.extra["redirects_to_fast_frac"] = r->redirects ? double(to_fast) / r->redirects : 0;
          f.extra["fast_cores"] = a.fast_cores;
        }
        out.Add(f);
      }
    }
  } else {
    SimConfig c = a.base;
    c.policy = "daronpon";
    for (uint32_t floor : a.floors) {
      c.gossip_floor = floor;
      auto r = run(c);
      if (!r.ok()) return tool.Fail(r.status());
      plexus::tooling::Figure f =
          MakeFigure("gossip_frac", r->gossip_fraction(), "fraction", c, *r);
      f.extra["gossip_msgs_frac"] = double(r->gossip_messages) / r->completed;
      out.Add(f);
    }
  }
  if (!a.json) out.PrintTable();
  return 0;
}
