// Placements scored by the exact recovery evaluator: kBest (baselines plus a replica-swap local
// search) and ExactPlacement (branch and bound). They matter where Lazarus's Theorem 1 does not
// hold (c does not divide E): there MRO can fall below the optimum and even below spread.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "placement_internal.hpp"
#include "plexus/base/status.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/recovery.hpp"
#include "recovery_internal.hpp"

namespace plexus::moe {
namespace {

// kBest scores candidates exactly only up to this many failure sets per evaluation, and spends at
// most kSwapBudget set evaluations (failure sets x candidates) on the local search.
constexpr uint64_t kMaxScoredSets = 200'000;
constexpr uint64_t kSwapBudget = 50'000'000;
constexpr int kMaxExactNodes = 12;

absl::Status CheckFailures(int failures, int num_nodes) {
  if (failures < 0 || failures > num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("failures must be in [0, ", num_nodes, "] for ",
                                                   num_nodes, " nodes (got ", failures, ")"));
  }
  return absl::OkStatus();
}

uint64_t Score(const Placement& p, int failures) {
  return internal::CountRecoveringSets(internal::ExpertMasks(p), p.num_nodes, failures);
}

// First-improvement hill climbing: swap two different experts between two nodes while the number
// of recovering failure sets strictly grows. `budget` counts failure sets evaluated.
void ImproveBySwaps(Placement& p, int failures, uint64_t sets_per_eval, uint64_t* budget) {
  uint64_t best = Score(p, failures);
  const uint64_t all = Binomial(p.num_nodes, failures);
  bool improved = true;
  while (improved && best < all) {
    improved = false;
    for (int a = 0; a < p.num_nodes && !improved; ++a) {
      for (int b = a + 1; b < p.num_nodes && !improved; ++b) {
        for (int i = 0; i < p.slots_per_node && !improved; ++i) {
          for (int j = 0; j < p.slots_per_node && !improved; ++j) {
            int& x = p.node_slots[a][i];
            int& y = p.node_slots[b][j];
            if (x == y) continue;
            if (*budget < sets_per_eval) return;
            *budget -= sets_per_eval;
            std::swap(x, y);
            const uint64_t score = Score(p, failures);
            if (score > best) {
              best = score;
              improved = true;
            } else {
              std::swap(x, y);
            }
          }
        }
      }
    }
  }
}

// Branch and bound over the expert x node count matrix, one expert (row) at a time, experts by
// ascending replica count (the easiest to lose first, so the bound bites early).
class ExactSearch {
 public:
  ExactSearch(absl::Span<const int> replicas, int num_nodes, int slots_per_node, int failures,
              int64_t max_nodes)
      : replicas_(replicas.begin(), replicas.end()),
        n_(num_nodes),
        c_(slots_per_node),
        k_(failures),
        max_nodes_(max_nodes) {
    order_.resize(replicas_.size());
    for (size_t e = 0; e < order_.size(); ++e) order_[e] = static_cast<int>(e);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return replicas_[a] < replicas_[b]; });
    rows_.assign(order_.size(), std::vector<int>(n_, 0));
    capacity_.assign(n_, c_);
    masks_.reserve(order_.size());
    all_ = Binomial(n_, k_);
  }

  // `incumbent` (a valid placement) only tightens the bound.
  absl::StatusOr<Placement> Run(const Placement& incumbent) {
    best_ = incumbent;
    best_score_ = Score(incumbent, k_);
    if (best_score_ < all_) Row(0);
    if (exhausted_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("exact placement search visited more than ", max_nodes_,
                       " nodes; use a smaller instance or PlacementPolicy::kBest"));
    }
    return best_;
  }

 private:
  void Row(size_t i) {
    if (exhausted_ || best_score_ == all_) return;
    if (++visited_ > max_nodes_) {
      exhausted_ = true;
      return;
    }
    if (i == order_.size()) {
      const uint64_t score = internal::CountRecoveringSets(masks_, n_, k_);
      if (score > best_score_) Record(score);
      return;
    }
    Cell(i, 0, replicas_[order_[i]], /*equal_to_previous_row=*/SameClass(i));
  }

  bool SameClass(size_t i) const {
    return i > 0 && replicas_[order_[i]] == replicas_[order_[i - 1]];
  }

  // Tied columns: equal on every row before i (the column order must stay lexicographic).
  bool Tied(size_t i, int node) const {
    for (size_t r = 0; r < i; ++r) {
      if (rows_[r][node] != rows_[r][node + 1]) return false;
    }
    return true;
  }

  void Cell(size_t i, int node, int left, bool equal_to_previous_row) {
    if (exhausted_) return;
    std::vector<int>& row = rows_[i];
    if (node == n_) {
      if (left != 0) return;
      uint64_t mask = 0;
      for (int m = 0; m < n_; ++m) {
        if (row[m] > 0) mask |= uint64_t{1} << m;
      }
      masks_.push_back(mask);
      // Bound: the placed experts' masks only get company; failure sets that already lose one
      // of them stay lost.
      if (internal::CountRecoveringSets(masks_, n_, k_) > best_score_) Row(i + 1);
      masks_.pop_back();
      return;
    }
    // Room left on the later nodes must take the rest.
    int room_after = 0;
    for (int m = node + 1; m < n_; ++m) room_after += capacity_[m];
    int high = std::min(left, capacity_[node]);
    if (node > 0 && Tied(i, node - 1)) high = std::min(high, row[node - 1]);
    if (equal_to_previous_row) high = std::min(high, rows_[i - 1][node]);
    const int low = std::max(0, left - room_after);
    for (int v = high; v >= low; --v) {
      row[node] = v;
      capacity_[node] -= v;
      Cell(i, node + 1, left - v, equal_to_previous_row && v == rows_[i - 1][node]);
      capacity_[node] += v;
    }
    row[node] = 0;
  }

  void Record(uint64_t score) {
    best_score_ = score;
    best_.node_slots.assign(n_, {});
    for (size_t r = 0; r < order_.size(); ++r) {
      for (int m = 0; m < n_; ++m) {
        for (int v = 0; v < rows_[r][m]; ++v) best_.node_slots[m].push_back(order_[r]);
      }
    }
    for (auto& slots : best_.node_slots) std::sort(slots.begin(), slots.end());
  }

  std::vector<int> replicas_;
  int n_, c_, k_;
  int64_t max_nodes_;
  std::vector<int> order_;
  std::vector<std::vector<int>> rows_;
  std::vector<int> capacity_;
  std::vector<uint64_t> masks_;
  uint64_t all_ = 0;
  Placement best_;
  uint64_t best_score_ = 0;
  int64_t visited_ = 0;
  bool exhausted_ = false;
};

}  // namespace

