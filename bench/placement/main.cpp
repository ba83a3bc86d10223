// plexus-bench-placement: the targets of the placement library (docs/placement.md).
//  1. JellyBean's cost gap to the exact optimum `lb` over random instances lb can prove.
//  2. JellyBean optimizer time on the xlarge scenarios (median of repeated runs).
//  3. lb time on the large scenarios.
//  4. The paper's ranking on the bundled scenarios (JB <= BF, FF; JB >= 30% cheaper than PTc on
//     the VQA scenarios).
//  5. The simulator sustaining the target rate under every bundled scenario's JellyBean plan.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "plexus/base/quantile.hpp"
#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/random_instance.hpp"
#include "plexus/placement/simulator.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace {

using namespace plexus::placement;
using Json = nlohmann::json;

struct Options {
  bool json = false;
  int instances = 300;
  int repeats = 51;
  double sim_duration_s = 60;
  std::string data_dir = plexus::tooling::DataDir() + "/placement";
};

double Quantile(std::vector<double> values, double q) {
  return plexus::base::Quantile(std::move(values), q, plexus::base::QuantileRule::kInterpolated);
}

void Log(const Options& options, const std::string& line) {
  if (!options.json) std::fprintf(stderr, "%s\n", line.c_str());
}

std::vector<std::string> Scenarios(const Options& options) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(options.data_dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  const std::string real = options.data_dir + "/jellybean-vqa/vqa-medium-release.json";
  if (std::filesystem::exists(real)) files.push_back(real);
  std::sort(files.begin(), files.end());
  return files;
}

