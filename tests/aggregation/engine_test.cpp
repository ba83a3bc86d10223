// The tall and wide engines compute the same thing: bit-identical weights and values after each
// round, equal to one Accumulate + ApplyOptimizer pass over the whole model; and that pass is
// checked against momentum SGD written out here in double precision (the optimizer.hpp formula),
// so that the kernels are not their own oracle.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "ps/engine.hpp"
#include "ps/kernels.hpp"

namespace pa = plexus::aggregation;
namespace pai = plexus::aggregation::internal;
using plexus::collectives::DataType;

TEST_CASE("Tall and wide engines agree bit for bit with the reference", "[aggregation][engine]") {
  const std::vector<size_t> keys = {3000, 17, 9000, 1, 4096};
  size_t total = 0;
  for (size_t k : keys) total += k;
  const int workers = 3;
  std::vector<std::vector<float>> g(workers, std::vector<float>(total));
  std::vector<const float*> ptrs;
  for (int w = 0; w < workers; ++w) {
    for (size_t i = 0; i < total; ++i) g[w][i] = static_cast<float>((i * (w + 3)) % 11) * 0.01f;
    ptrs.push_back(g[w].data());
  }
  pa::UpdateRule opt;
  opt.kind = pa::OptimizerKind::kMomentum;
  std::vector<float> ref_w(total, 0.0f), ref_m(total, 0.0f), sum(total);
  std::vector<double> exact_w(total), exact_m(total);
  for (int cores : {1, 2, 3}) {
    pai::EngineOptions eo;
    eo.cores = cores;
    eo.workers = workers;
    eo.chunk_bytes = 4096;
    eo.optimizer = opt;
    eo.kind = pai::EngineKind::kTall;
    auto tall = pai::Engine::Create(eo, keys).value();
    eo.kind = pai::EngineKind::kWide;
    auto wide = pai::Engine::Create(eo, keys).value();
    std::fill(ref_w.begin(), ref_w.end(), 0.0f);
    std::fill(ref_m.begin(), ref_m.end(), 0.0f);
    std::fill(exact_w.begin(), exact_w.end(), 0.0);
    std::fill(exact_m.begin(), exact_m.end(), 0.0);
    for (uint64_t round = 1; round <= 2; ++round) {
      tall->RunRound(ptrs);
      wide->RunRound(ptrs);
      for (int w = 0; w < workers; ++w) {
        pai::Accumulate(sum.data(), g[w].data(), DataType::kF32, total, w == 0);
      }
      pai::ApplyOptimizer(opt.kind, pai::PrepareStep(opt, round), ref_w.data(), sum.data(),
                          ref_m.data(), nullptr, nullptr, DataType::kF32, total, false);
      INFO("cores " << cores << " round " << round);
      // m = momentum * m + (rescale * g + weight_decay * w); w -= lr * m.
      size_t far = 0;
      for (size_t i = 0; i < total; ++i) {
        double g_sum = 0;
        for (int w = 0; w < workers; ++w) g_sum += g[w][i];
        const double step = opt.rescale * g_sum + opt.weight_decay * exact_w[i];
        exact_m[i] = opt.momentum * exact_m[i] + step;
        exact_w[i] -= opt.learning_rate * exact_m[i];
        if (std::abs(ref_w[i] - exact_w[i]) > 1e-5 * (1 + std::abs(exact_w[i]))) ++far;
      }
      CHECK(far == 0);
      REQUIRE(std::memcmp(tall->weights(), ref_w.data(), total * 4) == 0);
      REQUIRE(std::memcmp(wide->weights(), ref_w.data(), total * 4) == 0);
      REQUIRE(std::memcmp(tall->values(), ref_w.data(), total * 4) == 0);
      REQUIRE(std::memcmp(wide->values(), ref_w.data(), total * 4) == 0);
    }
  }
}