namespace internal {

absl::StatusOr<Placement> BestPlacement(absl::Span<const int> replicas, int num_nodes,
                                        int slots_per_node, absl::Span<const int> ascending,
                                        int failures) {
  PLEXUS_RETURN_IF_ERROR(CheckFailures(failures, num_nodes));
  PLEXUS_ASSIGN_OR_RETURN(Placement mro, PlaceExperts(PlacementPolicy::kMro, replicas, num_nodes,
                                                      slots_per_node, ascending));
  const uint64_t sets = num_nodes <= 62 ? Binomial(num_nodes, failures) : 0;
  // Nothing to choose (every or no failure set recovers), or too costly to score exactly.
  if (num_nodes > 62 || sets > kMaxScoredSets || failures == 0 || failures == num_nodes) {
    return mro;
  }
  std::vector<Placement> candidates;
  candidates.push_back(mro);
  for (PlacementPolicy baseline : {PlacementPolicy::kSpread, PlacementPolicy::kCompact}) {
    PLEXUS_ASSIGN_OR_RETURN(Placement p,
                            PlaceExperts(baseline, replicas, num_nodes, slots_per_node, ascending));
    candidates.push_back(std::move(p));
  }
  const uint64_t sets_per_eval = sets * replicas.size();
  uint64_t budget = kSwapBudget;
  for (size_t start : {size_t{0}, size_t{1}}) {  // MRO and spread, improved
    Placement improved = candidates[start];
    ImproveBySwaps(improved, failures, sets_per_eval, &budget);
    candidates.push_back(std::move(improved));
  }
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint64_t score = Score(candidates[i], failures);
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return candidates[best];
}

}  // namespace internal

absl::StatusOr<Placement> ExactPlacement(absl::Span<const int> replicas, int num_nodes,
                                         int slots_per_node, int failures,
                                         int64_t max_search_nodes) {
  PLEXUS_RETURN_IF_ERROR(internal::CheckPlacementRequest(replicas, num_nodes, slots_per_node));
  PLEXUS_RETURN_IF_ERROR(CheckFailures(failures, num_nodes));
  if (num_nodes > kMaxExactNodes) {
    return absl::ResourceExhaustedError(absl::StrCat("exact placement handles at most ",
                                                     kMaxExactNodes, " nodes (got ", num_nodes,
                                                     "); use PlacementPolicy::kBest"));
  }
  // MRO as the first incumbent, not kBest: the search then checks kBest independently.
  PLEXUS_ASSIGN_OR_RETURN(Placement start,
                          PlaceExperts(PlacementPolicy::kMro, replicas, num_nodes, slots_per_node));
  return ExactSearch(replicas, num_nodes, slots_per_node, failures, max_search_nodes).Run(start);
}

}  // namespace plexus::moe
