// Expert replica allocation (Lazarus, Eq. 6.1): replicas in proportion to token load.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::moe {

struct AllocationOptions {
  int num_nodes = 0;       // N
  int slots_per_node = 0;  // c: expert replicas one node holds (per layer)
  int min_replicas = 2;    // f: lowered to floor(N*c/E) when N*c < E*f
};

struct Allocation {
  // replicas[e]: replicas of expert e (experts keep their input order). Sums to N*c and is
  // non-decreasing in load.
  std::vector<int> replicas;
  // Expert ids by ascending load (ties by id): the order Eq. 6.1 and MRO placement walk.
  std::vector<int> ascending;
  int min_replicas = 0;               // f actually used
  bool min_replicas_lowered = false;  // f was lowered because slots ran short
};

// r_e = max(floor(t_e / sum_{e'>=e} t_e' * (N*c - sum_{e'<e} r_e')), f), experts by ascending
// load. `loads` are token counts or fractions (>= 0, finite, not all zero). InvalidArgument on
// bad input, including E > N*c (some expert could not get a slot).
absl::StatusOr<Allocation> AllocateReplicas(absl::Span<const double> loads,
                                            const AllocationOptions& options);

}  // namespace plexus::moe
