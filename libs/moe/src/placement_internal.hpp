// Shared by the placement policies (placement.cpp) and the searches (placement_search.cpp).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/moe/placement.hpp"

namespace plexus::moe::internal {

// InvalidArgument unless every expert has >= 1 replica and the replicas fill the slots exactly.
absl::Status CheckPlacementRequest(absl::Span<const int> replicas, int num_nodes,
                                   int slots_per_node);

// PlacementPolicy::kBest (the request is already checked).
absl::StatusOr<Placement> BestPlacement(absl::Span<const int> replicas, int num_nodes,
                                        int slots_per_node, absl::Span<const int> ascending,
                                        int failures);

}  // namespace plexus::moe::internal
