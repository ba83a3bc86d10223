// plexus-mccs-sim: the flow-level simulator's reproductions (docs/netmodel.md,
// "Reproductions"): MCCS's 768-GPU table (random ring vs optimal ring vs optimal ring + FFA, random
// and compact placement) and Cloud Collectives' spread of random rank orders, with the rank
// correlation between the cost models and the simulator.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "plexus/base/quantile.hpp"
#include "plexus/netmodel/mccs_sim.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace {

namespace pn = plexus::netmodel;
namespace sim = plexus::netmodel::sim;
namespace tooling = plexus::tooling;
using Json = nlohmann::json;

// The speedups over the random ring that MCCS reports (§4.6.5, Figure 4.10), for comparison.
constexpr double kPaperSpeedup[2][3] = {{1.0, 2.6, 3.3}, {1.0, 3.3, 3.4}};

struct Args {
  bool json = false;
  std::vector<std::string> placements = {"random", "compact"};
  sim::MccsSpec mccs;
  double gbps = 200;
  bool once = false;
  sim::SpreadSpec spread;
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double Percentile(std::vector<double> v, double p) {
  return plexus::base::Quantile(std::move(v), p, plexus::base::QuantileRule::kInterpolated);
}

int Table(const Args& a, const tooling::Tool& tool) {
  sim::MccsSpec spec = a.mccs;
  spec.fabric.host_bytes_per_s = a.gbps * 1e9 / 8;
  spec.steady = !a.once;
  tooling::FigureWriter out("mccs_sim", a.json);
  const int gpus = spec.fabric.leaves * spec.fabric.hosts_per_leaf * spec.fabric.nics_per_host;
  const Json common = {{"gpus", gpus},
                       {"spines", spec.fabric.spines},
                       {"leaves", spec.fabric.leaves},
                       {"hosts_per_leaf", spec.fabric.hosts_per_leaf},
                       {"nics_per_host", spec.fabric.nics_per_host},
                       {"gbps", a.gbps},
                       {"oversubscription", spec.fabric.oversubscription},
                       {"bytes", spec.bytes},
                       {"runs", spec.runs},
                       {"load", spec.load},
                       {"mode", spec.steady ? "steady" : "once"}};
  std::string table = absl::StrFormat(
      "%d GPUs: %d leaves x %d hosts x %d NICs, %d spines, %g Gbps, oversubscription %g; "
      "%g MB ring allreduce, %s, %d runs\n\n"
      "| placement | strategy | jobs | hosts, racks per job | mean time (ms) | mean cross-rack "
      "hops | speedup vs random ring (mean of jobs) | MCCS's reported speedup "
      "|\n|---|---|---|---|---|---|---|---|\n",
      gpus, spec.fabric.leaves, spec.fabric.hosts_per_leaf, spec.fabric.nics_per_host,
      spec.fabric.spines, a.gbps, spec.fabric.oversubscription, spec.bytes / 1e6,
      spec.steady ? "all jobs overlapping (steady)" : "all jobs starting together", spec.runs);
  for (const std::string& name : a.placements) {
    const sim::Placement placement =
        name == "random" ? sim::Placement::kRandom : sim::Placement::kCompact;
    auto jobs = sim::RunMccs(spec, placement);
    if (!jobs.ok()) return tool.Fail(jobs.status());
    for (int s = 0; s < sim::kRingStrategies; ++s) {
      std::vector<double> ms, speedup, cross, hosts, racks;
      for (const auto& j : *jobs) {
        hosts.push_back(j.hosts);
        racks.push_back(j.racks);
        ms.push_back(j.seconds[s] * 1e3);
        speedup.push_back(j.seconds[0] / j.seconds[s]);
        cross.push_back(j.cross_rack_hops[s]);
      }
      const std::string strategy(sim::RingStrategyName(static_cast<sim::RingStrategy>(s)));
      const double paper = kPaperSpeedup[placement == sim::Placement::kRandom ? 0 : 1][s];
      Json extra = common;
      extra["placement"] = name;
      extra["strategy"] = strategy;
      extra["jobs"] = jobs->size();
      extra["hosts_per_job"] = Mean(hosts);
      extra["racks_per_job"] = Mean(racks);
      out.Add({"allreduce_ms", Mean(ms), "ms", nullptr, std::nullopt, extra});
      extra["paper_speedup"] = paper;
      extra["p10"] = Percentile(speedup, 0.1);
      extra["p90"] = Percentile(speedup, 0.9);
      out.Add({"speedup_vs_random_ring", Mean(speedup), "ratio", nullptr, std::nullopt, extra});
      table += absl::StrFormat("| %s | %s | %d | %.1f, %.1f | %.2f | %.1f | %.2fx | %.1fx |\n",
                               name, strategy, jobs->size(), Mean(hosts), Mean(racks), Mean(ms),
                               Mean(cross), Mean(speedup), paper);
    }
  }
  if (!a.json) std::printf("%s", table.c_str());
  return tooling::kExitOk;
}

int Spread(const Args& a, const tooling::Tool& tool) {
  auto r = sim::RunSpread(a.spread);
  if (!r.ok()) return tool.Fail(r.status());
  tooling::FigureWriter out("cc_spread", a.json);
  Json common = {
      {"n", r->n}, {"orders", a.spread.orders}, {"bytes", a.spread.bytes}, {"seed", a.spread.seed}};
  if (a.spread.clos) {
    common["fabric"] =
        absl::StrFormat("clos %d leaves x %d hosts, %d spines, ECMP", a.spread.clos_fabric.leaves,
                        a.spread.clos_fabric.hosts_per_leaf, a.spread.clos_fabric.spines);
  } else {
    common["fabric"] =
        absl::StrFormat("tree %d pods x %d racks x %d hosts", a.spread.fabric.pods,
                        a.spread.fabric.racks_per_pod, a.spread.fabric.hosts_per_rack);
  }
  auto add = [&](const std::string& name, double value, const std::string& unit, Json more = {}) {
    Json extra = common;
    for (auto& [k, v] : more.items()) extra[k] = v;
    out.Add({name, value, unit, nullptr, std::nullopt, extra});
  };
  const double median = Percentile(r->random_ms, 0.5);
  Json spread = {{"statistic", "median"},
                 {"reordered_ms", r->reordered_ms},
                 {"min", Percentile(r->random_ms, 0)},
                 {"max", Percentile(r->random_ms, 1)}};
  if (a.json) spread["times_ms"] = r->random_ms;  // for plexus-plot spread; too long for a table
  add("random_orders_ms", median, "ms", spread);
  add("random_order_min_ms", Percentile(r->random_ms, 0), "ms");
  add("random_order_max_ms", Percentile(r->random_ms, 1), "ms");
  add("reordered_ms", r->reordered_ms, "ms");
  add("speedup_median_random_vs_reordered", median / r->reordered_ms, "ratio");
  add("ring_cost_speedup_median_random_vs_reordered",
      r->median_random_cost_us / r->reordered_cost_us, "ratio");
  add("spearman_latency_cost_vs_sim", r->spearman_latency, "rho",
      {{"orders", a.spread.correlation_orders}, {"set", "reordered .. random (k random swaps)"}});
  add("spearman_bandwidth_cost_vs_sim", r->spearman_bandwidth, "rho",
      {{"orders", a.spread.correlation_orders}, {"set", "reordered .. random (k random swaps)"}});
  add("spearman_latency_cost_vs_sim_random_orders", r->spearman_latency_random, "rho",
      {{"set", "random orders"}});
  add("spearman_bandwidth_cost_vs_sim_random_orders", r->spearman_bandwidth_random, "rho",
      {{"set", "random orders"}});
  if (!a.json) out.PrintTable();
  return tooling::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-mccs-sim",
                     "Flow-level simulations: MCCS's 768-GPU table and Cloud Collectives' spread "
                     "of random rank orders.");
  tool.app().require_subcommand(1);
  Args a;

