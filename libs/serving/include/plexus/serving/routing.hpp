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

// The index for a request id by weight, the same on every caller: the id-th pick of a smooth
// weighted round robin that starts afresh (a table of `period` picks, repeated). Every relay of a
// join's inputs picks the same worker for one request id, and consecutive ids follow the round
// robin's order, as the sources' own routers do (so that, with equal shares, a request's stages
// and its join land on one worker index, as in the simulator).
class RouteById {
 public:
  explicit RouteById(const std::vector<double>& weights, size_t period = 4096);
  size_t operator()(uint64_t id) const { return picks_[id % picks_.size()]; }

 private:
  std::vector<uint32_t> picks_;
};

}  // namespace plexus::serving
