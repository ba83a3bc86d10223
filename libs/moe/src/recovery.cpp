#include "plexus/moe/recovery.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "recovery_internal.hpp"

namespace plexus::moe {
namespace {
// __extension__ keeps -Wpedantic quiet about the (GCC/Clang) 128-bit integers.
__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;
}  // namespace

namespace internal {

std::vector<uint64_t> ExpertMasks(const Placement& placement) {
  std::vector<uint64_t> masks(placement.num_experts, 0);
  for (int n = 0; n < placement.num_nodes; ++n) {
    for (int e : placement.node_slots[n]) masks[e] |= uint64_t{1} << n;
  }
  return masks;
}

uint64_t CountRecoveringSets(absl::Span<const uint64_t> masks, int num_nodes, int failures) {
  if (failures == 0) return 1;
  if (failures > num_nodes) return 0;
  uint64_t recovering = 0;
  uint64_t subset = (uint64_t{1} << failures) - 1;
  const uint64_t limit = uint64_t{1} << num_nodes;
  while (subset < limit) {
    bool dead = false;
    for (uint64_t m : masks) {
      if ((m & ~subset) == 0) {
        dead = true;
        break;
      }
    }
    if (!dead) ++recovering;
    // Gosper's hack: the next subset with the same popcount.
    const uint64_t c = subset & (~subset + 1);
    const uint64_t r = subset + c;
    subset = (((r ^ subset) >> 2) / c) | r;
  }
  return recovering;
}

}  // namespace internal

uint64_t Binomial(int n, int k) {
  if (k < 0 || n < 0 || k > n) return 0;
  k = std::min(k, n - k);
  UInt128 value = 1;
  for (int i = 1; i <= k; ++i) value = value * static_cast<unsigned>(n - k + i) / i;
  return static_cast<uint64_t>(value);
}

namespace {

long double BinomialLd(int n, int k) {
  if (k < 0 || k > n) return 0;
  return std::exp(std::lgamma(static_cast<long double>(n) + 1) -
                  std::lgamma(static_cast<long double>(k) + 1) -
                  std::lgamma(static_cast<long double>(n - k) + 1));
}

// Replica sets as bitsets over nodes.
using NodeSet = std::vector<uint64_t>;

bool IsSubset(const NodeSet& a, const NodeSet& b) {
  for (size_t w = 0; w < a.size(); ++w) {
    if (a[w] & ~b[w]) return false;
  }
  return true;
}

int PopCount(const NodeSet& s) {
  int c = 0;
  for (uint64_t w : s) c += std::popcount(w);
  return c;
}

struct Supports {
  int num_nodes = 0;
  std::vector<NodeSet> minimal;  // no set contains another; duplicates removed
};

absl::StatusOr<Supports> MinimalSupports(absl::Span<const Placement> layers, int failures) {
  if (layers.empty()) return absl::InvalidArgumentError("no layers to analyse");
  Supports out;
  out.num_nodes = layers[0].num_nodes;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (absl::Status s = ValidatePlacement(layers[l]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", std::string(s.message())));
    }
    if (layers[l].num_nodes != out.num_nodes) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has ", layers[l].num_nodes,
                                                     " nodes, layer 0 has ", out.num_nodes));
    }
  }
  if (failures < 0 || failures > out.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("failures must be in [0, ", out.num_nodes,
                                                   "] for ", out.num_nodes, " nodes (got ",
                                                   failures, ")"));
  }
  const size_t words = (out.num_nodes + 63) / 64;
  std::vector<NodeSet> all;
  for (const Placement& layer : layers) {
    for (const auto& nodes : layer.ExpertNodes()) {
      NodeSet set(words, 0);
      for (int n : nodes) set[n / 64] |= uint64_t{1} << (n % 64);
      all.push_back(std::move(set));
    }
  }
  std::sort(all.begin(), all.end(), [&](const NodeSet& a, const NodeSet& b) {
    const int pa = PopCount(a), pb = PopCount(b);
    return pa != pb ? pa < pb : a < b;
  });
  all.erase(std::unique(all.begin(), all.end()), all.end());
  for (NodeSet& set : all) {
    bool dominated = false;
    for (const NodeSet& kept : out.minimal) {
      if (IsSubset(kept, set)) {
        dominated = true;
        break;
      }
    }
    if (!dominated) out.minimal.push_back(std::move(set));
  }
  return out;
}

