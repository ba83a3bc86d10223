// Per-path measurements (bandwidth and RTT from completions and probes). The per-path rate
// controller driven by Aurelia's two separate slow-down signals is netmodel's
// (plexus/netmodel/rate_controller.hpp).
#pragma once

#include <cstddef>

#include "absl/time/time.h"

namespace plexus::multipath {

// EWMA estimates of one path from its completions. Not thread-safe (the channel serialises).
class PathMonitor {
 public:
  // A chunk of `bytes` posted at `posted` completed at `done`. The path's service time for it is
  // measured from the later of `posted` and the previous completion, so that pipelined chunks
  // yield the path's throughput, not their queueing delay.
  void OnChunk(size_t bytes, absl::Time posted, absl::Time done);
  // A round trip measured by a probe or a small message.
  void OnRtt(absl::Duration rtt);
  // Forget the previous completion (the path went idle), so an idle gap is not service time.
  void OnIdle() { has_last_ = false; }

  double bandwidth() const { return bandwidth_; }  // bytes/s; 0 until measured
  absl::Duration srtt() const { return srtt_; }
  absl::Duration min_rtt() const { return min_rtt_; }
  // RTT inflation that the path's own queue does not explain: srtt above
  // `factor` x (min_rtt + `own_queue`) + `slack`, where `own_queue` is the time the sender's own
  // bytes in flight take at the measured bandwidth (a saturated bottleneck queues them; that is
  // the price of using the path fully, not congestion).
  bool Inflated(double factor, absl::Duration slack,
                absl::Duration own_queue = absl::ZeroDuration()) const;

 private:
  double bandwidth_ = 0;
  absl::Duration srtt_ = absl::ZeroDuration();
  absl::Duration min_rtt_ = absl::ZeroDuration();
  absl::Time last_done_;
  bool has_last_ = false;
};

}  // namespace plexus::multipath
