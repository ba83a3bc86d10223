// Helpers shared by the restructure tests: typed byte buffers and running a program on them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "plexus/kernels/reduce.hpp"

#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure::testing {

template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> FromBytes(const std::vector<uint8_t>& b) {
  std::vector<T> out(b.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
  return out;
}

// Runs `p` on `inputs` (bytes, in declaration order) with the interpreter, or (`executor`) the
// CPU's fast executor (whose power of 2 is x * x); outputs start as `fill` bytes.
inline absl::Status RunProgram(const Program& p, const std::vector<std::vector<uint8_t>>& inputs,
                               std::vector<std::vector<uint8_t>>* outputs, uint8_t fill = 0xEE,
                               bool executor = false) {
  outputs->clear();
  for (const BufferDecl& b : p.buffers) {
    if (b.role == Role::kOutput) {
      outputs->emplace_back(static_cast<size_t>(b.count) * kernels::DataTypeSize(b.dtype), fill);
    }
  }
  std::vector<ConstBytes> in;
  for (const auto& v : inputs) in.emplace_back(v.data(), v.size());
  std::vector<MutableBytes> out;
  for (auto& v : *outputs) out.emplace_back(v.data(), v.size());
  if (!executor) return Interpret(p, in, out);
  absl::StatusOr<Executor> e = Executor::Compile(p);
  if (!e.ok()) return e.status();
  return e->Run(in, out);
}

// The first byte at which `got` differs from `want` (their sizes equal), or want.size().
inline size_t FirstDifference(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (i >= got.size() || want[i] != got[i]) return i;
  }
  return want.size();
}

// Random bytes for every input of `p`, as many as declared, in declaration order; f32 inputs
// uniform in [-300, 300) with some NaN, -0, rounding ties (2.5) and subnormals among them,
// f16/bf16 in [-100, 100), the others any byte.
inline std::vector<std::vector<uint8_t>> RandomInputs(const Program& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> in;
  for (const BufferDecl& b : p.buffers) {
    if (b.role != Role::kInput) continue;
    std::vector<uint8_t> bytes(static_cast<size_t>(b.count) * kernels::DataTypeSize(b.dtype));
    if (b.dtype == kernels::DataType::kF32) {
      std::uniform_real_distribution<float> d(-300.0f, 300.0f);
      for (size_t i = 0; i < bytes.size() / 4; ++i) {
        float v = d(rng);
        if (rng() % 97 == 0) v = std::numeric_limits<float>::quiet_NaN();
        if (rng() % 89 == 0) v = -0.0f;
        if (rng() % 83 == 0) v = 2.5f;
        if (rng() % 79 == 0) v = 1e-40f;
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      }
    } else if (b.dtype == kernels::DataType::kF16 || b.dtype == kernels::DataType::kBF16) {
      for (size_t i = 0; i < bytes.size() / 2; ++i) {
        const float v = std::uniform_real_distribution<float>(-100.0f, 100.0f)(rng);
        const uint16_t h =
            b.dtype == kernels::DataType::kF16 ? kernels::FloatToHalf(v) : kernels::FloatToBf16(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    } else {
      for (auto& x : bytes) x = static_cast<uint8_t>(rng());
    }
    in.push_back(std::move(bytes));
  }
  return in;
}

// The distance of two floats in units in the last place (0 for two NaNs).
inline int64_t Ulps(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  const int32_t x = std::bit_cast<int32_t>(a), y = std::bit_cast<int32_t>(b);
  const int64_t ox = x < 0 ? int64_t{INT32_MIN} - x : x, oy = y < 0 ? int64_t{INT32_MIN} - y : y;
  return ox > oy ? ox - oy : oy - ox;
}

}  // namespace plexus::restructure::testing