  CLI::App* table = tool.Subcommand(
      "table", "ring allreduce: random ring vs optimal ring vs optimal ring + FFA (MCCS)");
  table->add_option("--placement", a.placements, "random and/or compact")
      ->delimiter(',')
      ->check(CLI::IsMember({"random", "compact"}))
      ->capture_default_str();
  auto& f = a.mccs.fabric;
  tooling::AddNumber(table, "--leaves", &f.leaves, "leaf switches", 1, 4096);
  tooling::AddNumber(table, "--spines", &f.spines, "spine switches", 1, 4096);
  tooling::AddNumber(table, "--hosts-per-leaf", &f.hosts_per_leaf, "hosts per leaf", 1, 4096);
  tooling::AddNumber(table, "--nics", &f.nics_per_host, "NICs (and GPUs) per host", 1, 64);
  tooling::AddNumber(table, "--gbps", &a.gbps, "NIC speed", 0.001, 1e6);
  tooling::AddNumber(table, "--oversubscription", &f.oversubscription, "leaf oversubscription", 1.0,
                     1000.0);
  tooling::AddNumber(table, "--bytes", &a.mccs.bytes, "allreduce buffer", 1.0, 1e13);
  tooling::AddNumber(table, "--runs", &a.mccs.runs, "runs (placements) to average over", 1, 1000);
  tooling::AddNumber(table, "--load", &a.mccs.load, "fraction of GPUs given to jobs", 0.01, 1.0);
  tooling::AddNumber(table, "--channels", &a.mccs.channels, "rings per job (0: the spines)", 0,
                     1024);
  table->add_option("--job-sizes", a.mccs.job_sizes, "GPUs per job, drawn uniformly")
      ->delimiter(',')
      ->capture_default_str();
  tooling::AddNumber(table, "--seed", &a.mccs.seed, "random seed", uint64_t{0},
                     std::numeric_limits<uint64_t>::max());
  table->add_flag("--once", a.once,
                  "all jobs start one allreduce together (default: they overlap for good)");
  tooling::AddJsonFlag(table, &a.json);