RecoveryResult ExactResult(const char* method, long double probability, int n, int k,
                           uint64_t recovering) {
  RecoveryResult r;
  r.method = method;
  r.exact = true;
  r.probability = r.ci_low = r.ci_high = static_cast<double>(probability);
  if (n <= 62) {
    r.total_sets = Binomial(n, k);
    r.recovering_sets = recovering;
  }
  return r;
}

}  // namespace

absl::StatusOr<RecoveryResult> RecoveryClosedForm(absl::Span<const Placement> layers,
                                                  int failures) {
  PLEXUS_ASSIGN_OR_RETURN(Supports supports, MinimalSupports(layers, failures));
  const int n = supports.num_nodes;
  const int k = failures;
  std::vector<int> sizes;
  const size_t words = (n + 63) / 64;
  NodeSet used(words, 0);
  for (const NodeSet& set : supports.minimal) {
    for (size_t w = 0; w < words; ++w) {
      if (used[w] & set[w]) {
        return absl::FailedPreconditionError(
            "the minimal replica sets overlap (not an MRO-structured placement); use "
            "enumeration or Monte Carlo");
      }
      used[w] |= set[w];
    }
    sizes.push_back(PopCount(set));
  }
  if (n <= 62) {
    // Inclusion-exclusion: recovering = sum over subsets S of groups of
    // (-1)^|S| C(N - m_S, k - m_S), m_S the nodes S covers; grouped by m_S so it is O(G*N).
    std::vector<Int128> signed_count(n + 1, 0);
    signed_count[0] = 1;
    for (int size : sizes) {
      for (int m = n; m >= size; --m) signed_count[m] -= signed_count[m - size];
    }
    Int128 recovering = 0;
    for (int m = 0; m <= k; ++m) {
      recovering += signed_count[m] * static_cast<Int128>(Binomial(n - m, k - m));
    }
    const uint64_t total = Binomial(n, k);
    return ExactResult("closed_form",
                       static_cast<long double>(recovering) / static_cast<long double>(total), n, k,
                       static_cast<uint64_t>(recovering));
  }
  // Large N: the same sum as the coefficient of x^k in prod_g ((1+x)^m_g - x^m_g) (1+x)^free,
  // which has no alternating signs to cancel in floating point.
  std::vector<long double> poly(1, 1.0L);
  int covered = 0;
  auto multiply = [&](int m, bool exclude_full) {
    std::vector<long double> next(std::min<size_t>(poly.size() + m, k + 1), 0.0L);
    for (size_t i = 0; i < poly.size(); ++i) {
      if (poly[i] == 0) continue;
      for (int j = 0; j <= m && i + j < next.size(); ++j) {
        if (exclude_full && j == m) continue;
        next[i + j] += poly[i] * BinomialLd(m, j);
      }
    }
    poly = std::move(next);
  };
  for (int size : sizes) {
    multiply(size, true);
    covered += size;
  }
  multiply(n - covered, false);
  const long double recovering = k < static_cast<int>(poly.size()) ? poly[k] : 0.0L;
  return ExactResult("closed_form", recovering / BinomialLd(n, k), n, k, 0);
}

