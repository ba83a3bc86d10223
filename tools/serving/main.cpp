// plexus-serve: serve an ML workflow under a placement plan with the serving runtime: one rpc
// server per plan worker, real messages between them, emulated operators in compressed time
// (docs/placement.md, "Serving").
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "plexus/base/file.hpp"
#include "plexus/base/quantile.hpp"
#include "plexus/placement/network.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/placement/simulator.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/serving/serve.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/tooling/table.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace {

using namespace plexus::placement;
using plexus::serving::ServeOptions;
using plexus::serving::ServeReport;
namespace serving = plexus::serving;
namespace tooling = plexus::tooling;
namespace pt = plexus::transport;

struct Args {
  std::vector<std::string> positional;
  std::string strategy = "jb";
  std::vector<std::string> strategies = {"jb", "ptc", "spc"};
  int runs = 1;  // compare: serves per plan (medians)
  std::string transport = "inproc";
  std::string balance = "shares";
  std::string spike;  // AT:SECONDS:FACTOR
  bool no_spin = false;
  bool json = false;
  std::vector<std::string> kills;     // WORKER@SECONDS
  std::string address = "127.0.0.1";  // the interface every tcp server listens on
  std::string report_path;            // the whole report as JSON (ServeToJson)
  std::string plot_path;              // its picture (plexus-plot serve)
  ServeOptions serve;
};

const tooling::Tool* g_tool = nullptr;

std::string Fixed(double value, int digits) { return absl::StrFormat("%.*f", digits, value); }

void Progress(const serving::ServeProgress& p) {
  std::fprintf(stderr,
               "plexus-serve: t=%6.1f s%s  %8.2f req/s  queued %6lld  p50 %8.1f ms  p99 %8.1f ms\n",
               p.plan_s, p.draining ? " (draining)" : "", p.completion_rate,
               static_cast<long long>(p.queued), p.latency_p50_ms, p.latency_p99_ms);
}

// The readable report: the summary and the per-worker table.
void PrintTables(const Problem& problem, const ServeReport& r) {
  std::cout << plexus::serving::ServeSummary(problem, r);
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : r.workers) {
    std::string ops;
    for (int op : w.operators) ops += (ops.empty() ? "" : ",") + problem.operators[op].name;
    rows.push_back({problem.workers[w.worker].name,
                    problem.tiers[problem.workers[w.worker].tier].name, std::to_string(w.servers),
                    std::to_string(w.processed), std::to_string(w.queue_at_end), ops});
  }
  std::cout << tooling::FormatTable(
      {"worker", "tier", "servers", "processed", "queued", "operators"}, rows,
      {.indent = "  ", .right_aligned = {false, false, true, true, true}});
  std::vector<std::vector<std::string>> bytes;
  for (const auto& [pair, b] : r.bytes_per_tier_pair) bytes.push_back({pair, Fixed(b / 1e9, 4)});
  if (!bytes.empty()) {
    std::cout << tooling::FormatTable({"tier pair", "GB sent (measured)"}, bytes,
                                      {.indent = "  ", .right_aligned = {false, true}});
  }
}

