#include "plexus/multipath/monitor.hpp"

#include <algorithm>

namespace plexus::multipath {
namespace {
constexpr double kBandwidthGain = 0.125;  // EWMA weight of a new sample (TCP's srtt gain)
constexpr double kRttGain = 0.125;
}  // namespace

void PathMonitor::OnChunk(size_t bytes, absl::Time posted, absl::Time done) {
  const absl::Time start = has_last_ ? std::max(posted, last_done_) : posted;
  last_done_ = done;
  has_last_ = true;
  const double seconds = absl::ToDoubleSeconds(done - start);
  if (seconds <= 0 || bytes == 0) return;
  const double sample = static_cast<double>(bytes) / seconds;
  bandwidth_ = bandwidth_ == 0 ? sample : bandwidth_ + kBandwidthGain * (sample - bandwidth_);
}

void PathMonitor::OnRtt(absl::Duration rtt) {
  if (rtt <= absl::ZeroDuration()) rtt = absl::Nanoseconds(1);
  srtt_ = srtt_ == absl::ZeroDuration() ? rtt : srtt_ + kRttGain * (rtt - srtt_);
  if (min_rtt_ == absl::ZeroDuration() || rtt < min_rtt_) min_rtt_ = rtt;
}

bool PathMonitor::Inflated(double factor, absl::Duration slack, absl::Duration own_queue) const {
  if (srtt_ == absl::ZeroDuration() || min_rtt_ == absl::ZeroDuration()) return false;
  return srtt_ > factor * (min_rtt_ + own_queue) + slack;
}

}  // namespace plexus::multipath
