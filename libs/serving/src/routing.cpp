// Share-following routing of the relays (routing.hpp).
#include "plexus/serving/routing.hpp"

#include <algorithm>

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

RouteById::RouteById(const std::vector<double>& weights, size_t period) {
  if (weights.empty()) {
    picks_ = {0};
    return;
  }
  SmoothRoundRobin rr(weights);
  picks_.resize(std::max<size_t>(period, 1));
  for (uint32_t& pick : picks_) pick = static_cast<uint32_t>(rr.Next());
}

}  // namespace plexus::serving