// --json: one figure per line.
void PrintFigures(const Problem& problem, const ServeReport& r, const Args& args) {
  tooling::FigureWriter out("plexus_serve", true);
  out.SetCommon({{"scenario", problem.name},
                 {"compression", r.compression},
                 {"transport", args.transport},
                 {"measured_s", r.measured_s}});
  tooling::Figure ratio{"throughput_ratio", r.throughput_ratio, "ratio", 0.98, r.sustained, {}};
  out.Add(ratio);
  out.Add({"latency_p50", r.latency_p50_ms, "ms", nullptr, std::nullopt, {}});
  out.Add({"latency_p90", r.latency_p90_ms, "ms", nullptr, std::nullopt, {}});
  out.Add({"latency_p99", r.latency_p99_ms, "ms", nullptr, std::nullopt, {}});
  out.Add({"network_cost_per_hour", r.network_cost_per_hour, "$/h", nullptr, std::nullopt, {}});
  out.Add({"compute_cost_per_hour", r.compute_cost_per_hour, "$/h", nullptr, std::nullopt, {}});
  out.Add({"accuracy", r.accuracy, "accuracy", nullptr, std::nullopt, {}});
  for (const auto& f : r.failures) {
    const nlohmann::json tags = {{"worker", f.worker}};
    out.Add({"failure_detected_after", f.detected_after_ms, "ms", nullptr, std::nullopt, tags});
    out.Add({"failure_replan", f.replan_ms, "ms", nullptr, std::nullopt, tags});
    out.Add({"failure_redeploy", f.redeploy_ms, "ms", nullptr, std::nullopt, tags});
    out.Add(
        {"failure_retried", static_cast<double>(f.retried), "count", nullptr, std::nullopt, tags});
    out.Add({"failure_full_rate_after", f.recovered_after_s, "s", nullptr, std::nullopt, tags});
  }
  out.Add({"injected", static_cast<double>(r.injected), "count", nullptr, std::nullopt, {}});
  out.Add({"completed", static_cast<double>(r.completed), "count", nullptr, std::nullopt, {}});
  out.Add({"dropped", static_cast<double>(r.dropped), "count", 0, r.dropped == 0, {}});
  out.Add({"duplicates", static_cast<double>(r.duplicates), "count", 0, r.duplicates == 0, {}});
  out.Add({"unfinished", static_cast<double>(r.unfinished), "count", 0, r.unfinished == 0, {}});
  for (const auto& s : r.sinks) {
    out.Add({"sink_achieved_rate",
             s.achieved_rate,
             "req/s",
             s.target_rate,
             std::nullopt,
             {{"sink", problem.operators[s.op].name}}});
  }
  for (const auto& w : r.workers) {
    out.Add({"queue_at_end",
             static_cast<double>(w.queue_at_end),
             "count",
             nullptr,
             std::nullopt,
             {{"worker", problem.workers[w.worker].name}}});
  }
  for (const auto& [pair, b] : r.bytes_per_tier_pair) {
    out.Add({"bytes_sent", b, "bytes", nullptr, std::nullopt, {{"tier_pair", pair}}});
  }
}

// --report and --plot: the whole report as JSON, and its picture.
int WriteReport(const Problem& problem, const ServeReport& r, const Args& args) {
  if (args.report_path.empty() && args.plot_path.empty()) return 0;
  const std::string data = args.report_path.empty() ? args.plot_path + ".json" : args.report_path;
  if (absl::Status s = plexus::base::WriteFileAtomic(data, serving::ServeToJson(problem, r));
      !s.ok()) {
    return g_tool->Fail(s);
  }
  if (args.plot_path.empty()) return 0;
  const absl::Status drawn = tooling::RunPlot("serve", data, args.plot_path);
  if (args.report_path.empty()) std::remove(data.c_str());
  if (absl::IsUnavailable(drawn)) {
    std::fprintf(stderr, "plexus-serve: %s\n", std::string(drawn.message()).c_str());
    return 0;
  }
  if (!drawn.ok()) return g_tool->Fail(drawn);
  if (!args.json) std::fprintf(stderr, "plexus-serve: wrote %s\n", args.plot_path.c_str());
  return 0;
}

// The flags that are not plain numbers -> args.serve: --kill WORKER@SECONDS (repeatable),
// --spike AT:SECONDS:FACTOR, --balance, --transport, --no-spin. Returns a usage error's exit
// code, or 0.
int ApplyServeFlags(Args& args) {
  for (const std::string& kill : args.kills) {
    const size_t at = kill.rfind('@');
    double seconds = 0;
    if (at == std::string::npos || at == 0 || !absl::SimpleAtod(kill.substr(at + 1), &seconds)) {
      return g_tool->Usage("--kill: expected WORKER@SECONDS (e.g. cloud-v100-0@20), got '" + kill +
                           "'");
    }
    args.serve.failures.push_back({kill.substr(0, at), seconds});
  }
  if (!args.spike.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(args.spike, ':');
    serving::LoadSpike& spike = args.serve.spike;
    if (parts.size() != 3 || !absl::SimpleAtod(parts[0], &spike.at_s) ||
        !absl::SimpleAtod(parts[1], &spike.duration_s) ||
        !absl::SimpleAtod(parts[2], &spike.factor)) {
      return g_tool->Usage("--spike: expected AT:SECONDS:FACTOR (e.g. 20:10:1.5), got '" +
                           args.spike + "'");
    }
  }
  if (args.balance == "shares") {
    args.serve.balance = serving::Balance::kShares;
  } else if (args.balance == "daronpon") {
    args.serve.balance = serving::Balance::kDaronpon;
  } else {
    return g_tool->Usage("--balance: expected shares or daronpon, got '" + args.balance + "'");
  }
  if (args.transport == "tcp") {
    args.serve.wire = serving::Wire::kTcp;
  } else if (args.transport != "inproc") {
    return g_tool->Usage("--transport: expected inproc or tcp, got '" + args.transport + "'");
  }
  args.serve.cpu_spins = !args.no_spin;
  return 0;
}