absl::StatusOr<RecoveryResult> RecoveryEnumerate(absl::Span<const Placement> layers, int failures,
                                                 uint64_t max_sets) {
  PLEXUS_ASSIGN_OR_RETURN(Supports supports, MinimalSupports(layers, failures));
  const int n = supports.num_nodes;
  const int k = failures;
  if (n > 62) {
    return absl::ResourceExhaustedError(
        absl::StrCat("enumeration supports at most 62 nodes (got ", n, "); use Monte Carlo"));
  }
  const uint64_t total = Binomial(n, k);
  if (total > max_sets) {
    return absl::ResourceExhaustedError(absl::StrCat("C(", n, ",", k, ") = ", total,
                                                     " failure sets exceed the limit of ", max_sets,
                                                     "; use Monte Carlo"));
  }
  std::vector<uint64_t> masks;
  for (const NodeSet& set : supports.minimal) masks.push_back(set[0]);
  const uint64_t recovering = internal::CountRecoveringSets(masks, n, k);
  return ExactResult("enumeration",
                     static_cast<long double>(recovering) / static_cast<long double>(total), n, k,
                     recovering);
}

namespace {
// z with P(|Z| <= z) = confidence, by bisection on erfc.
double NormalQuantile(double confidence) {
  double lo = 0, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    if (std::erfc(mid / std::sqrt(2.0)) > 1 - confidence) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}
}  // namespace

absl::StatusOr<RecoveryResult> RecoveryMonteCarlo(absl::Span<const Placement> layers, int failures,
                                                  int64_t samples, uint64_t seed,
                                                  double confidence) {
  if (samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Monte Carlo needs a positive sample count (got ", samples, ")"));
  }
  if (!(confidence > 0 && confidence < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("confidence must be in (0, 1) (got ", confidence, ")"));
  }
  PLEXUS_ASSIGN_OR_RETURN(Supports supports, MinimalSupports(layers, failures));
  const int n = supports.num_nodes;
  const size_t words = (n + 63) / 64;
  std::mt19937_64 rng(seed);
  std::vector<int> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = i;
  NodeSet failed(words);
  int64_t recovering = 0;
  for (int64_t s = 0; s < samples; ++s) {
    std::fill(failed.begin(), failed.end(), 0);
    for (int i = 0; i < failures; ++i) {  // partial Fisher-Yates: a uniform k-subset
      std::uniform_int_distribution<int> pick(i, n - 1);
      std::swap(nodes[i], nodes[pick(rng)]);
      failed[nodes[i] / 64] |= uint64_t{1} << (nodes[i] % 64);
    }
    bool dead = false;
    for (const NodeSet& set : supports.minimal) {
      if (IsSubset(set, failed)) {
        dead = true;
        break;
      }
    }
    if (!dead) ++recovering;
  }
  RecoveryResult r;
  r.method = "monte_carlo";
  r.samples = samples;
  const double p = static_cast<double>(recovering) / samples;
  const double z = NormalQuantile(confidence);
  const double z2n = z * z / samples;
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half = z * std::sqrt(p * (1 - p) / samples + z2n / (4 * samples)) / (1 + z2n);
  r.probability = p;
  r.ci_low = std::max(0.0, center - half);
  r.ci_high = std::min(1.0, center + half);
  return r;
}

absl::StatusOr<RecoveryResult> RecoveryProbability(absl::Span<const Placement> layers, int failures,
                                                   uint64_t max_sets, int64_t mc_samples) {
  absl::StatusOr<RecoveryResult> closed = RecoveryClosedForm(layers, failures);
  if (closed.ok() || closed.status().code() != absl::StatusCode::kFailedPrecondition) {
    return closed;
  }
  const int n = layers[0].num_nodes;
  if (n <= 62 && Binomial(n, failures) <= max_sets) {
    return RecoveryEnumerate(layers, failures, max_sets);
  }
  return RecoveryMonteCarlo(layers, failures, mc_samples);
}

