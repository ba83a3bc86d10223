#include "plexus/netmodel/rate_controller.hpp"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace plexus::netmodel {

absl::Status ValidateRateControllerOptions(const RateControllerOptions& o) {
  if (!(o.cut_factor > 0 && o.cut_factor < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate controller: cut_factor must be in (0, 1), got ", o.cut_factor));
  }
  if (!(o.min_factor > 0 && o.min_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate controller: min_factor must be in (0, 1], got ", o.min_factor));
  }
  if (o.congestion_recovery_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate controller: congestion_recovery_steps must be >= 1, got ",
                     o.congestion_recovery_steps));
  }
  if (!(o.additive_step > 0 && o.additive_step <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate controller: additive_step must be in (0, 1], got ", o.additive_step));
  }
  return absl::OkStatus();
}

absl::StatusOr<TwoSignalRateController> TwoSignalRateController::Create(
    const RateControllerOptions& options) {
  if (absl::Status s = ValidateRateControllerOptions(options); !s.ok()) return s;
  TwoSignalRateController c;
  c.options_ = options;
  return c;
}

void TwoSignalRateController::Cut(Cause cause) {
  target_ = factor_;
  factor_ = std::max(options_.min_factor, factor_ * options_.cut_factor);
  cause_ = cause;
  steps_left_ = options_.congestion_recovery_steps;
  step_ = cause == Cause::kCongestion ? (target_ - factor_) / options_.congestion_recovery_steps
                                      : options_.additive_step;
}

void TwoSignalRateController::Tick() {
  if (cause_ == Cause::kNone) return;
  if (cause_ == Cause::kCongestion) {
    // The last step lands on the target exactly (no rounding shortfall).
    factor_ = --steps_left_ <= 0 ? target_ : std::min(target_, factor_ + step_);
    if (factor_ >= target_) {
      // Back at the remembered rate; from there, probe upward additively toward full speed.
      cause_ = factor_ >= 1 ? Cause::kNone : Cause::kOverload;
      step_ = options_.additive_step;
    }
    return;
  }
  factor_ = std::min(1.0, factor_ + step_);
  if (factor_ >= 1) cause_ = Cause::kNone;
}

}  // namespace plexus::netmodel
