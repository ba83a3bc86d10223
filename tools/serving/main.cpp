// plexus-serve: serve an ML workflow under a placement plan with the serving runtime: one rpc
// server per plan worker, real messages between them, emulated operators in compressed time
// (docs/placement.md, "Serving").
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/serving/serve.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/table.hpp"

namespace {

using namespace plexus::placement;
using plexus::serving::ServeOptions;
using plexus::serving::ServeReport;
namespace serving = plexus::serving;
namespace tooling = plexus::tooling;

struct Args {
  std::vector<std::string> positional;
  std::string strategy = "jb";
  std::string transport = "inproc";
  bool no_spin = false;
  bool json = false;
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

int ServePlan(const Problem& problem, const Plan& plan, Args& args) {
  if (args.transport == "tcp") {
    args.serve.wire = serving::Wire::kTcp;
  } else if (args.transport != "inproc") {
    return g_tool->Usage("--transport: expected inproc or tcp, got '" + args.transport + "'");
  }
  args.serve.cpu_spins = !args.no_spin;
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
  auto report = serving::Serve(problem, plan, args.serve);
  if (!report.ok()) return g_tool->Fail(report.status());
  if (args.json) {
    PrintFigures(problem, *report, args);
  } else {
    PrintTables(problem, *report);
  }
  return 0;
}

int Run(Args& args) {
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return g_tool->Fail(problem.status());
  auto plan = LoadPlan(*problem, args.positional[1]);
  if (!plan.ok()) return g_tool->Fail(plan.status());
  return ServePlan(*problem, *plan, args);
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
  app->add_flag("--no-spin", a->no_spin,
                "emulated operators on CPU workers sleep instead of burning the CPU");
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
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (run->parsed()) return Run(args);
  return PlanAndRun(args);
}
