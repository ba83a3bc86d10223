// plexus-place: optimize, simulate and compare ML workflow placements (docs/placement.md).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/placement/simulator.hpp"
#include "plexus/tooling/cli.hpp"

namespace {

using namespace plexus::placement;
namespace tooling = plexus::tooling;

constexpr char kStrategies[] =
    "Strategies: jb (JellyBean), lb (exact optimum, branch-and-bound), bf (best fit), ff (first\n"
    "fit), pte/ptc (whole workflow on one edge/cloud GPU), spc (data-parallel on every cloud "
    "GPU).";

struct Args {
  std::vector<std::string> positional;
  std::string strategy = "jb";
  std::string strategies;
  std::string out;
  bool json = false;
  std::string byte_units;  // empty: the input's options (default decimal)
  std::string share_rule;  // empty: the input's options (default proportional)
  SimulationOptions simulation;
};

const tooling::Tool* g_tool = nullptr;

int Fail(const std::string& message) { return g_tool->Fail(message); }
int Usage(const std::string& message) { return g_tool->Usage(message); }

void Progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

// Loads the input and applies the cost-model flags over its `options`.
absl::StatusOr<Problem> Load(const Args& args, const std::string& path) {
  auto problem = LoadProblem(path);
  if (!problem.ok()) return problem;
  if (!args.byte_units.empty()) {
    auto units = ParseByteUnits(args.byte_units);
    if (!units.ok())
      return absl::InvalidArgumentError(absl::StrCat("--byte-units: ", units.status().message()));
    problem->options.byte_units = *units;
  }
  if (!args.share_rule.empty()) {
    auto rule = ParseShareRule(args.share_rule);
    if (!rule.ok())
      return absl::InvalidArgumentError(absl::StrCat("--share-rule: ", rule.status().message()));
    problem->options.share_rule = *rule;
  }
  return problem;
}

// --byte-units and --share-rule on a subcommand.
void AddCostModelFlags(CLI::App* app, Args* args) {
  app->add_option("--byte-units", args->byte_units,
                  "decimal (KB = 10^3, GB = 10^9 bytes; default) or binary (2^10, 2^30: the "
                  "JellyBean release's)");
  app->add_option("--share-rule", args->share_rule,
                  "proportional (to throughput; default) or fill_in_order (the release's: "
                  "cheapest per request first at full throughput, the last worker the rest)");
}

int Optimize(const Args& args) {
  if (args.positional.size() != 1) return Usage("optimize needs exactly one input file");
  auto problem = Load(args, args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  auto strategy = ParseStrategy(args.strategy);
  if (!strategy.ok()) return Usage(std::string(strategy.status().message()));
  auto plan = Optimize(*problem, *strategy, Progress);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  const std::string json = PlanToJson(*problem, *plan);
  if (!args.out.empty()) {
    if (absl::Status s = plexus::base::WriteFileAtomic(args.out, json + "\n"); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (args.json) {
    std::cout << json << "\n";
  } else {
    std::cout << PlanSummary(*problem, *plan);
    if (!args.out.empty()) std::cout << "plan written to " << args.out << "\n";
  }
  return 0;
}

int Simulate(const Args& args) {
  if (args.positional.size() != 2) return Usage("simulate needs an input file and a plan file");
  auto problem = Load(args, args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  auto plan = LoadPlan(*problem, args.positional[1]);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  if (!args.json) {
    std::fprintf(stderr, "simulating %.0f s of '%s' under plan '%s'...\n",
                 args.simulation.duration_s, problem->name.c_str(), plan->strategy.c_str());
  }
  auto report = Simulate(*problem, *plan, args.simulation);
  if (!report.ok()) return Fail(std::string(report.status().message()));
  std::cout << (args.json ? SimulationToJson(*problem, *report) + "\n"
                          : SimulationSummary(*problem, *report));
  return 0;
}

int Compare(const Args& args) {
  if (args.positional.size() != 1) return Usage("compare needs exactly one input file");
  auto problem = Load(args, args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  std::vector<Strategy> strategies = AllStrategies();
  if (!args.strategies.empty()) {
    strategies.clear();
    for (absl::string_view name : absl::StrSplit(args.strategies, ',')) {
      auto strategy = ParseStrategy(std::string(name));
      if (!strategy.ok()) return Usage(std::string(strategy.status().message()));
      strategies.push_back(*strategy);
    }
  }
  auto rows = CompareStrategies(*problem, strategies, args.json ? ProgressFn() : Progress);
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const ComparisonRow& row : rows) {
      nlohmann::json entry;
      entry["strategy"] = std::string(StrategyName(row.strategy));
      if (row.plan.ok()) {
        entry["plan"] = nlohmann::json::parse(PlanToJson(*problem, *row.plan));
      } else {
        entry["error"] = std::string(row.plan.status().message());
      }
      out.push_back(entry);
    }
    std::cout << out.dump(1) << "\n";
  } else {
    std::cout << "scenario '" << problem->name << "': accuracy target "
              << problem->objective.accuracy_target << ", costs per hour\n"
              << ComparisonTable(rows);
  }
  return 0;
}

int Validate(const Args& args) {
  if (args.positional.size() != 1) return Usage("validate needs exactly one input file");
  auto problem = Load(args, args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  std::cout << args.positional[0] << ": valid (" << problem->operators.size() << " operators, "
            << problem->workers.size() << " workers on " << problem->tiers.size()
            << " tiers; best reachable accuracy " << BestReachableAccuracy(*problem) << ", target "
            << problem->objective.accuracy_target << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-place",
                     std::string("Optimize, simulate and compare ML workflow placements "
                                 "(docs/placement.md).\n") +
                         kStrategies);
  g_tool = &tool;
  tool.app().require_subcommand(1);
  Args args;
  CLI::App* optimize = tool.Subcommand("optimize", "the placement of one strategy");
  optimize->add_option("input", args.positional, "IN.json")->required()->expected(1);
  optimize->add_option("--strategy", args.strategy, "jb|lb|bf|ff|pte|ptc|spc")
      ->capture_default_str();
  optimize->add_option("--out", args.out, "also write the plan to PLAN.json");
  tooling::AddJsonFlag(optimize, &args.json);
  AddCostModelFlags(optimize, &args);

  CLI::App* simulate = tool.Subcommand("simulate", "serve the workflow under a plan");
  simulate->add_option("files", args.positional, "IN.json PLAN.json")->required()->expected(2);
  tooling::AddNumber(simulate, "--duration", &args.simulation.duration_s, "simulated seconds", 1e-3,
                     1e7);
  tooling::AddNumber(simulate, "--warmup", &args.simulation.warmup_s,
                     "seconds left out of the figures", 0.0, 1e7);
  tooling::AddNumber(simulate, "--seed", &args.simulation.seed, "random seed",
                     decltype(args.simulation.seed){0},
                     std::numeric_limits<decltype(args.simulation.seed)>::max());
  simulate->add_flag("--poisson", args.simulation.poisson_arrivals, "Poisson arrivals");
  AddCostModelFlags(simulate, &args);
  tooling::AddJsonFlag(simulate, &args.json);

  CLI::App* compare = tool.Subcommand("compare", "the cost of every strategy");
  compare->add_option("input", args.positional, "IN.json")->required()->expected(1);
  compare->add_option("--strategies", args.strategies, "comma-separated, default all");
  tooling::AddJsonFlag(compare, &args.json);
  AddCostModelFlags(compare, &args);

  CLI::App* validate = tool.Subcommand("validate", "check an input file");
  validate->add_option("input", args.positional, "IN.json")->required()->expected(1);

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (optimize->parsed()) return Optimize(args);
  if (simulate->parsed()) return Simulate(args);
  if (compare->parsed()) return Compare(args);
  return Validate(args);
}
