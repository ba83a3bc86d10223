// The aggregation and optimizer kernels against straightforward reference loops: exact (bit for
// bit) for every optimizer, wire type, store policy and kernel (AVX2 and scalar), plus Adam
// against a double-precision reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "plexus/aggregation/optimizer.hpp"
#include "plexus/kernels/reduce.hpp"
#include "ps/kernels.hpp"

namespace pa = plexus::aggregation;
namespace pai = plexus::aggregation::internal;
using pa::OptimizerKind;
using plexus::collectives::DataType;

namespace {

// 64-byte aligned floats (for the non-temporal path), offset by `skew` floats to test unaligned.
struct Buf {
  explicit Buf(size_t n, size_t skew = 0) : skew(skew) {
    p = static_cast<float*>(std::aligned_alloc(64, ((n + skew) * 4 + 63) / 64 * 64));
  }
  ~Buf() { std::free(p); }
  float* data() { return p + skew; }
  float* p;
  size_t skew;
};

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float RefLoad(const std::vector<uint8_t>& src, DataType dtype, size_t i) {
  uint16_t h;
  if (dtype == DataType::kF32) {
    float f;
    std::memcpy(&f, src.data() + 4 * i, 4);
    return f;
  }
  std::memcpy(&h, src.data() + 2 * i, 2);
  return dtype == DataType::kBF16 ? plexus::kernels::Bf16ToFloat(h)
                                  : plexus::kernels::HalfToFloat(h);
}

// The formulas of optimizer.hpp, one element at a time.
void RefStep(OptimizerKind kind, const pa::UpdateRule& c, float adam_lr, float& w, float g,
             float& m, float& v) {
  const float gp = c.rescale * g + c.weight_decay * w;
  switch (kind) {
    case OptimizerKind::kSgd:
      w = w - c.learning_rate * gp;
      break;
    case OptimizerKind::kMomentum:
      m = c.momentum * m + gp;
      w = w - c.learning_rate * m;
      break;
    case OptimizerKind::kNesterov:
      m = c.momentum * m + gp;
      w = w - c.learning_rate * (gp + c.momentum * m);
      break;
    case OptimizerKind::kAdam:
      m = c.beta1 * m + (1.0f - c.beta1) * gp;
      v = c.beta2 * v + (1.0f - c.beta2) * (gp * gp);
      w = w - adam_lr * (m / (std::sqrt(v) + c.epsilon));
      break;
  }
}

std::vector<uint8_t> RandomWire(DataType dtype, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<uint8_t> out(n * (dtype == DataType::kF32 ? 4 : 2));
  std::vector<float> f(n);
  for (auto& x : f) x = d(rng);
  pai::ConvertFromF32(out.data(), dtype, f.data(), n);
  return out;
}

class Avx2Switch {
 public:
  explicit Avx2Switch(bool allowed) : previous_(plexus::kernels::SetAvx2Allowed(allowed)) {}
  ~Avx2Switch() { plexus::kernels::SetAvx2Allowed(previous_); }

 private:
  bool previous_;
};

}  // namespace

TEST_CASE("Accumulate sums f32, bf16 and f16 gradients into f32 exactly",
          "[aggregation][kernels]") {
  std::mt19937 rng(11);
  const size_t n = 1003;  // vector body and scalar tail
  for (bool avx2 : {true, false}) {
    Avx2Switch sw(avx2);
    for (DataType dtype : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      const auto a = RandomWire(dtype, n, rng);
      const auto b = RandomWire(dtype, n, rng);
      std::vector<float> acc(n, -1.0f);
      pai::Accumulate(acc.data(), a.data(), dtype, n, /*first=*/true);
      pai::Accumulate(acc.data(), b.data(), dtype, n, /*first=*/false);
      for (size_t i = 0; i < n; ++i) {
        const float want = RefLoad(a, dtype, i) + RefLoad(b, dtype, i);
        INFO("avx2 " << avx2 << " dtype " << static_cast<int>(dtype) << " i " << i);
        REQUIRE(Bits(acc[i]) == Bits(want));
      }
    }
  }
}

