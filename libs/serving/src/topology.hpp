// The static view of a plan that the driver and every worker derive from (problem, plan): who
// serves what, the shares, the masks of sources a message carries, the emulated payloads and the
// service-time fits. Each process of a later multi-process launch builds its own copy from the
// same two JSON files; nothing in it points into another worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/placement/network.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/placement/simulator.hpp"
#include "plexus/serving/serve.hpp"

namespace plexus::serving::internal {

struct Topology {
  placement::Problem problem;
  placement::Plan plan;           // evaluated
  std::vector<int> sources;       // source operators, in Problem order (bit s of a mask)
  std::vector<int> source_index;  // per operator: its bit, -1 when not a source
  std::vector<bool> join;         // a join with several in-edges
  std::vector<bool> sink;         // an operator that is not a source and has no out-edges
  // The source masks of the messages an operator emits (one for a join: its inputs' OR).
  std::vector<std::vector<uint64_t>> masks;
  std::vector<std::vector<bool>> reaches;  // reaches[a][b]: b is a or below a
  // Per operator: its workers and their shares, in plan order.
  std::vector<std::vector<int>> op_workers;
  std::vector<std::vector<double>> op_shares;
  std::vector<std::vector<int>> worker_ops;  // per worker: the operators it serves
  std::vector<int> servers;                  // per worker: requests in service at once
  // Emulated payload of each edge: the plan's message size for its variants, a fixed pattern.
  std::vector<std::string> edge_payload;
  // fit[op][worker]: the service time of op's variant on the worker's type.
  std::vector<std::vector<placement::ServiceTime>> fit;

  // Where a message on `edge` from `from_worker` (-1: the edge's source) was sent from.
  placement::Position From(int edge, int from_worker) const;
  // Plan seconds a message of `bytes` takes from a to b: the link's latency plus serialisation.
  double LinkDelayS(placement::Position a, placement::Position b, size_t bytes) const;
  // Whether a worker serves anything.
  bool Serves(int worker) const { return !worker_ops[worker].empty(); }
};

// Validates (CheckServable's rules) and builds the view.
absl::StatusOr<std::shared_ptr<const Topology>> BuildTopology(const placement::Problem& problem,
                                                              const placement::Plan& plan,
                                                              const ServeOptions& options);

// Steady-clock nanoseconds (CLOCK_MONOTONIC: one clock for every process of a host).
int64_t NowNs();

}  // namespace plexus::serving::internal
