// Summary statistics the benchmarks share.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace plexus::bench {

// The median of `v`: the middle value, the mean of the two middle ones for an even count, NaN
// for none (a figure with no sample is written as null, not as 0).
inline double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace plexus::bench
