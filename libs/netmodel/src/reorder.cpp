// Rank reordering (Cloud Collectives, seed 001 §5.2.3): simulated annealing over permutations,
// then branch and bound seeded with the annealed cost, which either finds a cheaper order or
// proves none exists.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cost_model.hpp"
#include "plexus/base/status.hpp"
#include "plexus/netmodel/reorder.hpp"

namespace plexus::netmodel {
namespace {

using internal::CostStructure;
using internal::Evaluate;
using internal::EvaluateOrder;

absl::Status CheckOrder(const CostMatrix& m, const std::vector<int>& order) {
  if (static_cast<int>(order.size()) != m.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("order has ", order.size(), " entries for ", m.n, " nodes"));
  }
  std::vector<bool> seen(m.n, false);
  for (size_t i = 0; i < order.size(); ++i) {
    const int v = order[i];
    if (v < 0 || v >= m.n || seen[v]) {
      return absl::InvalidArgumentError(absl::StrCat("order[", i, "] = ", v,
                                                     " is out of range or repeated: the order "
                                                     "must be a permutation of 0..",
                                                     m.n - 1));
    }
    seen[v] = true;
  }
  return absl::OkStatus();
}

bool Symmetric(const CostMatrix& m) {
  for (int i = 0; i < m.n; ++i) {
    for (int j = i + 1; j < m.n; ++j) {
      const size_t a = static_cast<size_t>(i) * m.n + j;
      const size_t b = static_cast<size_t>(j) * m.n + i;
      if (m.latency_us[a] != m.latency_us[b]) return false;
      if (!m.bandwidth_gbps.empty() && m.bandwidth_gbps[a] != m.bandwidth_gbps[b]) return false;
    }
  }
  return true;
}

// Annealing. The ring gets O(1) move deltas (it is a travelling-salesman tour); the sum-of-max
// and max-of-sum models are re-evaluated per move, as a move changes which transfer is slowest.
class Annealer {
 public:
  Annealer(const CostMatrix& m, const CostStructure& s, const ReorderOptions& o, bool symmetric)
      : m_(m),
        s_(s),
        ring_(o.cost.model == CostModel::kRing),
        symmetric_(symmetric),
        bytes_(o.cost.bytes),
        scale_(std::max(0.0, o.anneal_temperature)),
        polish_(o.polish) {}

  double Cost(const std::vector<int>& o) const { return EvaluateOrder(s_, m_, o); }

  // One run from `order` (modified in place to the best found); returns its cost.
  double Run(std::vector<int>* order, int64_t moves, std::mt19937_64* rng, absl::Time deadline,
             int64_t* done) {
    const int n = m_.n;
    std::vector<int>& o = *order;
    if (n < 3) return Cost(o);
    double cost = Cost(o);
    std::vector<int> best = o;
    double best_cost = cost;
    std::uniform_int_distribution<int> pos(0, n - 1);
    std::uniform_real_distribution<double> unit(0, 1);
    // Starting temperature: the mean uphill delta of random moves, accepted with p = 1/e.
    double uphill = 0;
    int ups = 0;
    for (int k = 0; scale_ > 0 && k < 200; ++k) {
      const Move mv = Draw(rng, pos, unit);
      const double d = Delta(o, mv, cost);
      if (d > 0) {
        uphill += d;
        ++ups;
      }
    }
    const double t0 = scale_ * (ups > 0 ? uphill / ups : 1.0);
    const double t_end = t0 * 1e-4;
    const double cool = t0 > 0 ? std::pow(t_end / t0, 1.0 / std::max<int64_t>(moves, 1)) : 1.0;
    double temp = t0;
    for (int64_t k = 0; k < moves; ++k, temp *= cool) {
      if ((k & 0xFFFF) == 0 && absl::Now() > deadline) break;
      ++*done;
      const Move mv = Draw(rng, pos, unit);
      const double d = Delta(o, mv, cost);
      if (d <= 0 || (temp > 0 && unit(*rng) < std::exp(-d / temp))) {
        Apply(&o, mv);
        cost += d;
        if (cost < best_cost) {
          best_cost = cost;
          best = o;
        }
      }
    }
    o = best;
    if (ring_ && polish_) Polish(&o);
    return Cost(o);  // exact, not the running sum of deltas
  }

