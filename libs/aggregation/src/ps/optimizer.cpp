#include "plexus/aggregation/optimizer.hpp"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace plexus::aggregation {

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kNesterov:
      return "nesterov";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

absl::StatusOr<OptimizerKind> ParseOptimizer(std::string_view name) {
  for (auto k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kNesterov,
                 OptimizerKind::kAdam}) {
    if (name == OptimizerName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer \"", std::string(name),
                                                 "\": expected sgd, momentum, nesterov or adam"));
}

int OptimizerStateSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

absl::Status ValidateOptimizer(const UpdateRule& c) {
  if (static_cast<int>(c.kind) > 3) return absl::InvalidArgumentError("optimizer: unknown kind");
  const struct {
    const char* name;
    float value;
    float lo, hi;  // closed range
  } fields[] = {{"learning_rate", c.learning_rate, 0.0f, INFINITY},
                {"momentum", c.momentum, 0.0f, 1.0f},
                {"weight_decay", c.weight_decay, 0.0f, INFINITY},
                {"rescale", c.rescale, -INFINITY, INFINITY},
                {"beta1", c.beta1, 0.0f, 0.999999f},
                {"beta2", c.beta2, 0.0f, 0.999999f},
                {"epsilon", c.epsilon, 0.0f, INFINITY}};
  for (const auto& f : fields) {
    if (!std::isfinite(f.value) || f.value < f.lo || f.value > f.hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", std::string(OptimizerName(c.kind)), ": ", f.name, " = ",
                       f.value, " is out of [", f.lo, ", ", f.hi, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus::aggregation
