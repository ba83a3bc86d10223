// The optimizers a parameter server runs on each chunk once every worker's gradient is summed
// (PHub runs them on the core that aggregated the chunk). State and master weights are f32;
// gradients and the values sent back may be f32, bf16 or f16.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::aggregation {

// Per element, with g the sum of the workers' gradients and w the f32 master weight:
//   g' = rescale * g + weight_decay * w
//   kSgd:      w -= lr * g'
//   kMomentum: m = momentum * m + g';  w -= lr * m
//   kNesterov: m = momentum * m + g';  w -= lr * (g' + momentum * m)      (PHub's NAG step)
//   kAdam:     m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;
//              w -= lr_t * m / (sqrt(v) + epsilon),  lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)
enum class OptimizerKind : uint8_t { kSgd = 0, kMomentum = 1, kNesterov = 2, kAdam = 3 };
// "sgd", "momentum", "nesterov", "adam".
std::string_view OptimizerName(OptimizerKind kind);
absl::StatusOr<OptimizerKind> ParseOptimizer(std::string_view name);
// f32 state arrays per element: 0 (SGD), 1 (momentum, Nesterov), 2 (Adam).
int OptimizerStateSlots(OptimizerKind kind);

// The optimizer a server applies to each summed gradient, and its hyperparameters.
struct UpdateRule {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  // Applied to the summed gradient first; 1/workers turns the sum into the mean.
  float rescale = 1.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};
// InvalidArgument naming the field when a value is not finite or out of range.
absl::Status ValidateOptimizer(const UpdateRule& config);

// How the optimizer kernels store the values they write out (the weights to send back). Weights
// and optimizer state are read and written in the same loop and always go through the cache; the
// write-only output may stream past it (non-temporal), which saves the read for ownership of every
// line when the output is too large to be read again from the cache anyway. On the 2-core EPYC
// (32 MiB L3) it was tuned on, streaming the output won at 64 MiB arrays and streaming the
// weights and state too lost (docs/measurements/aggregation.md), so kAuto streams from the L3's
// size up;
// the service's 32 KB chunks, read again at once to be sent, always cache.
enum class StorePolicy : uint8_t {
  kAuto = 0,  // non-temporal from kNonTemporalThresholdBytes of output up, cached below
  kCached = 1,
  kNonTemporal = 2,  // where the output is aligned to the vector width; cached otherwise
};
inline constexpr size_t kNonTemporalThresholdBytes = size_t{32} << 20;

}  // namespace plexus::aggregation