  CLI::App* spread = tool.Subcommand(
      "spread", "ring allreduce times of random orders vs the reordered one (Cloud Collectives)");
  tooling::AddNumber(spread, "--pods", &a.spread.fabric.pods, "pods", 1, 4096);
  tooling::AddNumber(spread, "--racks", &a.spread.fabric.racks_per_pod, "racks per pod", 1, 4096);
  tooling::AddNumber(spread, "--hosts", &a.spread.fabric.hosts_per_rack, "hosts per rack", 1, 4096);
  spread->add_flag("--clos", a.spread.clos,
                   "a leaf/spine fabric with ECMP instead of the pod/rack/host tree");
  tooling::AddNumber(spread, "--leaves", &a.spread.clos_fabric.leaves, "--clos: leaves", 1, 4096);
  tooling::AddNumber(spread, "--spines", &a.spread.clos_fabric.spines, "--clos: spines", 1, 4096);
  tooling::AddNumber(spread, "--hosts-per-leaf", &a.spread.clos_fabric.hosts_per_leaf,
                     "--clos: hosts per leaf", 1, 4096);
  tooling::AddNumber(spread, "--orders", &a.spread.orders, "random orders timed", 1, 1'000'000);
  tooling::AddNumber(spread, "--correlation-orders", &a.spread.correlation_orders,
                     "orders from reordered to random for the rank correlation", 2, 1'000'000);
  tooling::AddNumber(spread, "--bytes", &a.spread.bytes, "allreduce buffer", 1.0, 1e13);
  tooling::AddNumber(spread, "--noise", &a.spread.noise, "lognormal sigma of latencies", 0.0, 10.0);
  tooling::AddNumber(spread, "--reorder-seconds", &a.spread.reorder_seconds,
                     "time limit of the reordering", 0.001, 86400.0);
  tooling::AddNumber(spread, "--seed", &a.spread.seed, "random seed", uint64_t{0},
                     std::numeric_limits<uint64_t>::max());
  tooling::AddJsonFlag(spread, &a.json);

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (table->parsed()) return Table(a, tool);
  return Spread(a, tool);
}
