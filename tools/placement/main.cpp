// plexus-place: optimize, simulate and compare ML workflow placements (docs/placement.md).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/placement/simulator.hpp"

namespace {

using namespace plexus::placement;

constexpr char kUsage[] =
    "usage:\n"
    "  plexus-place optimize IN.json [--strategy jb|lb|bf|ff|pte|ptc|spc] [--json] "
    "[--out PLAN.json]\n"
    "  plexus-place simulate IN.json PLAN.json [--duration S] [--warmup S] [--seed N] "
    "[--poisson] [--json]\n"
    "  plexus-place compare IN.json [--strategies jb,lb,...] [--json]\n"
    "  plexus-place validate IN.json\n"
    "Strategies: jb (JellyBean), lb (exact optimum, branch-and-bound), bf (best fit), ff (first\n"
    "fit), pte/ptc (whole workflow on one edge/cloud GPU), spc (data-parallel on every cloud "
    "GPU).\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "plexus-place: %s\n", message.c_str());
  return 1;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "plexus-place: %s\n%s", message.c_str(), kUsage);
  return 2;
}

struct Args {
  std::vector<std::string> positional;
  std::string strategy = "jb";
  std::string strategies;
  std::string out;
  bool json = false;
  bool poisson = false;
  SimulationOptions simulation;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    auto number = [&](double& slot) -> absl::Status {
      auto text = value();
      if (!text.ok()) return text.status();
      if (!absl::SimpleAtod(*text, &slot)) {
        return absl::InvalidArgumentError(absl::StrCat(arg, ": '", *text, "' is not a number"));
      }
      return absl::OkStatus();
    };
    if (arg == "--json") {
      args.json = true;
    } else if (arg == "--poisson") {
      args.simulation.poisson_arrivals = true;
    } else if (arg == "--strategy" || arg == "--strategies" || arg == "--out") {
      auto text = value();
      if (!text.ok()) return text.status();
      (arg == "--strategy" ? args.strategy : arg == "--out" ? args.out : args.strategies) = *text;
    } else if (arg == "--duration") {
      if (auto s = number(args.simulation.duration_s); !s.ok()) return s;
    } else if (arg == "--warmup") {
      if (auto s = number(args.simulation.warmup_s); !s.ok()) return s;
    } else if (arg == "--seed") {
      auto text = value();
      if (!text.ok()) return text.status();
      if (!absl::SimpleAtoi(*text, &args.simulation.seed)) {
        return absl::InvalidArgumentError(absl::StrCat("--seed: '", *text, "' is not a number"));
      }
    } else if (!arg.empty() && arg[0] == '-') {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", arg, "'"));
    } else {
      args.positional.push_back(arg);
    }
  }
  return args;
}

void Progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

int Optimize(const Args& args) {
  if (args.positional.size() != 1) return Usage("optimize needs exactly one input file");
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  auto strategy = ParseStrategy(args.strategy);
  if (!strategy.ok()) return Usage(std::string(strategy.status().message()));
  auto plan = Optimize(*problem, *strategy, Progress);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  const std::string json = PlanToJson(*problem, *plan);
  if (!args.out.empty()) {
    std::ofstream out(args.out);
    out << json << "\n";
    if (!out) return Fail(absl::StrCat("cannot write '", args.out, "'"));
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
  auto problem = LoadProblem(args.positional[0]);
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
  auto problem = LoadProblem(args.positional[0]);
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
  auto problem = LoadProblem(args.positional[0]);
  if (!problem.ok()) return Fail(std::string(problem.status().message()));
  std::cout << args.positional[0] << ": valid (" << problem->operators.size() << " operators, "
            << problem->workers.size() << " workers on " << problem->tiers.size()
            << " tiers; best reachable accuracy " << BestReachableAccuracy(*problem) << ", target "
            << problem->objective.accuracy_target << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("missing command");
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) return Usage(std::string(args.status().message()));
  if (command == "optimize") return Optimize(*args);
  if (command == "simulate") return Simulate(*args);
  if (command == "compare") return Compare(*args);
  if (command == "validate") return Validate(*args);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}
