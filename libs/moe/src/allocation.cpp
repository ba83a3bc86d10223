#include "plexus/moe/allocation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace plexus::moe {

absl::StatusOr<Allocation> AllocateReplicas(absl::Span<const double> loads,
                                            const AllocationOptions& options) {
  const int num_experts = static_cast<int>(loads.size());
  if (num_experts == 0) return absl::InvalidArgumentError("no experts: the load vector is empty");
  if (options.num_nodes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_nodes must be positive (got ", options.num_nodes, ")"));
  }
  if (options.slots_per_node <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots_per_node must be positive (got ", options.slots_per_node, ")"));
  }
  if (options.min_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_replicas must be at least 1 (got ", options.min_replicas, ")"));
  }
  const int64_t slots = int64_t{options.num_nodes} * options.slots_per_node;
  if (slots > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("too many slots: ", slots));
  }
  if (num_experts > slots) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_experts, " experts do not fit in ", options.num_nodes, " nodes x ",
                     options.slots_per_node, " slots: every expert needs at least one replica"));
  }
  double total = 0;
  for (int e = 0; e < num_experts; ++e) {
    if (!std::isfinite(loads[e]) || loads[e] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("load of expert ", e, " must be finite and >= 0 (got ", loads[e], ")"));
    }
    total += loads[e];
  }
  if (total <= 0) return absl::InvalidArgumentError("expert loads sum to zero");

  Allocation out;
  out.ascending.resize(num_experts);
  std::iota(out.ascending.begin(), out.ascending.end(), 0);
  std::stable_sort(out.ascending.begin(), out.ascending.end(),
                   [&](int a, int b) { return loads[a] < loads[b]; });
  out.min_replicas = options.min_replicas;
  if (int64_t{num_experts} * options.min_replicas > slots) {
    out.min_replicas = static_cast<int>(slots / num_experts);
    out.min_replicas_lowered = true;
  }
  out.replicas.assign(num_experts, 0);

  // Suffix sums in long double so that the last expert sees exactly its share of 1.
  std::vector<long double> suffix(num_experts + 1, 0);
  for (int i = num_experts - 1; i >= 0; --i) suffix[i] = suffix[i + 1] + loads[out.ascending[i]];
  int64_t remaining = slots;
  for (int i = 0; i < num_experts; ++i) {
    const int e = out.ascending[i];
    int64_t r;
    if (i == num_experts - 1) {
      r = remaining;  // t_e / sum = 1 exactly; avoid rounding it down to remaining - 1
    } else {
      const long double share = static_cast<long double>(loads[e]) / suffix[i] * remaining;
      // A relative epsilon keeps exact products (e.g. 0.3 * 10) from flooring one too low.
      r = static_cast<int64_t>(std::floor(share * (1 + 1e-12L)));
      r = std::max<int64_t>(r, out.min_replicas);
      // Keep min_replicas for every later expert (holds analytically; guards rounding).
      r = std::min<int64_t>(r, remaining - int64_t{num_experts - 1 - i} * out.min_replicas);
    }
    out.replicas[e] = static_cast<int>(r);
    remaining -= r;
  }
  return out;
}

}  // namespace plexus::moe
