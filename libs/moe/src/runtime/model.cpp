#include "runtime/model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace plexus::moe::runtime {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from a key; the same on every machine.
float Uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t r = Mix(Mix(Mix(Mix(a) ^ b) ^ c) ^ d);
  return static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

int64_t Quantize(double v) {
  constexpr double kLimit = 0x1.0p52;
  double q = std::nearbyint(v * 0x1.0p30);
  if (!(q > -kLimit)) q = -kLimit;  // also NaN: a diverged run stays finite and deterministic
  if (q > kLimit) q = kLimit;
  return static_cast<int64_t>(q);
}

void Softmax(const ModelSpec& c, const float* gate, const float* h, float* p) {
  float max = -std::numeric_limits<float>::infinity();
  for (int e = 0; e < c.experts; ++e) {
    float z = -static_cast<float>(c.skew * std::log(e + 1.0));
    for (int d = 0; d < c.hidden; ++d) z += gate[e * c.hidden + d] * h[d];
    p[e] = z;
    max = std::max(max, z);
  }
  float sum = 0;
  for (int e = 0; e < c.experts; ++e) {
    p[e] = std::exp(p[e] - max);
    sum += p[e];
  }
  for (int e = 0; e < c.experts; ++e) p[e] /= sum;
}

}  // namespace

static_assert(kFixedPointBits == 30, "Quantize scales by 2^30");

Layout::Layout(const ModelSpec& c) : config(c) {
  gate_size = int64_t{c.layers} * c.experts * c.hidden;
  expert_params = ExpertParameterCount(c);
  total = 2 * gate_size + int64_t{c.layers} * c.experts * 2 * expert_params;
}

std::vector<float> InitialState(const Layout& layout) {
  const ModelSpec& c = layout.config;
  std::vector<float> s(layout.total, 0.0f);
  for (int64_t i = 0; i < layout.gate_size; ++i) s[i] = 0.1f * Uniform(c.seed, 1, i, 0);
  const float s1 = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(c.ffn));
  for (int l = 0; l < c.layers; ++l) {
    for (int e = 0; e < c.experts; ++e) {
      float* w = s.data() + layout.ExpertOffset(l, e);
      const uint64_t key = uint64_t(l) * 1000 + e;
      const int64_t w1 = int64_t{c.ffn} * c.hidden;
      for (int64_t i = 0; i < w1; ++i) w[i] = s1 * Uniform(c.seed, 2, key, i);
      float* w2 = w + w1 + c.ffn;
      for (int64_t i = 0; i < w1; ++i) w2[i] = 0.5f * s2 * Uniform(c.seed, 3, key, i);
    }
  }
  return s;
}

void MakeBatch(const ModelSpec& c, int64_t step, int64_t begin, int64_t end, float* x, float* y) {
  const int H = c.hidden;
  for (int64_t t = begin; t < end; ++t) {
    float* xt = x + (t - begin) * H;
    for (int d = 0; d < H; ++d) xt[d] = Uniform(c.seed ^ 0x5eed, step, t, d);
    for (int i = 0; i < H; ++i) {
      float z = 0;
      for (int d = 0; d < H; ++d) z += Uniform(c.seed, 4, i, d) * xt[d];
      y[(t - begin) * H + i] = std::tanh(1.5f * z);
    }
  }
}

