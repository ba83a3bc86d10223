// The small MoE model of the runtime: per-token math shared by the distributed trainer and the
// single-process reference, so that a token's result never depends on where it was computed.
//
// Layer l maps a token h to h + sum_k p_k * f_{e_k}(h), where e_k are the top-k experts of the
// gate softmax(Wg_l h + b) (b: a fixed bias that skews routing towards low expert ids) and
// f_e(h) = W2 relu(W1 h + b1) + b2. The task: regress y = tanh(M x) from x, both drawn from
// (seed, step, token); loss = mean over tokens of |h_L - y|^2 / hidden.
//
// State layout (also GatherState's and the checkpoint's): gate weights [L][E][H], gate momentum
// [L][E][H], then per (layer, expert): weights (W1 [F][H], b1 [F], W2 [H][F], b2 [H]) followed by
// their momentum.
#pragma once

#include <cstdint>
#include <vector>

#include "plexus/moe/runtime.hpp"

namespace plexus::moe::runtime {

// Gradients are summed as int64 multiples of 2^-kFixedPointBits: exact, hence in any order.
inline constexpr int kFixedPointBits = 30;

struct Layout {
  explicit Layout(const ModelSpec& c);
  ModelSpec config;
  int64_t gate_size = 0;      // L*E*H (weights; momentum follows)
  int64_t expert_params = 0;  // P
  int64_t total = 0;          // 2*gate_size + L*E*2P
  int64_t ExpertOffset(int layer, int expert) const {
    return 2 * gate_size + (int64_t{layer} * config.experts + expert) * 2 * expert_params;
  }
  int64_t GateOffset(int layer) const { return int64_t{layer} * config.experts * config.hidden; }
  // Gradient buffer: gate [L*E*H], experts [L*E*P], loss [1].
  int64_t GradSize() const {
    return gate_size + int64_t{config.layers} * config.experts * expert_params + 1;
  }
  int64_t GradExpertOffset(int layer, int expert) const {
    return gate_size + (int64_t{layer} * config.experts + expert) * expert_params;
  }
};

std::vector<float> InitialState(const Layout& layout);
// Inputs and targets of global tokens [begin, end) of `step` (hidden floats each).
void MakeBatch(const ModelSpec& c, int64_t step, int64_t begin, int64_t end, float* x, float* y);

struct Route {
  int expert[2] = {0, 0};
  float prob[2] = {0, 0};
};
// gate: this layer's [E][H] weights.
Route RouteToken(const ModelSpec& c, const float* gate, const float* h);
// f = f_e(h) for the expert whose weights start at w.
void ExpertForward(const ModelSpec& c, const float* w, const float* h, float* f);
// For go = dL/df: accumulates the quantized weight gradients into grad[P] and writes dh = dL/dh.
void ExpertBackward(const ModelSpec& c, const float* w, const float* h, const float* go,
                    int64_t* grad, float* dh);
// h_next = h + sum_k p_k f_k, in k order.
void Combine(const ModelSpec& c, const float* h, const Route& r, const float* const* f,
             float* h_next);
// Gate part of the backward pass: given g = dL/dh_next and the expert outputs f_k, accumulates
// the quantized gate gradients into grad[E][H] and adds Wg^T dlogits to dh.
void GateBackward(const ModelSpec& c, const float* gate, const float* h, const Route& r,
                  const float* const* f, const float* g, int64_t* grad, float* dh);
// Loss of one token (|h - y|^2 / H, quantized into *loss) and dL/dh for it.
void LossBackward(const ModelSpec& c, const float* h, const float* y, int64_t* loss, float* g);

// SGD with momentum on n floats from the summed quantized gradients of `tokens` tokens.
void ApplyUpdate(const ModelSpec& c, float* w, float* m, const int64_t* grad, int64_t n,
                 int64_t tokens);
double LossFromFixed(const ModelSpec& c, int64_t loss_sum);

}  // namespace plexus::moe::runtime
