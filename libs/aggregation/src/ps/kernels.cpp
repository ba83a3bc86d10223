#include "kernels.hpp"

#include <cmath>
#include <cstring>

#include "plexus/kernels/reduce.hpp"  // the shared kernels and f16/bf16 conversions

namespace plexus::aggregation::internal {
namespace {

float LoadAsF32(const uint8_t* src, DataType dtype, size_t i) {
  uint16_t h;
  switch (dtype) {
    case DataType::kBF16:
      std::memcpy(&h, src + 2 * i, 2);
      return plexus::kernels::Bf16ToFloat(h);
    case DataType::kF16:
      std::memcpy(&h, src + 2 * i, 2);
      return plexus::kernels::HalfToFloat(h);
    default: {
      float f;
      std::memcpy(&f, src + 4 * i, 4);
      return f;
    }
  }
}

void StoreFromF32(uint8_t* out, DataType dtype, size_t i, float f) {
  uint16_t h;
  switch (dtype) {
    case DataType::kBF16:
      h = plexus::kernels::FloatToBf16(f);
      std::memcpy(out + 2 * i, &h, 2);
      break;
    case DataType::kF16:
      h = plexus::kernels::FloatToHalf(f);
      std::memcpy(out + 2 * i, &h, 2);
      break;
    default:
      std::memcpy(out + 4 * i, &f, 4);
      break;
  }
}

// The scalar mirror of the AVX2 loops: same operations, same order (the file is compiled without
// floating-point contraction, so no FMA changes a rounding).
void OptimizerScalar(OptimizerKind kind, const StepScalars& s, float* w, const float* g, float* m,
                     float* v, uint8_t* out, DataType out_dtype, size_t begin, size_t n) {
  for (size_t i = begin; i < n; ++i) {
    const float t1 = s.rescale * g[i];
    const float t2 = s.weight_decay * w[i];
    const float gp = t1 + t2;
    float wi = w[i];
    switch (kind) {
      case OptimizerKind::kSgd:
        wi = wi - s.lr * gp;
        break;
      case OptimizerKind::kMomentum: {
        const float mi = s.momentum * m[i] + gp;
        m[i] = mi;
        wi = wi - s.lr * mi;
        break;
      }
      case OptimizerKind::kNesterov: {
        const float mi = s.momentum * m[i] + gp;
        m[i] = mi;
        const float u = gp + s.momentum * mi;
        wi = wi - s.lr * u;
        break;
      }
      case OptimizerKind::kAdam: {
        const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gp;
        const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (gp * gp);
        m[i] = mi;
        v[i] = vi;
        wi = wi - s.adam_lr * (mi / (std::sqrt(vi) + s.epsilon));
        break;
      }
    }
    w[i] = wi;
    if (out != nullptr) StoreFromF32(out, out_dtype, i, wi);
  }
}

}  // namespace

bool IsWireType(DataType dtype) {
  return dtype == DataType::kF32 || dtype == DataType::kBF16 || dtype == DataType::kF16;
}

bool KernelsUseAvx2() { return plexus::kernels::Avx2Active(); }

void Accumulate(float* dst, const void* src_v, DataType dtype, size_t n, bool first) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  if (dtype == DataType::kF32) {
    if (first) {
      std::memcpy(dst, src, n * sizeof(float));
    } else {
      plexus::kernels::ReduceInto(DataType::kF32, collectives::ReduceOp::kSum, dst, src, n, false);
    }
    return;
  }
  size_t i = 0;
  if (KernelsUseAvx2()) i = AccumulateHalfAvx2(dst, src, dtype, n, first);
  for (; i < n; ++i) {
    const float x = LoadAsF32(src, dtype, i);
    dst[i] = first ? x : dst[i] + x;
  }
}

void ConvertFromF32(void* out_v, DataType dtype, const float* in, size_t n) {
  auto* out = static_cast<uint8_t*>(out_v);
  if (dtype == DataType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreFromF32(out, dtype, i, in[i]);
}

void ConvertToF32(float* out, const void* in, DataType dtype, size_t n) {
  Accumulate(out, in, dtype, n, /*first=*/true);
}

StepScalars PrepareStep(const UpdateRule& c, uint64_t step) {
  StepScalars s;
  s.lr = c.learning_rate;
  s.momentum = c.momentum;
  s.weight_decay = c.weight_decay;
  s.rescale = c.rescale;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.one_minus_beta1 = 1.0f - c.beta1;
  s.one_minus_beta2 = 1.0f - c.beta2;
  s.epsilon = c.epsilon;
  const double t = static_cast<double>(step == 0 ? 1 : step);
  s.adam_lr = static_cast<float>(c.learning_rate * std::sqrt(1.0 - std::pow(c.beta2, t)) /
                                 (1.0 - std::pow(c.beta1, t)));
  return s;
}

void ApplyOptimizer(OptimizerKind kind, const StepScalars& s, float* w, const float* g, float* m,
                    float* v, void* out_v, DataType out_dtype, size_t n, bool non_temporal) {
  auto* out = static_cast<uint8_t*>(out_v);
  size_t i = 0;
  if (KernelsUseAvx2()) {
    i = ApplyOptimizerAvx2(kind, s, w, g, m, v, out, out_dtype, n, non_temporal);
  }
  OptimizerScalar(kind, s, w, g, m, v, out, out_dtype, i, n);
}

bool UseNonTemporal(StorePolicy policy, size_t bytes) {
  switch (policy) {
    case StorePolicy::kCached:
      return false;
    case StorePolicy::kNonTemporal:
      return true;
    case StorePolicy::kAuto:
      break;
  }
  return bytes >= kNonTemporalThresholdBytes;
}

void StreamAdd(float* c, const float* a, const float* b, size_t n, bool non_temporal) {
  size_t i = 0;
  if (KernelsUseAvx2()) i = StreamAddAvx2(c, a, b, n, non_temporal);
  for (; i < n; ++i) c[i] = a[i] + b[i];
}

void StreamUpdate(float* const* rmw, int arrays, const float* g, float* out, size_t n,
                  bool non_temporal) {
  size_t i = 0;
  if (KernelsUseAvx2()) i = StreamUpdateAvx2(rmw, arrays, g, out, n, non_temporal);
  for (; i < n; ++i) {
    for (int a = 0; a < arrays; ++a) rmw[a][i] += g[i];
    out[i] = rmw[0][i];
  }
}

}  // namespace plexus::aggregation::internal