 private:
  struct Move {
    bool reverse;  // else swap
    int p, q;      // p < q
  };

  double C(int a, int b) const { return m_.Cost(a, b, bytes_); }

  template <typename Dist, typename Unit>
  Move Draw(std::mt19937_64* rng, Dist& pos, Unit& unit) const {
    int p = pos(*rng), q = pos(*rng);
    while (q == p) q = pos(*rng);
    if (p > q) std::swap(p, q);
    // Swaps only between the first n-1 and last positions would reverse the whole ring; keep
    // reversals shorter than n - 1 so that both boundary edges are distinct.
    bool reverse = unit(*rng) < 0.5 && q - p + 1 <= m_.n - 2;
    return Move{reverse, p, q};
  }

  double Delta(std::vector<int>& o, const Move& mv, double cost) {
    const int n = m_.n;
    if (!ring_) {
      Apply(&o, mv);
      const double c = Cost(o);
      Apply(&o, mv);  // both moves are involutions
      return c - cost;
    }
    auto at = [&](int p) { return o[((p % n) + n) % n]; };
    if (mv.reverse) {
      const int a = at(mv.p - 1), b = o[mv.p], c = o[mv.q], d = at(mv.q + 1);
      double delta = C(a, c) + C(b, d) - C(a, b) - C(c, d);
      if (!symmetric_) {
        for (int k = mv.p; k < mv.q; ++k) delta += C(o[k + 1], o[k]) - C(o[k], o[k + 1]);
      }
      return delta;
    }
    // Swap: the edges leaving positions p-1, p, q-1, q (deduplicated) change.
    int edges[4] = {(mv.p - 1 + n) % n, mv.p, (mv.q - 1 + n) % n, mv.q};
    std::sort(edges, edges + 4);
    const int* end = std::unique(edges, edges + 4);
    double before = 0;
    for (const int* e = edges; e != end; ++e) before += C(o[*e], o[(*e + 1) % n]);
    std::swap(o[mv.p], o[mv.q]);
    double after = 0;
    for (const int* e = edges; e != end; ++e) after += C(o[*e], o[(*e + 1) % n]);
    std::swap(o[mv.p], o[mv.q]);
    return after - before;
  }

  static void Apply(std::vector<int>* o, const Move& mv) {
    if (mv.reverse) {
      std::reverse(o->begin() + mv.p, o->begin() + mv.q + 1);
    } else {
      std::swap((*o)[mv.p], (*o)[mv.q]);
    }
  }

  // 2-opt descent to a local minimum (symmetric rings; bounded sweeps).
  void Polish(std::vector<int>* order) const {
    if (!symmetric_) return;
    std::vector<int>& o = *order;
    const int n = m_.n;
    for (int sweep = 0; sweep < 50; ++sweep) {
      bool improved = false;
      for (int p = 1; p < n - 1; ++p) {
        for (int q = p + 1; q < n; ++q) {
          const int a = o[p - 1], b = o[p], c = o[q], d = o[(q + 1) % n];
          if (d == b) continue;
          if (C(a, c) + C(b, d) < C(a, b) + C(c, d) - 1e-12) {
            std::reverse(o.begin() + p, o.begin() + q + 1);
            improved = true;
          }
        }
      }
      if (!improved) break;
    }
  }

