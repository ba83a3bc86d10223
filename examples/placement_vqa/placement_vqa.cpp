// JellyBean as a plain function call: the cheapest placement of the VQA workflow (the JellyBean
// authors' medium input, bundled) that meets its accuracy and throughput targets, next to the
// exact optimum and the paper's baselines.
//
//   build/examples/placement-vqa [problem.json]
//
// Without an argument it reads placement/jellybean-vqa/vqa-medium-release.json from the data
// Plexus installs (PLEXUS_DATA_DIR: <prefix>/share/plexus/data; in Plexus's tree, examples/data).
#include <cstdio>
#include <string>

#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/problem.hpp"

namespace pp = plexus::placement;

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : PLEXUS_DATA_DIR "/placement/jellybean-vqa/vqa-medium-release.json";
  auto problem = pp::LoadProblem(path);
  if (!problem.ok()) {
    std::fprintf(stderr, "placement-vqa: %s\n", std::string(problem.status().message()).c_str());
    return 1;
  }
  auto plan = pp::Optimize(*problem, pp::Strategy::kJellyBean);
  if (!plan.ok()) {
    std::fprintf(stderr, "placement-vqa: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::printf("JellyBean plan for %s: %.4f/h (compute %.4f, network %.4f), accuracy %.2f, %s\n",
              path.c_str(), plan->total_cost, plan->compute_cost, plan->network_cost,
              plan->accuracy, plan->capacity_ok ? "within capacity" : "OVER CAPACITY");
  for (size_t op = 0; op < plan->workers.size(); ++op) {
    if (plan->variant[op] < 0) continue;  // a source
    std::printf("  %-24s %zu worker(s)\n", problem->operators[op].name.c_str(),
                plan->workers[op].size());
  }
  // The same call for every strategy, as a table.
  std::printf("\n%s",
              pp::ComparisonTable(pp::CompareStrategies(*problem, pp::AllStrategies())).c_str());
  return plan->capacity_ok ? 0 : 1;
}
