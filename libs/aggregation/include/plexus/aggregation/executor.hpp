// Runs a verified plan (plan.hpp) over a collectives communicator: rank r plays node r. Each
// communication round of the plan is one pairwise exchange (AllToAllV) among all ranks; the
// local steps between them (aggregate, optimize, install) run as soon as their inputs are in.
// Sums are taken in the plan's order, so the result equals EvaluatePlan bit for bit.
#pragma once

#include <span>

#include "absl/status/status.h"
#include "plexus/aggregation/plan.hpp"

namespace plexus::collectives {
class Communicator;
}

namespace plexus::aggregation {

struct ExecuteOptions {
  float scale = 1;  // the optimizer of the plan's optimize steps: value *= scale
};

// Every rank calls this with the same plan. `buffer` (the plan's elements, fp32) is this rank's
// contribution on entry and the reduced, optimized result on return. Errors name the rank, the
// round and the step; a dead or silent peer fails within the communicator's timeout.
absl::Status ExecutePlan(collectives::Communicator& comm, const Plan& plan, std::span<float> buffer,
                         const ExecuteOptions& options = {});

}  // namespace plexus::aggregation
