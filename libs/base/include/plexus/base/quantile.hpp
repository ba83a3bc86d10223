// Quantiles of samples, as the benchmarks and tools report them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace plexus::base {

enum class QuantileRule {
  kNearestRank,   // the sample at floor(q * n) (clamped): always an observed value
  kInterpolated,  // linear between the samples at floor and ceil of q * (n - 1)
};

// The q-quantile (0 <= q <= 1) of `samples`; 0 when there are none.
inline double Quantile(std::vector<double> samples, double q,
                       QuantileRule rule = QuantileRule::kNearestRank) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  if (rule == QuantileRule::kNearestRank) {
    return samples[std::min(n - 1, static_cast<size_t>(q * static_cast<double>(n)))];
  }
  const double at = q * static_cast<double>(n - 1);
  const size_t low = static_cast<size_t>(at);
  const size_t high = std::min(low + 1, n - 1);
  return samples[low] + (samples[high] - samples[low]) * (at - static_cast<double>(low));
}

}  // namespace plexus::base