  const CostMatrix& m_;
  const CostStructure& s_;
  const bool ring_;
  const bool symmetric_;
  const double bytes_;
  const double scale_;
  const bool polish_;
};

// Depth-first branch and bound over positions 0..n-1. The bound evaluates the model with every
// transfer between placed nodes at its cost and every other transfer at the least it could cost
// among the unplaced nodes; the cost is non-decreasing in each transfer, so it is a lower bound.
class BranchAndBound {
 public:
  BranchAndBound(const CostMatrix& m, const CostStructure& s, const CostOptions& c, bool symmetric,
                 int64_t node_limit, absl::Time deadline)
      : m_(m), s_(s), node_limit_(node_limit), deadline_(deadline) {
    const int n = m.n;
    // Every position is equivalent to position 0 under an automorphism of the ring (rotation),
    // of halving-doubling over a power of two (p -> p xor a) and of BCube (digit-wise shifts),
    // so node 0 may be fixed at position 0. A symmetric ring also reads the same reversed.
    const bool pow2 = (n & (n - 1)) == 0;
    fix_first_ = c.model == CostModel::kRing || c.model == CostModel::kBCube ||
                 (c.model == CostModel::kHalvingDoubling && pow2);
    reflect_ = c.model == CostModel::kRing && symmetric && n >= 3;
    order_.assign(n, -1);
    used_.assign(n, false);
  }

  // Searches for an order cheaper than `bound` (initially the annealed one). Returns true when
  // the search finished (best() is then optimal).
  bool Run(std::vector<int> incumbent, double bound) {
    best_ = std::move(incumbent);
    best_cost_ = bound;
    aborted_ = false;
    if (fix_first_) {
      Place(0, 0);
      Search(1);
      Unplace(0, 0);
    } else {
      Search(0);
    }
    return !aborted_;
  }
  const std::vector<int>& best() const { return best_; }
  double best_cost() const { return best_cost_; }
  int64_t nodes() const { return nodes_; }

 private:
  void Place(int p, int v) {
    order_[p] = v;
    used_[v] = true;
  }
  void Unplace(int p, int v) {
    order_[p] = -1;
    used_[v] = false;
  }

  double Bound() const {
    return Evaluate(s_, [&](int a, int b, double bytes) {
      const int u = order_[a], v = order_[b];
      if (u >= 0 && v >= 0) return m_.Cost(u, v, bytes);
      double lo = INFINITY;
      for (int x = 0; x < m_.n; ++x) {
        if (u >= 0) {
          if (!used_[x]) lo = std::min(lo, m_.Cost(u, x, bytes));
        } else if (v >= 0) {
          if (!used_[x]) lo = std::min(lo, m_.Cost(x, v, bytes));
        } else if (!used_[x]) {
          for (int y = 0; y < m_.n; ++y) {
            if (y != x && !used_[y]) lo = std::min(lo, m_.Cost(x, y, bytes));
          }
        }
      }
      return std::isfinite(lo) ? lo : 0.0;
    });
  }

  void Search(int p) {
    if (aborted_) return;
    if (++nodes_ > node_limit_ || ((nodes_ & 0x3FF) == 0 && absl::Now() > deadline_)) {
      aborted_ = true;
      return;
    }
    const int n = m_.n;
    if (p == n) {
      const double c = Bound();  // every transfer is placed: the exact cost
      if (c < best_cost_) {
        best_cost_ = c;
        best_ = order_;
      }
      return;
    }
    for (int v = 0; v < n && !aborted_; ++v) {
      if (used_[v]) continue;
      if (reflect_ && p == n - 1 && v < order_[1]) continue;
      Place(p, v);
      if (Bound() < best_cost_) Search(p + 1);
      Unplace(p, v);
    }
  }

  const CostMatrix& m_;
  const CostStructure& s_;
  const int64_t node_limit_;
  const absl::Time deadline_;
  bool fix_first_ = false;
  bool reflect_ = false;
  std::vector<int> order_;
  std::vector<bool> used_;
  std::vector<int> best_;
  double best_cost_ = 0;
  int64_t nodes_ = 0;
  bool aborted_ = false;
};

std::vector<int> Identity(int n) {
  std::vector<int> o(n);
  std::iota(o.begin(), o.end(), 0);
  return o;
}

}  // namespace

absl::StatusOr<double> OrderCost(const CostMatrix& matrix, const std::vector<int>& order,
                                 const CostOptions& options) {
  PLEXUS_RETURN_IF_ERROR(matrix.Validate());
  PLEXUS_RETURN_IF_ERROR(CheckOrder(matrix, order));
  PLEXUS_ASSIGN_OR_RETURN(CostStructure s, internal::BuildCostStructure(matrix.n, options));
  return EvaluateOrder(s, matrix, order);
}