Json RandomGap(const Options& options) {
  std::vector<double> gaps, lb_ms, jb_ms;
  int proven = 0, unproven = 0, jb_failed = 0;
  Json worst = Json::array();
  for (int seed = 1; seed <= options.instances; ++seed) {
    Problem problem = RandomInstance({.seed = static_cast<uint64_t>(seed)});
    problem.options.lb_time_limit_s = 10;
    auto jb = Optimize(problem, Strategy::kJellyBean);
    auto lb = Optimize(problem, Strategy::kExact);
    if (!lb.ok() || !lb->proven_optimal) {
      ++unproven;
      continue;
    }
    ++proven;
    lb_ms.push_back(lb->optimizer_ms);
    if (!jb.ok()) {
      ++jb_failed;
      gaps.push_back(1e9);
      worst.push_back(
          {{"seed", seed}, {"gap", nullptr}, {"jb_error", std::string(jb.status().message())}});
      continue;
    }
    jb_ms.push_back(jb->optimizer_ms);
    const double gap = jb->total_cost / lb->total_cost - 1;
    gaps.push_back(gap);
    if (gap > 0.01) worst.push_back({{"seed", seed}, {"gap", gap}});
    if (seed % 50 == 0)
      Log(options, absl::StrCat("random instances: ", seed, "/", options.instances));
  }
  const double within = static_cast<double>(std::count_if(gaps.begin(), gaps.end(),
                                                          [](double g) { return g <= 0.01; })) /
                        std::max<size_t>(1, gaps.size());
  const double exact = static_cast<double>(std::count_if(gaps.begin(), gaps.end(),
                                                         [](double g) { return g <= 1e-9; })) /
                       std::max<size_t>(1, gaps.size());
  Json buckets = Json::object();
  const double edges[] = {1e-9, 0.001, 0.01, 0.05, 0.10};
  const char* names[] = {"0", "(0,0.1%]", "(0.1%,1%]", "(1%,5%]", "(5%,10%]"};
  for (int b = 0; b < 5; ++b) {
    const double low = b == 0 ? -1 : edges[b - 1];
    buckets[names[b]] =
        std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > low && g <= edges[b]; });
  }
  buckets[">10% or failed"] =
      std::count_if(gaps.begin(), gaps.end(), [](double g) { return g > 0.10; });
  return {{"instances", options.instances},
          {"proven_by_lb", proven},
          {"not_proven", unproven},
          {"jb_failed", jb_failed},
          {"fraction_within_1pct", within},
          {"fraction_exact", exact},
          {"gap_p50", Quantile(gaps, 0.5)},
          {"gap_p90", Quantile(gaps, 0.9)},
          {"gap_p95", Quantile(gaps, 0.95)},
          {"gap_p99", Quantile(gaps, 0.99)},
          {"gap_max", gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end())},
          {"gap_histogram", buckets},
          {"instances_above_1pct", worst},
          {"lb_ms_median", Quantile(lb_ms, 0.5)},
          {"lb_ms_max", lb_ms.empty() ? 0 : *std::max_element(lb_ms.begin(), lb_ms.end())},
          {"jb_ms_median", Quantile(jb_ms, 0.5)}};
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  plexus::tooling::Tool tool("plexus-bench-placement",
                             "The targets of the placement library (docs/placement.md).");
  CLI::App& app = tool.app();
  plexus::tooling::AddJsonFlag(&app, &options.json);
  plexus::tooling::AddNumber(&app, "--instances", &options.instances,
                             "random instances for the JellyBean gap", 1, 1000000);
  plexus::tooling::AddNumber(&app, "--repeats", &options.repeats,
                             "optimizer runs per timed scenario", 1, 1000000);
  plexus::tooling::AddNumber(&app, "--sim-duration", &options.sim_duration_s,
                             "simulated seconds per scenario", 10.001, 1e7);
  app.add_option("--data", options.data_dir, "scenario folder")->capture_default_str();
  if (auto code = tool.Parse(argc, argv)) return *code;
  std::vector<std::string> files = Scenarios(options);
  if (files.empty()) {
    std::fprintf(stderr, "plexus-bench-placement: no scenarios in '%s' (use --data DIR)\n",
                 options.data_dir.c_str());
    return 1;
  }

  Json result;
  Json targets = Json::object();

  Log(options, "1/5 random instances: JellyBean vs the exact optimum...");
  result["random"] = RandomGap(options);
  const double within = result["random"]["fraction_within_1pct"];
  targets["jb_within_1pct_of_lb"] = {
      {"value", within},
      {"target", ">= 0.95 of >= 200 proven instances"},
      {"met", within >= 0.95 && result["random"]["proven_by_lb"].get<int>() >= 200}};

  Json ranking = Json::array(), simulation = Json::array(), jb_times = Json::array(),
       lb_times = Json::array();
  bool ranking_ok = true, sim_ok = true, jb_time_ok = true, lb_ok = true;
  for (const std::string& file : files) {
    auto problem = LoadProblem(file);
    if (!problem.ok()) {
      std::fprintf(stderr, "%s\n", std::string(problem.status().message()).c_str());
      return 1;
    }
    const std::string name = problem->name;
    Log(options, absl::StrCat("scenario ", name, "..."));
    const bool xlarge = name.find("xlarge") != std::string::npos;
    const bool large = !xlarge && name.find("large") != std::string::npos;
    if (xlarge) {
      std::vector<double> ms;
      for (int r = 0; r < options.repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        auto plan = Optimize(*problem, Strategy::kJellyBean);
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
        if (!plan.ok()) ms.back() = 1e9;
      }
      const double median = Quantile(ms, 0.5);
      jb_time_ok = jb_time_ok && median <= 5.0;
      jb_times.push_back({{"scenario", name},
                          {"median_ms", median},
                          {"p90_ms", Quantile(ms, 0.9)},
                          {"repeats", options.repeats}});
    }
    std::vector<ComparisonRow> rows = CompareStrategies(*problem, AllStrategies());
    Json costs = Json::object();
    const Plan* jb = nullptr;
    const Plan* ptc = nullptr;
    double bf = -1, ff = -1;
    for (const ComparisonRow& row : rows) {
      const std::string s(StrategyName(row.strategy));
      if (!row.plan.ok()) {
        costs[s] = {{"error", std::string(row.plan.status().message())}};
        continue;
      }
      costs[s] = {{"compute", row.plan->compute_cost},    {"network", row.plan->network_cost},
                  {"total", row.plan->total_cost},        {"accuracy", row.plan->accuracy},
                  {"capacity_ok", row.plan->capacity_ok}, {"optimizer_ms", row.plan->optimizer_ms}};
      if (row.strategy == Strategy::kJellyBean) jb = &*row.plan;
      if (row.strategy == Strategy::kCloudGpu) ptc = &*row.plan;
      if (row.strategy == Strategy::kBestFit) bf = row.plan->total_cost;
      if (row.strategy == Strategy::kFirstFit) ff = row.plan->total_cost;
      if (row.strategy == Strategy::kExact) {
        costs[s]["proven_optimal"] = row.plan->proven_optimal;
        if (large) {
          lb_ok = lb_ok && row.plan->proven_optimal && row.plan->optimizer_ms <= 60'000;
          lb_times.push_back({{"scenario", name},
                              {"ms", row.plan->optimizer_ms},
                              {"proven_optimal", row.plan->proven_optimal},
                              {"nodes", row.plan->search_nodes}});
        }
      }
    }
    if (large && !costs["lb"].contains("total")) {
      lb_ok = false;
      lb_times.push_back({{"scenario", name}, {"error", costs["lb"]["error"]}});
    }
    // A baseline that fails (no plan) counts as ranked below JB.
    const bool vqa = name.find("vqa") != std::string::npos;
    bool ok = jb != nullptr && (bf < 0 || jb->total_cost <= bf + 1e-9) &&
              (ff < 0 || jb->total_cost <= ff + 1e-9);
    double saving_vs_ptc = 0;
    if (jb != nullptr && ptc != nullptr) saving_vs_ptc = 1 - jb->total_cost / ptc->total_cost;
    if (vqa) ok = ok && (ptc == nullptr || saving_vs_ptc >= 0.30);
    ranking_ok = ranking_ok && ok;
    ranking.push_back({{"scenario", name},
                       {"costs", costs},
                       {"jb_saving_vs_ptc", saving_vs_ptc},
                       {"ranking_holds", ok}});
    if (jb != nullptr) {
      SimulationOptions sim;
      sim.duration_s = options.sim_duration_s;
      auto report = Simulate(*problem, *jb, sim);
      if (!report.ok()) {
        sim_ok = false;
        simulation.push_back(
            {{"scenario", name}, {"error", std::string(report.status().message())}});
      } else {
        sim_ok = sim_ok && report->throughput_ratio >= 0.98;
        simulation.push_back({{"scenario", name},
                              {"throughput_ratio", report->throughput_ratio},
                              {"latency_p50_ms", report->latency_p50_ms},
                              {"latency_p99_ms", report->latency_p99_ms},
                              {"plan_network_cost", jb->network_cost},
                              {"simulated_network_cost", report->network_cost_per_hour},
                              {"events", report->events}});
      }
    } else {
      sim_ok = false;
    }
  }
  result["jb_time_xlarge"] = jb_times;
  result["lb_large"] = lb_times;
  result["ranking"] = ranking;
  result["simulation"] = simulation;
  double worst_median = 0;
  for (const Json& t : jb_times)
    worst_median = std::max(worst_median, t["median_ms"].get<double>());
  targets["jb_median_ms_xlarge"] = {
      {"value", worst_median}, {"target", "<= 5 ms"}, {"met", jb_time_ok && !jb_times.empty()}};
  double worst_lb = 0;
  for (const Json& t : lb_times) {
    if (t.contains("ms")) worst_lb = std::max(worst_lb, t["ms"].get<double>());
  }
  targets["lb_proves_large_ms"] = {
      {"value", worst_lb}, {"target", "proven, <= 60000 ms"}, {"met", lb_ok && !lb_times.empty()}};
  targets["ranking_jb_le_bf_ff_and_30pct_below_ptc_on_vqa"] = {{"met", ranking_ok}};
  double worst_ratio = 1e9;
  for (const Json& s : simulation) {
    if (s.contains("throughput_ratio")) {
      worst_ratio = std::min(worst_ratio, s["throughput_ratio"].get<double>());
    }
  }
  targets["simulator_sustains_jb_plans"] = {
      {"value", worst_ratio}, {"target", ">= 0.98"}, {"met", sim_ok}};
  result["targets"] = targets;

  if (options.json) {
    // One plexus::tooling figure line per target and per timed scenario.
    plexus::tooling::FigureWriter out("placement", true);
    for (const Json& t : jb_times) {
      out.Add({"jb_median_ms", t["median_ms"].get<double>(), "ms", nullptr, std::nullopt, t});
    }
    for (auto it = targets.begin(); it != targets.end(); ++it) {
      const Json& t = it.value();
      const std::string unit = it.key().find("_ms") != std::string::npos      ? "ms"
                               : it.key().find("within") != std::string::npos ? "fraction"
                               : it.key() == "simulator_sustains_jb_plans"    ? "ratio"
                                                                              : "bool";
      const double value =
          t.contains("value") ? t["value"].get<double>() : (t["met"].get<bool>() ? 1.0 : 0.0);
      out.Add({it.key(), value, unit, t.contains("target") ? t["target"] : Json(nullptr),
               t["met"].get<bool>(), Json::object()});
    }
    return 0;
  }
  const Json& r = result["random"];
  std::printf("random instances: %d proven by lb (of %d); JB within 1%%: %.1f%%, exact: %.1f%%\n",
              r["proven_by_lb"].get<int>(), options.instances,
              100 * r["fraction_within_1pct"].get<double>(),
              100 * r["fraction_exact"].get<double>());
  std::printf("  gap p50 %.4f%%, p90 %.4f%%, p95 %.4f%%, p99 %.4f%%, max %.4f%%; histogram %s\n",
              100 * r["gap_p50"].get<double>(), 100 * r["gap_p90"].get<double>(),
              100 * r["gap_p95"].get<double>(), 100 * r["gap_p99"].get<double>(),
              100 * r["gap_max"].get<double>(), r["gap_histogram"].dump().c_str());
  for (const Json& t : jb_times) {
    std::printf("jb time %-16s median %.3f ms (p90 %.3f ms)\n",
                t["scenario"].get<std::string>().c_str(), t["median_ms"].get<double>(),
                t["p90_ms"].get<double>());
  }
  for (const Json& t : lb_times) std::printf("lb on %s\n", t.dump().c_str());
  std::printf("%-22s %9s %9s %9s %9s %9s %9s %9s  %s\n", "scenario", "jb", "lb", "bf", "ff", "pte",
              "ptc", "spc", "ranking");
  for (const Json& row : ranking) {
    std::printf("%-22s", row["scenario"].get<std::string>().c_str());
    for (const char* s : {"jb", "lb", "bf", "ff", "pte", "ptc", "spc"}) {
      const Json& c = row["costs"][s];
      if (c.contains("total")) {
        std::printf(" %8.3f%s", c["total"].get<double>(), c["capacity_ok"].get<bool>() ? " " : "!");
      } else {
        std::printf(" %9s", "n/a");
      }
    }
    std::printf("  %s\n", row["ranking_holds"].get<bool>() ? "holds" : "VIOLATED");
  }
  std::printf("(! = over capacity; n/a = not applicable or infeasible)\n");
  for (const Json& s : simulation) std::printf("simulated %s\n", s.dump().c_str());
  std::printf("targets:\n");
  for (auto it = targets.begin(); it != targets.end(); ++it) {
    std::printf("  %-48s %s %s\n", it.key().c_str(),
                it.value()["met"].get<bool>() ? "MET " : "MISSED",
                it.value().contains("value") ? it.value()["value"].dump().c_str() : "");
  }
  return 0;
}