absl::StatusOr<BruteForceResult> BruteForceOptimalRecovery(absl::Span<const int> replicas,
                                                           int num_nodes, int slots_per_node,
                                                           int64_t max_placements) {
  const int num_experts = static_cast<int>(replicas.size());
  if (num_nodes <= 0 || num_nodes > 8) {
    return absl::ResourceExhaustedError(
        absl::StrCat("brute force handles 1..8 nodes (got ", num_nodes, ")"));
  }
  if (slots_per_node <= 0 || num_experts == 0 || num_experts > 8) {
    return absl::InvalidArgumentError("brute force needs positive slots and 1..8 experts");
  }
  int total = 0;
  for (int r : replicas) {
    if (r < 1) return absl::InvalidArgumentError("every expert needs at least one replica");
    total += r;
  }
  if (total != num_nodes * slots_per_node) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas sum to ", total, ", slots are ", num_nodes * slots_per_node));
  }
  // Every multiset of `slots_per_node` experts a node can hold, as per-expert counts.
  std::vector<std::vector<int>> contents;
  std::vector<int> current;
  auto gen = [&](auto&& self, int from, int left) -> void {
    if (left == 0) {
      std::vector<int> counts(num_experts, 0);
      for (int e : current) ++counts[e];
      contents.push_back(std::move(counts));
      return;
    }
    for (int e = from; e < num_experts; ++e) {
      current.push_back(e);
      self(self, e, left - 1);
      current.pop_back();
    }
  };
  gen(gen, 0, slots_per_node);

  BruteForceResult out;
  out.best_recovering_sets.assign(num_nodes + 1, 0);
  out.best_placement.assign(num_nodes + 1, Placement{});
  std::vector<bool> have(num_nodes + 1, false);
  std::vector<int> remaining(replicas.begin(), replicas.end());
  std::vector<int> chosen(num_nodes, 0);
  const uint32_t subsets = 1u << num_nodes;
  bool exhausted = false;

  auto evaluate = [&]() {
    std::vector<uint32_t> masks(num_experts, 0);
    for (int n = 0; n < num_nodes; ++n) {
      for (int e = 0; e < num_experts; ++e) {
        if (contents[chosen[n]][e] > 0) masks[e] |= 1u << n;
      }
    }
    std::vector<uint64_t> recovering(num_nodes + 1, 0);
    for (uint32_t f = 0; f < subsets; ++f) {
      bool dead = false;
      for (uint32_t m : masks) {
        if ((m & ~f) == 0) {
          dead = true;
          break;
        }
      }
      if (!dead) ++recovering[std::popcount(f)];
    }
    for (int k = 0; k <= num_nodes; ++k) {
      if (have[k] && recovering[k] <= out.best_recovering_sets[k]) continue;
      have[k] = true;
      out.best_recovering_sets[k] = recovering[k];
      Placement p;
      p.num_nodes = num_nodes;
      p.slots_per_node = slots_per_node;
      p.num_experts = num_experts;
      p.node_slots.resize(num_nodes);
      for (int n = 0; n < num_nodes; ++n) {
        for (int e = 0; e < num_experts; ++e) {
          for (int c = 0; c < contents[chosen[n]][e]; ++c) p.node_slots[n].push_back(e);
        }
      }
      out.best_placement[k] = std::move(p);
    }
  };
  // Nodes fail uniformly, so node order does not matter: node contents are non-decreasing.
  auto search = [&](auto&& self, int node, int from) -> void {
    if (exhausted) return;
    if (node == num_nodes) {
      if (++out.placements_visited > max_placements) {
        exhausted = true;
        return;
      }
      evaluate();
      return;
    }
    for (int idx = from; idx < static_cast<int>(contents.size()); ++idx) {
      bool fits = true;
      for (int e = 0; e < num_experts; ++e) {
        if (contents[idx][e] > remaining[e]) {
          fits = false;
          break;
        }
      }
      if (!fits) continue;
      for (int e = 0; e < num_experts; ++e) remaining[e] -= contents[idx][e];
      chosen[node] = idx;
      self(self, node + 1, idx);
      for (int e = 0; e < num_experts; ++e) remaining[e] += contents[idx][e];
    }
  };
  search(search, 0, 0);
  if (exhausted) {
    return absl::ResourceExhaustedError(
        absl::StrCat("brute force visited more than ", max_placements, " placements"));
  }
  return out;
}

}  // namespace plexus::moe
