// plexus-bench-moe-placement: how often each placement policy reaches the optimum recovery (by
// ExactPlacement) on tiny random instances, per shape class (c divides E or not) and per number
// of failures k. A table by default, --json for one JSON object per figure and line.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/moe/placement_quality.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace moe = plexus::moe;
namespace tooling = plexus::tooling;

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-bench-moe-placement",
                     "Fraction of tiny random instances (N <= 6, c <= 3, every k) where the "
                     "default placement (best) and MRO, spread, compact reach the exact optimum.");
  moe::PlacementQualityOptions options;
  bool json = false;
  tooling::AddNumber(&tool.app(), "--instances", &options.instances_per_class,
                     "random instances per shape class", 1, 1'000'000);
  tooling::AddNumber(&tool.app(), "--seed", &options.seed, "random seed", uint64_t{0},
                     ~uint64_t{0});
  tooling::AddNumber(&tool.app(), "--max-nodes", &options.max_nodes, "largest N", 2, 12);
  tooling::AddNumber(&tool.app(), "--max-slots", &options.max_slots, "largest c", 2, 8);
  tooling::AddJsonFlag(&tool.app(), &json);
  if (auto code = tool.Parse(argc, argv)) return *code;

  auto rows = moe::PlacementQualitySweep(options);
  if (!rows.ok()) return tool.Fail(std::string(rows.status().message()));
  tooling::FigureWriter writer("moe_placement", json);
  for (const moe::PlacementQualityRow& row : *rows) {
    const std::string k = row.failures < 0 ? "all" : std::to_string(row.failures);
    nlohmann::json extra = {{"shape", row.shape},
                            {"k", k},
                            {"cases", row.cases},
                            {"mro_optimal", row.mro_fraction()},
                            {"spread_optimal", static_cast<double>(row.spread_optimal) /
                                                   static_cast<double>(row.cases)},
                            {"compact_optimal", static_cast<double>(row.compact_optimal) /
                                                    static_cast<double>(row.cases)},
                            {"mro_below_baseline", row.mro_below_baseline},
                            {"best_below_baseline", row.best_below_baseline},
                            {"best_worst_ratio", row.best_worst_ratio},
                            {"mro_worst_ratio", row.mro_worst_ratio}};
    tooling::Figure figure{absl::StrCat("best_optimal_fraction_", row.shape, "_k", k),
                           row.best_fraction(),
                           "fraction",
                           nullptr,
                           std::nullopt,
                           extra};
    if (row.failures < 0) {
      figure.target = ">= 0.99, never below spread/compact";
      figure.met = row.best_fraction() >= 0.99 && row.best_below_baseline == 0;
    }
    writer.Add(figure);
  }
  if (!json) writer.PrintTable();
  return writer.all_met() ? 0 : 1;
}
