// The single-process reference: the same per-token math as the distributed step, every expert
// local, no communication.
#include <vector>

#include "runtime/model.hpp"

namespace plexus::moe {

absl::StatusOr<std::vector<float>> TrainReference(const ModelSpec& c, int64_t steps,
                                                  std::vector<double>* losses) {
  using namespace runtime;  // NOLINT: the model's helpers
  if (c.top_k != 1 && c.top_k != 2) {
    return absl::InvalidArgumentError("model config: top_k must be 1 or 2");
  }
  const Layout L(c);
  std::vector<float> state = InitialState(L);
  const int H = c.hidden, K = c.top_k;
  const int64_t T = c.tokens_per_step;
  std::vector<float> x(T * H), y(T * H);
  for (int64_t step = 0; step < steps; ++step) {
    MakeBatch(c, step, 0, T, x.data(), y.data());
    std::vector<int64_t> grad(L.GradSize(), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::vector<float>> h(c.layers + 1, std::vector<float>(H));
      std::vector<Route> routes(c.layers);
      std::vector<std::vector<float>> f(c.layers, std::vector<float>(K * H));
      std::copy(&x[t * H], &x[t * H] + H, h[0].begin());
      for (int l = 0; l < c.layers; ++l) {
        routes[l] = RouteToken(c, state.data() + L.GateOffset(l), h[l].data());
        for (int k = 0; k < K; ++k) {
          ExpertForward(c, state.data() + L.ExpertOffset(l, routes[l].expert[k]), h[l].data(),
                        &f[l][k * H]);
        }
        const float* fk[2] = {&f[l][0], &f[l][(K - 1) * H]};
        Combine(c, h[l].data(), routes[l], fk, h[l + 1].data());
      }
      std::vector<float> g(H), go(K * H), dhk(K * H), dh(H);
      LossBackward(c, h[c.layers].data(), &y[t * H], &grad.back(), g.data());
      for (int l = c.layers - 1; l >= 0; --l) {
        for (int k = 0; k < K; ++k) {
          const int e = routes[l].expert[k];
          for (int d = 0; d < H; ++d) go[k * H + d] = routes[l].prob[k] * g[d];
          ExpertBackward(c, state.data() + L.ExpertOffset(l, e), h[l].data(), &go[k * H],
                         &grad[L.GradExpertOffset(l, e)], &dhk[k * H]);
        }
        for (int d = 0; d < H; ++d) {
          float v = g[d];
          for (int k = 0; k < K; ++k) v += dhk[k * H + d];
          dh[d] = v;
        }
        const float* fk[2] = {&f[l][0], &f[l][(K - 1) * H]};
        GateBackward(c, state.data() + L.GateOffset(l), h[l].data(), routes[l], fk, g.data(),
                     &grad[L.GateOffset(l)], dh.data());
        g = dh;
      }
    }
    ApplyUpdate(c, state.data(), state.data() + L.gate_size, grad.data(), L.gate_size, T);
    for (int l = 0; l < c.layers; ++l) {
      for (int e = 0; e < c.experts; ++e) {
        float* w = state.data() + L.ExpertOffset(l, e);
        ApplyUpdate(c, w, w + L.expert_params, grad.data() + L.GradExpertOffset(l, e),
                    L.expert_params, T);
      }
    }
    if (losses != nullptr) losses->push_back(LossFromFixed(c, grad.back()));
  }
  return state;
}

}  // namespace plexus::moe
