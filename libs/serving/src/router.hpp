// How one sender (a worker or a source) picks the worker of the next operator on one edge.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/rpc/balance.hpp"
#include "plexus/serving/routing.hpp"

namespace plexus::serving::internal {

// The plan's shares (smooth weighted round robin) pick a worker; with Daronpon (the rpc library's
// balancer) a send is redirected to another worker of the operator whose load is lower than the
// pick's by more than one, the load being what the workers' acknowledgements reported (their
// queue) plus this sender's sends not yet acknowledged. Thread-safe: sends and acknowledgements
// come from different threads.
class Router {
 public:
  // `cost`: per worker, the mean time one request takes there (Daronpon compares expected
  // completion times, not counts; empty: counts).
  static absl::StatusOr<std::unique_ptr<Router>> Create(std::vector<double> shares, bool daronpon,
                                                        uint64_t seed,
                                                        std::vector<double> cost = {});
  // The index (into the operator's workers) of the next send; counted until Acked or Failed.
  size_t Pick();
  // The send to `index` ended: acknowledged with the worker's queue at that moment, or failed
  // (nothing more will come back).
  void Done(size_t index, const absl::StatusOr<uint32_t>& queued);

 private:
  Router(std::vector<double> shares, std::unique_ptr<rpc::Balancer> balancer)
      : shares_(std::move(shares)), balancer_(std::move(balancer)) {}
  std::mutex mu_;
  SmoothRoundRobin shares_;
  std::unique_ptr<rpc::Balancer> balancer_;  // null: the shares alone
};

}  // namespace plexus::serving::internal
