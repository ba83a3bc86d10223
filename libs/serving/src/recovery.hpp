// What recovering from a failed worker needs apart from the driver's state: the plan without the
// failed workers, and the inputs that the sinks still owe (re-sent to the new deployment).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "collector.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/serving/serve.hpp"
#include "topology.hpp"

namespace plexus::serving::internal {

// `replan` (default JellyBean) of `problem` without the workers marked `failed`, returned in
// `problem`'s worker indices.
absl::StatusOr<placement::Plan> ReplanWithout(const placement::Problem& problem,
                                              const std::vector<bool>& failed,
                                              const Replanner& replan);

// (source index, id) of every input a source injected (`injected` per source) that a sink it
// reaches still owes: neither completed there nor given up for good (a drop that is not
// retryable) at or above it. A join's inputs from a source that injected an id the other
// sources have not yet are owed too: their partners come later, to the new deployment.
std::vector<std::pair<int, uint64_t>> OwedInputs(const Topology& topology,
                                                 const Collector& collector,
                                                 const std::vector<int64_t>& injected);

}  // namespace plexus::serving::internal
