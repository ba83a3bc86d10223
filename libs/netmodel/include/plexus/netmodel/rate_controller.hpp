// A rate cut by two separate slow-down signals with different recovery, after Aurelia (seed 003,
// ch. 4.3.3): on a signal the sender remembers its current rate R_c as the target R_t and cuts
// R_c by a factor; after network congestion (EPN, RTT inflation) the rate returns to R_t in a
// fixed number of steps, after receiver overload it grows additively. The rate is a fraction of
// the sender's full rate, in [min_factor, 1]. Used by multipath's per-path control and by the
// CXL fabric simulator's senders (plexus/netmodel/cxl_sim.hpp).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::netmodel {

struct RateControllerOptions {
  double cut_factor = 0.5;            // R_c *= cut_factor on a signal (1 - alpha; alpha = 1/2)
  double min_factor = 0.125;          // floor of the rate
  int congestion_recovery_steps = 4;  // steps back to the remembered rate after congestion
  double additive_step = 0.125;       // per step after overload, and above a reached target
};

// cut_factor in (0, 1), min_factor in (0, 1], congestion_recovery_steps >= 1, additive_step in
// (0, 1]; the error names the field.
absl::Status ValidateRateControllerOptions(const RateControllerOptions& options);

class TwoSignalRateController {
 public:
  enum class Cause { kNone, kCongestion, kOverload };

  // The default options (always valid).
  TwoSignalRateController() = default;
  static absl::StatusOr<TwoSignalRateController> Create(const RateControllerOptions& options);

  // The network is congested: remember the rate, cut it; recover to it in a fixed number of
  // steps.
  void OnCongestion() { Cut(Cause::kCongestion); }
  // The receiver cannot keep up: remember the rate, cut it; recover additively.
  void OnOverload() { Cut(Cause::kOverload); }
  // One recovery step (the caller's period without a new signal). After congestion the rate
  // climbs by (target - cut rate) / steps until it is back at the target, then, below full
  // speed, probes upward additively; after overload it climbs by additive_step up to 1.
  void Tick();

  double factor() const { return factor_; }
  double target() const { return target_; }
  Cause cause() const { return cause_; }
  const RateControllerOptions& options() const { return options_; }

 private:
  void Cut(Cause cause);
  RateControllerOptions options_;
  double factor_ = 1;
  double target_ = 1;
  double step_ = 0;
  int steps_left_ = 0;
  Cause cause_ = Cause::kNone;
};

}  // namespace plexus::netmodel
