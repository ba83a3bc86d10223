// The core of the exact recovery evaluator, shared by RecoveryEnumerate and the placement
// searches (which score partial and candidate placements with it).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "plexus/moe/placement.hpp"

namespace plexus::moe::internal {

// Node bitmask of every expert of `placement` (num_nodes <= 62).
std::vector<uint64_t> ExpertMasks(const Placement& placement);

// How many of the C(num_nodes, failures) failure sets leave every mask with a surviving node
// (num_nodes <= 62; the caller bounds C(num_nodes, failures)).
uint64_t CountRecoveringSets(absl::Span<const uint64_t> masks, int num_nodes, int failures);

}  // namespace plexus::moe::internal