int ServePlan(const Problem& problem, const Plan& plan, Args& args) {
  if (int rc = ApplyServeFlags(args); rc != 0) return rc;
  if (absl::Status s = serving::CheckServable(problem, plan, args.serve); !s.ok()) {
    return g_tool->Fail(s);
  }
  int spinning = 0;
  for (const auto& shares : plan.workers) {
    for (const WorkerShare& w : shares) {
      if (w.share > 0 && !problem.worker_types[problem.workers[w.worker].type].gpu) ++spinning;
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  if (args.serve.cpu_spins && cores > 0 && static_cast<unsigned>(spinning) >= cores) {
    std::fprintf(stderr,
                 "plexus-serve: warning: %d CPU operator placements spin on %u cores; the run "
                 "measures this host's contention (--no-spin sleeps instead)\n",
                 spinning, cores);
  }
  if (!args.json) {
    std::fprintf(
        stderr,
        "plexus-serve: serving '%s' under plan '%s' for %.0f plan s (%.1f wall s) over %s\n",
        problem.name.c_str(), plan.strategy.c_str(), args.serve.duration_s,
        args.serve.duration_s / args.serve.compression, args.transport.c_str());
    args.serve.progress = Progress;
  }
  // The operator endpoint (PLEXUS_RPC_ADMIN, PLEXUS_RPC_ADMIN_TOKEN), as every Plexus program
  // offers it: `plexus-rpc-ctl call serving` shows the run.
  auto admin_settings = plexus::rpc::RpcAdmin::EnvSettings();
  if (!admin_settings.ok()) return g_tool->Fail(admin_settings.status());
  std::unique_ptr<plexus::base::admin::AdminServer> admin;
  std::unique_ptr<plexus::rpc::RpcAdmin> rpc_admin;
  if (!admin_settings->first.empty()) {
    auto started = plexus::base::admin::AdminServer::Start(
        {.address = admin_settings->first, .token = admin_settings->second});
    if (!started.ok()) return g_tool->Fail(started.status());
    admin = std::move(*started);
    rpc_admin = std::make_unique<plexus::rpc::RpcAdmin>(admin.get());
    args.serve.admin = admin.get();
    if (!args.json) {
      std::fprintf(stderr, "plexus-serve: admin endpoint %s (plexus-rpc-ctl call serving)\n",
                   admin->address().c_str());
    }
  }
  auto report = serving::Serve(problem, plan, args.serve);
  if (!report.ok()) return g_tool->Fail(report.status());
  if (args.json) {
    PrintFigures(problem, *report, args);
  } else {
    PrintTables(problem, *report);
  }
  if (int rc = WriteReport(problem, *report, args); rc != 0) return rc;
  for (const serving::FailureReport& f : report->failures) {
    if (!f.error.empty()) return 1;
  }
  return report->duplicates == 0 ? 0 : 1;
}

int Run(Args& args) {
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  auto plan = LoadPlan(*problem, args.positional[1]);
  if (!plan.ok()) return g_tool->Fail(plan.status());
  return ServePlan(*problem, *plan, args);
}

// The VQA workflow (medium infrastructure) under JellyBean's plan, one of its GPU workers killed
// at 40% of the run, with the picture.
int Demo(Args& args) {
  const std::string input = tooling::DataDir() + "/placement/vqa-medium.json";
  auto problem = LoadProblem(input);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  auto plan = Optimize(*problem, Strategy::kJellyBean);
  if (!plan.ok()) return g_tool->Fail(plan.status());
  if (args.kills.empty()) {
    // The GPU worker with the largest share of any operator: its loss moves the most work.
    int victim = -1;
    double largest = 0;
    for (const auto& shares : plan->workers) {
      for (const WorkerShare& w : shares) {
        if (problem->worker_types[problem->workers[w.worker].type].gpu && w.share > largest) {
          largest = w.share;
          victim = w.worker;
        }
      }
    }
    if (victim < 0) return g_tool->Fail(absl::InternalError("the demo's plan uses no GPU worker"));
    args.kills.push_back(
        absl::StrFormat("%s@%g", problem->workers[victim].name, 0.4 * args.serve.duration_s));
  }
  if (args.plot_path.empty()) args.plot_path = "serve-demo.png";
  // Its CPU workers outnumber any small host's cores: emulated operators sleep, so that the run
  // measures the runtime, not the host's contention.
  args.no_spin = true;
  if (!args.json) std::cerr << PlanSummary(*problem, *plan);
  return ServePlan(*problem, *plan, args);
}

// Optimizes with each strategy and serves each plan the same way (`--runs` times, medians):
// planned against measured cost, rate and latency against the simulator's for the same plan, and
// JellyBean's measured cost against each other's.
int Compare(Args& args) {
  if (int rc = ApplyServeFlags(args); rc != 0) return rc;
  if (!args.serve.failures.empty()) return g_tool->Usage("compare: --kill is not taken here");
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  // Medians over the runs of one plan; run r serves and simulates with seed + r.
  struct Row {
    std::string strategy;
    Plan plan;
    double cost = 0, compute = 0, network = 0;  // measured, per hour
    double rate = 0;                            // throughput ratio
    double p50 = 0, p99 = 0;                    // served, plan ms
    double sim_p50 = 0, sim_p99 = 0;            // simulated, plan ms
    bool sustained = false;                     // in every run
  };
  const auto median = [](const std::vector<double>& v) {
    return plexus::base::Quantile(v, 0.5, plexus::base::QuantileRule::kInterpolated);
  };
  std::vector<Row> rows;
  for (const std::string& name : args.strategies) {
    auto strategy = ParseStrategy(name);
    if (!strategy.ok()) return g_tool->Usage(std::string(strategy.status().message()));
    auto plan = Optimize(*problem, *strategy);
    if (!plan.ok()) {
      std::fprintf(stderr, "plexus-serve: %s: no plan: %s\n", name.c_str(),
                   std::string(plan.status().message()).c_str());
      continue;
    }
    Row row{name, *plan};
    row.sustained = true;
    std::vector<double> cost, compute, network, rate, p50, p99, sim_p50, sim_p99;
    for (int run = 0; run < args.runs; ++run) {
      ServeOptions options = args.serve;
      options.seed = args.serve.seed + static_cast<uint64_t>(run);
      if (!args.json) {
        std::fprintf(
            stderr, "plexus-serve: serving %s's plan for %.0f plan s (%.1f wall s), run %d of %d\n",
            name.c_str(), options.duration_s, options.duration_s / options.compression, run + 1,
            args.runs);
      }
      auto report = serving::Serve(*problem, *plan, options);
      if (!report.ok()) return g_tool->Fail(report.status());
      SimulationOptions sim;
      sim.duration_s = options.duration_s;
      sim.warmup_s = options.warmup_s;
      sim.seed = options.seed;
      sim.poisson_arrivals = options.poisson_arrivals;
      auto simulated = Simulate(*problem, *plan, sim);
      if (!simulated.ok()) return g_tool->Fail(simulated.status());
      cost.push_back(report->compute_cost_per_hour + report->network_cost_per_hour);
      compute.push_back(report->compute_cost_per_hour);
      network.push_back(report->network_cost_per_hour);
      rate.push_back(report->throughput_ratio);
      p50.push_back(report->latency_p50_ms);
      p99.push_back(report->latency_p99_ms);
      sim_p50.push_back(simulated->latency_p50_ms);
      sim_p99.push_back(simulated->latency_p99_ms);
      row.sustained = row.sustained && report->sustained;
    }
    row.cost = median(cost);
    row.compute = median(compute);
    row.network = median(network);
    row.rate = median(rate);
    row.p50 = median(p50);
    row.p99 = median(p99);
    row.sim_p50 = median(sim_p50);
    row.sim_p99 = median(sim_p99);
    rows.push_back(std::move(row));
  }
  const Row* jb = nullptr;
  for (const Row& r : rows) {
    if (r.strategy == "jb") jb = &r;
  }
  tooling::FigureWriter out("plexus_serve_compare", true);
  out.SetCommon({{"scenario", problem->name},
                 {"compression", args.serve.compression},
                 {"seconds", args.serve.duration_s},
                 {"runs", args.runs}});
  std::vector<std::vector<std::string>> table;
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  for (const Row& r : rows) {
    const double below = jb != nullptr && r.cost > 0 ? 1 - jb->cost / r.cost : 0;
    table.push_back({r.strategy, Fixed(r.plan.total_cost, 3), Fixed(r.cost, 3), Fixed(r.compute, 3),
                     Fixed(r.network, 3), Fixed(100 * r.rate, 1), Fixed(r.p50, 0),
                     Fixed(ratio(r.p50, r.sim_p50), 2), Fixed(r.p99, 0),
                     Fixed(ratio(r.p99, r.sim_p99), 2),
                     r.strategy == "jb" || jb == nullptr ? "-" : Fixed(100 * below, 1)});
    if (!args.json) continue;
    const nlohmann::json tags = {{"strategy", r.strategy}};
    // The targets hold for a plan that the workers can serve (JellyBean's); an over-capacity
    // plan's latency grows with the run and matches nothing.
    const bool held = r.strategy == "jb";
    const auto within = [&](double value, double reference, double tolerance) {
      return std::abs(ratio(value, reference) - 1) <= tolerance;
    };
    out.Add({"planned_cost_per_hour", r.plan.total_cost, "$/h", nullptr, std::nullopt, tags});
    out.Add({"measured_cost_per_hour", r.cost, "$/h", nullptr, std::nullopt, tags});
    out.Add({"measured_vs_planned_cost", ratio(r.cost, r.plan.total_cost), "ratio",
             held ? nlohmann::json(1.0) : nlohmann::json(nullptr),
             held ? std::optional<bool>(within(r.cost, r.plan.total_cost, 0.05)) : std::nullopt,
             tags});
    out.Add({"throughput_ratio", r.rate, "ratio", 0.98, r.sustained, tags});
    out.Add({"latency_p50", r.p50, "ms", nullptr, std::nullopt, tags});
    out.Add({"latency_p99", r.p99, "ms", nullptr, std::nullopt, tags});
    out.Add({"simulated_latency_p50", r.sim_p50, "ms", nullptr, std::nullopt, tags});
    out.Add({"simulated_latency_p99", r.sim_p99, "ms", nullptr, std::nullopt, tags});
    for (const auto& [figure, served, simulated] :
         {std::tuple{"latency_p50_vs_simulated", r.p50, r.sim_p50},
          std::tuple{"latency_p99_vs_simulated", r.p99, r.sim_p99}}) {
      out.Add({figure, ratio(served, simulated), "ratio",
               held ? nlohmann::json(1.0) : nlohmann::json(nullptr),
               held ? std::optional<bool>(within(served, simulated, 0.15)) : std::nullopt, tags});
    }
    if (r.strategy != "jb" && jb != nullptr) {
      out.Add({"jb_measured_cost_below", below, "fraction", 0.0, below > 0, tags});
    }
  }
  if (!args.json) {
    std::cout << tooling::FormatTable(
        {"strategy", "planned $/h", "measured $/h", "compute", "network", "rate %", "p50 ms",
         "/sim", "p99 ms", "/sim", "jb below %"},
        table,
        {.indent = "",
         .right_aligned = {false, true, true, true, true, true, true, true, true, true, true}});
    if (args.runs > 1) std::cout << "medians of " << args.runs << " runs per plan\n";
  }
  return 0;
}

// The test bed of a problem, for tools/serving/serve-bed: one place per (tier, location) where
// workers or sources are (one per replicated tier), every pair of places joined by the link the
// problem declares between them, shaped to its bandwidth times the compression (plan time runs
// that much faster), and the place of each rank of a multi-process run (rank 0, the driver, at
// the first source's; rank r at worker r - 1's). Lines:
//   place P TIER LOCATION
//   link P Q RATE_MBIT LATENCY_MS     (RATE_MBIT 0: not shaped)
//   rank R P
int Bed(Args& args) {
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  const Problem& p = *problem;
  std::vector<Position> places;
  const auto place_of = [&](Position at) {
    for (size_t i = 0; i < places.size(); ++i) {
      if (places[i].tier == at.tier && places[i].location == at.location)
        return static_cast<int>(i);
    }
    places.push_back(at);
    return static_cast<int>(places.size() - 1);
  };
  int first_source = -1;
  for (size_t op = 0; op < p.operators.size() && first_source < 0; ++op) {
    if (p.operators[op].kind == OperatorKind::kSource) first_source = static_cast<int>(op);
  }
  if (first_source < 0) {
    return g_tool->Fail(absl::InvalidArgumentError("the workflow has no source operator"));
  }
  std::vector<int> rank_place = {place_of(SourcePosition(p, first_source))};
  for (size_t op = 0; op < p.operators.size(); ++op) {
    if (p.operators[op].kind == OperatorKind::kSource)
      place_of(SourcePosition(p, static_cast<int>(op)));
  }
  for (size_t w = 0; w < p.workers.size(); ++w) {
    rank_place.push_back(place_of(WorkerPosition(p, static_cast<int>(w))));
  }
  for (size_t i = 0; i < places.size(); ++i) {
    std::printf("place %zu %s %d\n", i, p.tiers[places[i].tier].name.c_str(), places[i].location);
  }
  for (size_t a = 0; a < places.size(); ++a) {
    for (size_t b = a + 1; b < places.size(); ++b) {
      // Data flows upwards only: the link is the one from the lower place to the higher.
      const bool up = places[a].tier <= places[b].tier;
      const Link* link = LinkBetween(p, up ? places[a] : places[b], up ? places[b] : places[a]);
      if (link == nullptr) continue;
      const double mbit = link->bandwidth_gbps * 1000 * args.serve.compression;
      std::printf("link %zu %zu %.0f %g\n", a, b, mbit, link->latency_ms);
    }
  }
  for (size_t r = 0; r < rank_place.size(); ++r) std::printf("rank %zu %d\n", r, rank_place[r]);
  return 0;
}

int PlanAndRun(Args& args) {
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  auto strategy = ParseStrategy(args.strategy);
  if (!strategy.ok()) return g_tool->Usage(std::string(strategy.status().message()));
  auto plan = Optimize(*problem, *strategy);
  if (!plan.ok()) return g_tool->Fail(plan.status());
  if (!args.json) std::cerr << PlanSummary(*problem, *plan);
  return ServePlan(*problem, *plan, args);
}

void AddServeFlags(CLI::App* app, Args* a) {
  tooling::AddNumber(app, "--seconds", &a->serve.duration_s,
                     "plan seconds during which the sources inject", 1e-3, 1e6);
  tooling::AddNumber(app, "--warmup", &a->serve.warmup_s, "plan seconds left out of the figures",
                     0.0, 1e6);
  tooling::AddNumber(app, "--compression", &a->serve.compression,
                     "plan time runs this many times faster than the wall clock", 1e-3, 1e6);
  tooling::AddNumber(app, "--seed", &a->serve.seed, "random seed", uint64_t{0},
                     std::numeric_limits<uint64_t>::max());
  tooling::AddNumber(app, "--drain-timeout", &a->serve.drain_timeout_s,
                     "wall seconds to wait for requests in flight after injection", 0.0, 3600.0);
  app->add_flag("--poisson", a->serve.poisson_arrivals, "Poisson arrivals (default constant)");
  app->add_option("--transport", a->transport, "inproc|tcp")->capture_default_str();
  app->add_option("--balance", a->balance,
                  "shares (the plan's, weighted round robin) | daronpon (redirect to the worker "
                  "where the request would finish first)")
      ->capture_default_str();
  app->add_flag("--no-spin", a->no_spin,
                "emulated operators on CPU workers sleep instead of burning the CPU");
  app->add_option("--spike", a->spike,
                  "AT:SECONDS:FACTOR: from plan second AT, for SECONDS, the sources inject "
                  "FACTOR times their rate");
  app->add_option("--kill", a->kills,
                  "WORKER@SECONDS: stop that worker at once at that plan second, as if its "
                  "process died (repeatable); the runtime re-plans without it and resumes");
  tooling::AddNumber(app, "--failure-timeout", &a->serve.failure_timeout_s,
                     "wall seconds a worker has to answer a health check", 1e-3, 3600.0);
  app->add_flag("--shaped-links", a->serve.shaped_links,
                "the network between tiers is shaped to the problem's links (tools/serving/"
                "serve-bed): hold messages for the links' latency only");
  app->add_option("--address", a->address,
                  "the interface the tcp servers of the driver and of the workers listen on")
      ->capture_default_str();
  app->add_option("--report", a->report_path, "write the whole report (with its timeline) as JSON");
  app->add_option("--plot", a->plot_path,
                  "draw completions and latency over time, failures marked (PNG)");
  tooling::AddJsonFlag(app, &a->json);
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-serve",
                     "Serve an ML workflow under a placement plan: one rpc server per worker, real "
                     "messages, emulated operators in compressed time (docs/placement.md, "
                     "\"Serving\").");
  g_tool = &tool;
  tool.app().require_subcommand(1);
  Args args;
  CLI::App* run = tool.Subcommand("run", "serve a plan written by plexus-place optimize --out");
  run->add_option("files", args.positional, "IN.json PLAN.json")->required()->expected(2);
  AddServeFlags(run, &args);
  CLI::App* plan_and_run =
      tool.Subcommand("plan-and-run", "optimize with a strategy (plexus-place's), then serve");
  plan_and_run->add_option("input", args.positional, "IN.json")->required()->expected(1);
  plan_and_run->add_option("--strategy", args.strategy, "jb|lb|bf|ff|pte|ptc|spc")
      ->capture_default_str();
  AddServeFlags(plan_and_run, &args);
  CLI::App* compare = tool.Subcommand(
      "compare",
      "optimize with each strategy and serve each plan the same way: planned and measured cost, "
      "rate, latency, and how far below each other JellyBean's measured cost is");
  compare->add_option("input", args.positional, "IN.json")->required()->expected(1);
  tooling::AddNumber(compare, "--runs", &args.runs,
                     "serve (and simulate) each plan this many times, seeds seed..seed+runs-1; "
                     "the table shows medians",
                     1, 100);
  compare->add_option("--strategies", args.strategies, "jb|lb|bf|ff|pte|ptc|spc, several")
      ->delimiter(',')
      ->capture_default_str();
  AddServeFlags(compare, &args);
  CLI::App* demo = tool.Subcommand(
      "demo",
      "serve the VQA workflow (share/plexus/data/placement/vqa-medium.json) under JellyBean's "
      "plan, kill a GPU worker at 40% of the run (or --kill), re-plan, and draw "
      "serve-demo.png (or --plot)");
  args.serve.duration_s = 60;
  AddServeFlags(demo, &args);
  CLI::App* bed = tool.Subcommand(
      "bed",
      "print the network test bed of IN.json for tools/serving/serve-bed: one place per tier "
      "location, the links between them shaped to bandwidth x compression, each rank's place");
  bed->add_option("input", args.positional, "IN.json")->required()->expected(1);
  tooling::AddNumber(bed, "--compression", &args.serve.compression,
                     "plan time runs this many times faster than the wall clock", 1e-3, 1e6);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (bed->parsed()) return Bed(args);
  args.serve.address = args.address;
  // Under a launcher (plexus-run, mpirun, srun, torchrun) every rank but 0 is a host of workers.
  auto launch = pt::ParseLaunchEnvironment(pt::ProcessEnvironment());
  if (!launch.ok()) return tool.Fail(launch.status());
  std::optional<pt::Rendezvous> rendezvous;
  if (launch->world_size > 1) {
    auto joined = pt::Rendezvous::FromEnv();
    if (!joined.ok()) return tool.Fail(joined.status());
    rendezvous.emplace(std::move(*joined));
    if (rendezvous->rank() != 0) {
      serving::HostOptions options;
      options.address = args.address;
      if (absl::Status s = serving::ServeAsHost(*rendezvous, options); !s.ok()) {
        return tool.Fail(s);
      }
      return 0;
    }
    auto hosts = serving::HostsOf(*rendezvous, absl::Seconds(60));
    if (!hosts.ok()) return tool.Fail(hosts.status());
    args.serve.hosts = *hosts;
    if (args.transport != "tcp") {
      std::fprintf(stderr, "plexus-serve: %d host processes: serving over tcp\n",
                   rendezvous->world_size() - 1);
      args.transport = "tcp";
    }
  }
  int rc = 0;
  if (run->parsed()) {
    rc = Run(args);
  } else if (demo->parsed()) {
    rc = Demo(args);
  } else if (compare->parsed()) {
    rc = Compare(args);
  } else {
    rc = PlanAndRun(args);
  }
  if (!args.serve.hosts.empty()) {
    if (absl::Status s = serving::ShutdownHosts(args.serve.hosts, args.address); !s.ok()) {
      std::fprintf(stderr, "plexus-serve: %s\n", std::string(s.message()).c_str());
    }
  }
  return rc;
}
