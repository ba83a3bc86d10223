// plexus-rpc-sim: the Daronpon replica-selection simulator (see docs/rpc_balance.md).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/table.hpp"
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
             {"throughput_krps", r.throughput_krps},
             {"redirect_frac", r.redirect_fraction()},
             {"gossip_frac", r.gossip_fraction()},
             {"gossip_floor", c.gossip_floor},
             {"requests", r.completed},
             {"piggyback_responses", c.piggyback_responses},
             {"seed", c.seed}};
  return f;
}

std::string Fixed(double v, int digits) { return absl::StrFormat("%.*f", digits, v); }
std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

// The readable output: what was simulated, then one row per point.
class Table {
 public:
  Table(std::vector<std::string> header, size_t left_columns) : header_(std::move(header)) {
    style_.right_aligned.assign(header_.size(), true);
    for (size_t c = 0; c < left_columns && c < header_.size(); ++c) style_.right_aligned[c] = false;
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(const std::string& title) const {
    std::printf("%s\n%s", title.c_str(),
                plexus::tooling::FormatTable(header_, rows_, style_).c_str());
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  plexus::tooling::TableStyle style_{.indent = "  "};
};

// What was simulated, above the table: "plexus-rpc-sim sweep: exp service, mean 25 us; 3 racks x
// 2 servers (1 core each), 6 clients, 5 us per hop; 200000 requests per point, seed 1".
std::string Title(const std::string& command, const SimConfig& c) {
  std::string cores = "1 core each";
  if (!c.cores.empty()) {
    cores = "cores";
    for (size_t i = 0; i < c.cores.size(); ++i) {
      absl::StrAppend(&cores, i == 0 ? " " : ",", c.cores[i]);
    }
  }
  return absl::StrFormat(
      "plexus-rpc-sim %s: %s service, mean %g us; %u racks x %u servers (%s), %u clients, %g us "
      "per hop; %u requests per point, seed %u",
      command, plexus::rpc::sim::ServiceName(c.service), c.mean_us, c.racks, c.servers_per_rack,
      cores, c.clients, c.hop_us, c.requests, c.seed);
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool("plexus-rpc-sim", kDescription);
  Args a;
  CLI::App* sweep = tool.Subcommand("sweep", "p99 latency against load for each policy");
  AddCommon(sweep, a);
  sweep->add_option("--policies", a.policies, "policies to compare")
      ->delimiter(',')
      ->capture_default_str();
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
  hetero->add_option("--policies", a.policies, "policies to compare")
      ->delimiter(',')
      ->capture_default_str();
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
    std::vector<std::string> header = {"policy",   "load",   "p50 us",     "p99 us",
                                       "p99.9 us", "kRPC/s", "redirected", "gossip/req"};
    if (hetero->parsed()) {
      c.cores.assign(c.racks * c.servers_per_rack, 1);
      c.cores[0] = a.fast_cores;
      header.insert(header.end(), {"served by 0", "redirects to 0"});
    }
    Table table(header, 1);
    for (const std::string& policy : a.policies) {
      for (double load : a.loads) {
        c.policy = policy;
        c.load = load;
        auto r = run(c);
        if (!r.ok()) return tool.Fail(r.status());
        plexus::tooling::Figure f = MakeFigure("p99", r->p99_us, "us", c, *r);
        std::vector<std::string> row = {policy,
                                        Fixed(load, 2),
                                        Fixed(r->p50_us, 1),
                                        Fixed(r->p99_us, 1),
                                        Fixed(r->p999_us, 1),
                                        Fixed(r->throughput_krps, 1),
                                        Percent(r->redirect_fraction()),
                                        Fixed(r->gossip_fraction(), 3)};
        if (hetero->parsed()) {
          const double fast_served = double(r->served[0]) / r->completed;
          const double to_fast = r->redirects ? double(r->redirected_to[0]) / r->redirects : 0;
          f.extra["fast_served_frac"] = fast_served;
          f.extra["redirects_to_fast_frac"] = to_fast;
          f.extra["fast_cores"] = a.fast_cores;
          row.insert(row.end(), {Percent(fast_served), Percent(to_fast)});
        }
        out.Add(f);
        table.Add(std::move(row));
      }
    }
    if (!a.json) table.Print(Title(sweep->parsed() ? "sweep" : "hetero", c));
  } else {
    SimConfig c = a.base;
    c.policy = "daronpon";
    Table table({"floor", "gossip/req", "messages/req", "p50 us", "p99 us", "p99.9 us", "kRPC/s",
                 "redirected"},
                0);
    for (uint32_t floor : a.floors) {
      c.gossip_floor = floor;
      auto r = run(c);
      if (!r.ok()) return tool.Fail(r.status());
      plexus::tooling::Figure f =
          MakeFigure("gossip_frac", r->gossip_fraction(), "fraction", c, *r);
      const double messages = double(r->gossip_messages) / r->completed;
      f.extra["gossip_msgs_frac"] = messages;
      out.Add(f);
      table.Add({absl::StrCat(floor), Fixed(r->gossip_fraction(), 3), Fixed(messages, 3),
                 Fixed(r->p50_us, 1), Fixed(r->p99_us, 1), Fixed(r->p999_us, 1),
                 Fixed(r->throughput_krps, 1), Percent(r->redirect_fraction())});
    }
    if (!a.json) {
      table.Print(Title("gossip", c) + absl::StrFormat("; daronpon at load %.2f", c.load));
    }
  }
  return 0;
}