Route RouteToken(const ModelSpec& c, const float* gate, const float* h) {
  std::vector<float> p(c.experts);
  Softmax(c, gate, h, p.data());
  Route r;
  for (int k = 0; k < c.top_k; ++k) {
    int best = -1;
    for (int e = 0; e < c.experts; ++e) {
      if (k == 1 && e == r.expert[0]) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    r.expert[k] = best;
    r.prob[k] = p[best];
  }
  return r;
}

void ExpertForward(const ModelSpec& c, const float* w, const float* h, float* f) {
  const int H = c.hidden, F = c.ffn;
  const float* b1 = w + F * H;
  const float* w2 = b1 + F;
  const float* b2 = w2 + H * F;
  std::vector<float> a(F);
  for (int j = 0; j < F; ++j) {
    float z = b1[j];
    for (int d = 0; d < H; ++d) z += w[j * H + d] * h[d];
    a[j] = z > 0 ? z : 0;
  }
  for (int i = 0; i < H; ++i) {
    float o = b2[i];
    for (int j = 0; j < F; ++j) o += w2[i * F + j] * a[j];
    f[i] = o;
  }
}

void ExpertBackward(const ModelSpec& c, const float* w, const float* h, const float* go,
                    int64_t* grad, float* dh) {
  const int H = c.hidden, F = c.ffn;
  const float* b1 = w + F * H;
  const float* w2 = b1 + F;
  std::vector<float> a(F), dz(F);
  for (int j = 0; j < F; ++j) {
    float z = b1[j];
    for (int d = 0; d < H; ++d) z += w[j * H + d] * h[d];
    a[j] = z > 0 ? z : 0;
    float da = 0;
    for (int i = 0; i < H; ++i) da += w2[i * F + j] * go[i];
    dz[j] = z > 0 ? da : 0;
  }
  int64_t* gw1 = grad;
  int64_t* gb1 = gw1 + F * H;
  int64_t* gw2 = gb1 + F;
  int64_t* gb2 = gw2 + H * F;
  for (int j = 0; j < F; ++j) {
    if (dz[j] != 0) {
      for (int d = 0; d < H; ++d) gw1[j * H + d] += Quantize(double(dz[j]) * h[d]);
    }
    gb1[j] += Quantize(dz[j]);
  }
  for (int i = 0; i < H; ++i) {
    for (int j = 0; j < F; ++j) {
      if (a[j] != 0) gw2[i * F + j] += Quantize(double(go[i]) * a[j]);
    }
    gb2[i] += Quantize(go[i]);
  }
  for (int d = 0; d < H; ++d) {
    float s = 0;
    for (int j = 0; j < F; ++j) s += w[j * H + d] * dz[j];
    dh[d] = s;
  }
}

void Combine(const ModelSpec& c, const float* h, const Route& r, const float* const* f,
             float* h_next) {
  for (int d = 0; d < c.hidden; ++d) {
    float v = h[d];
    for (int k = 0; k < c.top_k; ++k) v += r.prob[k] * f[k][d];
    h_next[d] = v;
  }
}

void GateBackward(const ModelSpec& c, const float* gate, const float* h, const Route& r,
                  const float* const* f, const float* g, int64_t* grad, float* dh) {
  std::vector<float> p(c.experts), dlogit(c.experts, 0.0f);
  Softmax(c, gate, h, p.data());
  for (int k = 0; k < c.top_k; ++k) {
    float dp = 0;
    for (int d = 0; d < c.hidden; ++d) dp += g[d] * f[k][d];
    const float pk = p[r.expert[k]];
    for (int e = 0; e < c.experts; ++e) {
      dlogit[e] += dp * pk * ((e == r.expert[k] ? 1.0f : 0.0f) - p[e]);
    }
  }
  for (int e = 0; e < c.experts; ++e) {
    for (int d = 0; d < c.hidden; ++d) {
      grad[e * c.hidden + d] += Quantize(double(dlogit[e]) * h[d]);
      dh[d] += gate[e * c.hidden + d] * dlogit[e];
    }
  }
}

void LossBackward(const ModelSpec& c, const float* h, const float* y, int64_t* loss, float* g) {
  double l = 0;
  for (int d = 0; d < c.hidden; ++d) {
    const float diff = h[d] - y[d];
    l += double(diff) * diff;
    g[d] = 2.0f * diff / static_cast<float>(c.hidden);
  }
  *loss += Quantize(l / c.hidden);
}

void ApplyUpdate(const ModelSpec& c, float* w, float* m, const int64_t* grad, int64_t n,
                 int64_t tokens) {
  const double scale = 0x1.0p-30 / static_cast<double>(tokens);
  for (int64_t i = 0; i < n; ++i) {
    const float g = static_cast<float>(static_cast<double>(grad[i]) * scale);
    m[i] = c.momentum * m[i] + g;
    w[i] -= c.learning_rate * m[i];
  }
}

double LossFromFixed(const ModelSpec& c, int64_t loss_sum) {
  return static_cast<double>(loss_sum) * 0x1.0p-30 / c.tokens_per_step;
}

}  // namespace plexus::moe::runtime

namespace plexus::moe {

int64_t ExpertParameterCount(const ModelSpec& c) {
  return 2 * int64_t{c.ffn} * c.hidden + c.ffn + c.hidden;
}

const char* RecoveryModeName(RecoveryMode mode) {
  return mode == RecoveryMode::kElastic ? "elastic" : "checkpoint-restart";
}

}  // namespace plexus::moe
