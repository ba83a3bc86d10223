// The CUDA dispatcher must produce exactly the CPU plan; skipped where no GPU is usable.
#include <catch2/catch.hpp>
#include <random>

#include "plexus/moe/dispatch.hpp"
#include "support/skip.hpp"

namespace plexus::moe {
namespace {

TEST_CASE("CUDA dispatcher matches the CPU dispatcher", "[moe][dispatch][cuda]") {
  std::string why;
  if (!CudaDispatchAvailable(&why)) {
    // Without a GPU the host API must say why instead of failing obscurely.
    DispatchInput in{1, 2, {1, 1}, {1, 1}};
    absl::StatusOr<std::vector<int64_t>> dense = ComputeDispatchDenseCuda(in);
    REQUIRE(dense.status().code() == absl::StatusCode::kUnavailable);
    REQUIRE_FALSE(why.empty());
    plexus::testing::SkipTest("CUDA dispatcher not testable here: " + why);
  }
  std::mt19937 rng(3);
  for (int it = 0; it < 50; ++it) {
    DispatchInput in;
    in.num_experts = 1 + rng() % 64;
    in.num_ranks = 1 + rng() % 64;
    const size_t cells = static_cast<size_t>(in.num_experts) * in.num_ranks;
    in.tokens.resize(cells);
    in.replicas.resize(cells);
    for (int e = 0; e < in.num_experts; ++e) {
      for (int j = 0; j < in.num_ranks; ++j) {
        in.tokens[e * in.num_ranks + j] = rng() % 5000;
        in.replicas[e * in.num_ranks + j] = rng() % 4 == 0 ? 1 + rng() % 3 : 0;
      }
      in.replicas[e * in.num_ranks + rng() % in.num_ranks] += 1;
    }
    absl::StatusOr<DispatchPlan> cpu = ComputeDispatch(in);
    REQUIRE(cpu.ok());
    absl::StatusOr<std::vector<int64_t>> gpu = ComputeDispatchDenseCuda(in);
    REQUIRE(gpu.ok());
    CHECK(*gpu == DenseFlows(*cpu));
  }
}

}  // namespace
}  // namespace plexus::moe