TEST_CASE("Every optimizer matches the reference bit for bit, on every path",
          "[aggregation][kernels]") {
  std::mt19937 rng(5);
  const size_t n = 1003;
  pa::UpdateRule c;
  c.learning_rate = 0.05f;
  c.momentum = 0.9f;
  c.weight_decay = 1e-4f;
  c.rescale = 0.25f;
  for (auto kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kNesterov,
                    OptimizerKind::kAdam}) {
    c.kind = kind;
    REQUIRE(pa::ValidateOptimizer(c).ok());
    for (DataType out_dtype : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (bool avx2 : {true, false}) {
        for (bool nt : {false, true}) {
          for (size_t skew : {size_t{0}, size_t{1}}) {
            Avx2Switch sw(avx2);
            std::normal_distribution<float> d(0.0f, 1.0f);
            Buf w(n, skew), g(n, skew), m(n, skew), v(n, skew);
            std::vector<float> rw(n), rm(n), rv(n);
            for (size_t i = 0; i < n; ++i) {
              rw[i] = w.data()[i] = d(rng);
              g.data()[i] = d(rng);
              rm[i] = m.data()[i] = d(rng) * 0.1f;
              rv[i] = v.data()[i] = std::fabs(d(rng)) * 0.01f;
            }
            std::vector<uint8_t> out(n * 4 + 64);
            uint8_t* o = out.data() + (64 - reinterpret_cast<uintptr_t>(out.data()) % 64) % 64;
            for (uint64_t step = 1; step <= 3; ++step) {
              const auto s = pai::PrepareStep(c, step);
              pai::ApplyOptimizer(kind, s, w.data(), g.data(), m.data(), v.data(), o, out_dtype, n,
                                  nt);
              for (size_t i = 0; i < n; ++i)
                RefStep(kind, c, s.adam_lr, rw[i], g.data()[i], rm[i], rv[i]);
            }
            std::vector<uint8_t> ref_out(n * 4);
            pai::ConvertFromF32(ref_out.data(), out_dtype, rw.data(), n);
            INFO(pa::OptimizerName(kind) << " out " << static_cast<int>(out_dtype) << " avx2 "
                                         << avx2 << " nt " << nt << " skew " << skew);
            for (size_t i = 0; i < n; ++i) {
              REQUIRE(Bits(w.data()[i]) == Bits(rw[i]));
              if (pa::OptimizerStateSlots(kind) >= 1) REQUIRE(Bits(m.data()[i]) == Bits(rm[i]));
              if (pa::OptimizerStateSlots(kind) >= 2) REQUIRE(Bits(v.data()[i]) == Bits(rv[i]));
            }
            const size_t out_bytes = n * (out_dtype == DataType::kF32 ? 4 : 2);
            REQUIRE(std::memcmp(o, ref_out.data(), out_bytes) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("Adam stays within a few ulp of a double-precision reference", "[aggregation][kernels]") {
  pa::UpdateRule c;
  c.kind = OptimizerKind::kAdam;
  c.learning_rate = 1e-3f;
  const size_t n = 257;
  std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> dw(n), dm(n, 0.0), dv(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    dw[i] = w[i] = 0.01f * static_cast<float>(i) - 1.0f;
    g[i] = std::sin(static_cast<float>(i));
  }
  for (uint64_t t = 1; t <= 10; ++t) {
    pai::ApplyOptimizer(c.kind, pai::PrepareStep(c, t), w.data(), g.data(), m.data(), v.data(),
                        nullptr, DataType::kF32, n, false);
    for (size_t i = 0; i < n; ++i) {
      const double gp = g[i];
      dm[i] = 0.9 * dm[i] + 0.1 * gp;
      dv[i] = 0.999 * dv[i] + 0.001 * gp * gp;
      const double mh = dm[i] / (1 - std::pow(0.9, t)), vh = dv[i] / (1 - std::pow(0.999, t));
      dw[i] -= 1e-3 * mh / (std::sqrt(vh) + 1e-8 * std::sqrt(1 - std::pow(0.999, t)));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    INFO("i " << i);
    REQUIRE(std::fabs(w[i] - dw[i]) <= 1e-5 * std::max(1.0, std::fabs(dw[i])));
  }
}

TEST_CASE("Store policy: non-temporal from the threshold up, unless forced",
          "[aggregation][kernels]") {
  CHECK_FALSE(pai::UseNonTemporal(pa::StorePolicy::kAuto, pa::kNonTemporalThresholdBytes - 1));
  CHECK(pai::UseNonTemporal(pa::StorePolicy::kAuto, pa::kNonTemporalThresholdBytes));
  CHECK_FALSE(pai::UseNonTemporal(pa::StorePolicy::kCached, size_t{1} << 40));
  CHECK(pai::UseNonTemporal(pa::StorePolicy::kNonTemporal, 64));
}

TEST_CASE("Optimizer configs are validated field by field", "[aggregation][kernels]") {
  pa::UpdateRule c;
  c.momentum = 1.5f;
  auto st = pa::ValidateOptimizer(c);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()).find("momentum") != std::string::npos);
  c = {};
  c.learning_rate = NAN;
  CHECK(std::string(pa::ValidateOptimizer(c).message()).find("learning_rate") != std::string::npos);
  CHECK(pa::ParseOptimizer("nesterov").value() == OptimizerKind::kNesterov);
  CHECK_FALSE(pa::ParseOptimizer("lamb").ok());
}
