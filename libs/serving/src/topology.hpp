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
#include "plexus/serving/routing.hpp"
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
  // Fan-out. An edge with rate_ratio r != 1 carries, per message its `from` operator processes
  // for request `id`, Count(edge, id) = floor((id + 1) r) - floor(id r) messages: the simulator's
  // long-run count, fixed per request id so that the driver knows what a sink is owed. Message k
  // of one with part p has part p * radix[edge] + k (radix: ceil(r); 1 where r is 1, which keeps
  // the part). chains[op][i]: the edges with r != 1 that messages with masks[op][i] crossed to
  // reach op, in order (one chain per mask: the runtime refuses a workflow where they differ).
  std::vector<double> ratio;
  std::vector<uint64_t> radix;
  std::vector<std::vector<std::vector<int>>> chains;
  uint64_t max_parts = 1;  // the most messages one request can become at one operator
  std::vector<std::vector<bool>> reaches;  // reaches[a][b]: b is a or below a
  // Per operator: its workers and their shares, in plan order.
  std::vector<std::vector<int>> op_workers;
  std::vector<std::vector<double>> op_shares;
  // Per operator, per worker in op_workers' order: the mean time a request of it takes there
  // (the service-time fit's mean over the worker's servers): Daronpon's cost of a send.
  std::vector<std::vector<double>> op_costs;
  // Per operator: its worker for a request id (index into op_workers), for joins.
  std::vector<RouteById> by_id;
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
  // Messages on `edge` per message processed by its `from` operator, for request `id`.
  uint64_t Count(int edge, uint64_t id) const;
  // The messages of request `id` with masks[op][mask_index] that reach op.
  uint64_t Parts(int op, size_t mask_index, uint64_t id) const;
  // The parts at `op` (with masks[op][mask_index]) that descend from message `part` of request
  // `id` once it had crossed the first `crossed` edges of that chain.
  std::vector<uint64_t> Descendants(int op, size_t mask_index, size_t crossed, uint64_t id,
                                    uint64_t part) const;
  // The index of `mask` in masks[op]; -1 when absent (a join's input carries part of its mask).
  int MaskIndex(int op, uint64_t mask) const;
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
