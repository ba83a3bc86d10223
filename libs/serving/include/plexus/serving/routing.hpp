// How a relay picks the worker of the next operator: by the plan's shares, deterministically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace plexus::serving {

// Smooth weighted round robin (nginx's): every pick adds each weight to its running credit and
// takes the largest credit, which then pays the total. After n picks each index has been chosen
// within one pick of n * weight / total, in a well-spread order.
class SmoothRoundRobin {
 public:
  explicit SmoothRoundRobin(std::vector<double> weights);
  size_t Next();

 private:
  std::vector<double> weights_;
  std::vector<double> credit_;
  double total_ = 0;
};

// The index for `key` by weight, the same on every caller: the key's Fibonacci hash (a Weyl
// sequence over consecutive keys, so consecutive ids spread evenly) placed on the weights'
// cumulative sum. Every relay of a join's inputs picks the same worker for one request id.
size_t HashRoute(uint64_t key, const std::vector<double>& weights);

}  // namespace plexus::serving