absl::StatusOr<ReorderResult> Reorder(const CostMatrix& matrix, const ReorderOptions& options) {
  PLEXUS_RETURN_IF_ERROR(matrix.Validate());
  PLEXUS_ASSIGN_OR_RETURN(CostStructure s, internal::BuildCostStructure(matrix.n, options.cost));
  const int n = matrix.n;
  const bool symmetric = Symmetric(matrix);
  const absl::Time deadline = absl::Now() + options.time_limit;
  ReorderResult result;
  result.order = Identity(n);
  result.identity_cost = EvaluateOrder(s, matrix, result.order);
  result.cost = result.identity_cost;

  int64_t moves = options.anneal_moves;
  if (moves <= 0) {
    moves = options.cost.model == CostModel::kRing ? std::max<int64_t>(200'000, int64_t{4000} * n)
                                                   : std::max<int64_t>(20'000, int64_t{100} * n);
  }
  Annealer annealer(matrix, s, options, symmetric);
  std::mt19937_64 rng(options.seed);
  const int runs = std::max(1, options.anneal_runs);
  for (int run = 0; run < runs && absl::Now() < deadline; ++run) {
    std::vector<int> order = Identity(n);
    std::shuffle(order.begin(), order.end(), rng);
    const double c = annealer.Run(&order, moves, &rng, deadline, &result.anneal_moves);
    if (c < result.cost) {
      result.cost = c;
      result.order = order;
    }
    if (options.progress) options.progress(static_cast<double>(run + 1) / runs, result.cost);
  }

  if (n <= options.exact_max_n) {
    BranchAndBound bb(matrix, s, options.cost, symmetric, options.exact_node_limit, deadline);
    result.proven_optimal = bb.Run(result.order, result.cost);
    result.exact_nodes = bb.nodes();
    if (bb.best_cost() < result.cost) {
      result.cost = bb.best_cost();
      result.order = bb.best();
    }
  }
  return result;
}

absl::StatusOr<ReorderResult> BruteForceReorder(const CostMatrix& matrix,
                                                const CostOptions& options) {
  PLEXUS_RETURN_IF_ERROR(matrix.Validate());
  if (matrix.n > 11) {
    return absl::InvalidArgumentError(
        absl::StrCat("brute force is limited to n <= 11 (", matrix.n, "! orders)"));
  }
  PLEXUS_ASSIGN_OR_RETURN(CostStructure s, internal::BuildCostStructure(matrix.n, options));
  std::vector<int> order = Identity(matrix.n);
  ReorderResult result;
  result.order = order;
  result.identity_cost = result.cost = EvaluateOrder(s, matrix, order);
  result.proven_optimal = true;
  while (std::next_permutation(order.begin(), order.end())) {
    const double c = EvaluateOrder(s, matrix, order);
    ++result.exact_nodes;
    if (c < result.cost) {
      result.cost = c;
      result.order = order;
    }
  }
  return result;
}

std::string FormatRankfile(const CostMatrix& matrix, const std::vector<int>& order) {
  std::string out;
  absl::flat_hash_map<std::string, int> slots;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string& host = matrix.labels[order[i]];
    absl::StrAppend(&out, "rank ", i, "=", host, " slot=", slots[host]++, "\n");
  }
  return out;
}

std::string FormatHostfile(const CostMatrix& matrix, const std::vector<int>& order) {
  std::string out;
  for (int node : order) absl::StrAppend(&out, matrix.labels[node], " slots=1\n");
  return out;
}

std::string FormatRankAssignment(const CostMatrix& matrix, const std::vector<int>& order) {
  std::vector<int> rank_of(order.size());
  for (size_t i = 0; i < order.size(); ++i) rank_of[order[i]] = static_cast<int>(i);
  std::string out;
  for (size_t node = 0; node < order.size(); ++node) {
    absl::StrAppend(&out, matrix.labels[node], " RANK=", rank_of[node], "\n");
  }
  return out;
}

}  // namespace plexus::netmodel
