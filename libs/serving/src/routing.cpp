// Share-following routing of the relays (routing.hpp).
#include "plexus/serving/routing.hpp"

namespace plexus::serving {

SmoothRoundRobin::SmoothRoundRobin(std::vector<double> weights)
    : weights_(std::move(weights)), credit_(weights_.size(), 0) {
  for (double w : weights_) total_ += w;
}

size_t SmoothRoundRobin::Next() {
  size_t best = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    credit_[i] += weights_[i];
    if (credit_[i] > credit_[best]) best = i;
  }
  credit_[best] -= total_;
  return best;
}

size_t HashRoute(uint64_t key, const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  // The golden ratio's Fibonacci hash: consecutive keys land a golden-ratio step apart on [0, 1).
  const uint64_t hashed = key * 0x9E3779B97F4A7C15ull;
  const double point = static_cast<double>(hashed >> 11) * 0x1.0p-53 * total;
  double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    sum += weights[i];
    if (point < sum) return i;
  }
  return weights.empty() ? 0 : weights.size() - 1;
}

}  // namespace plexus::serving
