// The JellyBean optimizer: model selection by beam search in reverse topological order, then
// worker assignment by the tiered greedy of the paper's Algorithm 1 (per-input cost, Eq. 5.2).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement::internal {
namespace {

struct Selection {
  std::vector<int> variant;
  std::vector<double> required;  // accuracy each ML operator must still reach
  double proxy = 0;
};

// Worker-agnostic cost proxy of running `op` with `variant`: its rate times its latency on the
// fastest worker type (busy milliseconds per second).
double ProxyCost(const Problem& problem, int op, int variant) {
  double fastest = kInfinity;
  for (size_t t = 0; t < problem.worker_types.size(); ++t) {
    const double latency = LatencyMs(problem, op, variant, static_cast<int>(t));
    if (latency > 0) fastest = std::min(fastest, latency);
  }
  return problem.rate[op] * fastest;
}

}  // namespace

std::vector<std::vector<int>> SelectModels(const Problem& problem, int beam_width) {
  const size_t n = problem.operators.size();
  Selection initial;
  initial.variant = DefaultVariants(problem);
  initial.required.assign(n, -kInfinity);
  initial.required[problem.objective.sink] = problem.objective.accuracy_target;
  std::vector<Selection> beam = {initial};
  for (auto it = problem.topological_order.rbegin(); it != problem.topological_order.rend(); ++it) {
    const int op = *it;
    const Operator& o = problem.operators[op];
    if (o.kind != OperatorKind::kMl) continue;
    std::vector<Selection> next;
    for (const Selection& state : beam) {
      const double required = state.required[op];
      for (size_t v = 0; v < o.variants.size(); ++v) {
        const auto& rows = o.accuracy_rows[v];
        const double proxy = ProxyCost(problem, op, static_cast<int>(v));
        for (size_t r = 0; r < rows.size(); ++r) {
          if (rows[r].output < required - 1e-9) continue;
          // Only the rows asking least of the inputs matter: skip a row that another qualifying
          // row dominates (inputs all <=; on equal inputs the earlier row wins).
          bool dominated = false;
          for (size_t s = 0; s < rows.size() && !dominated; ++s) {
            if (s == r || rows[s].output < required - 1e-9) continue;
            bool all_le = true, all_eq = true;
            for (size_t k = 0; k < rows[r].inputs.size(); ++k) {
              all_le = all_le && rows[s].inputs[k] <= rows[r].inputs[k];
              all_eq = all_eq && rows[s].inputs[k] == rows[r].inputs[k];
            }
            dominated = all_le && (!all_eq || s < r);
          }
          if (dominated) continue;
          Selection child = state;
          child.variant[op] = static_cast<int>(v);
          child.proxy += proxy;
          for (size_t k = 0; k < rows[r].inputs.size(); ++k) {
            double& need = child.required[o.accuracy_inputs[k]];
            need = std::max(need, rows[r].inputs[k]);
          }
          next.push_back(std::move(child));
        }
      }
    }
    // Cheapest proxy first; on ties the one asking least of the operators still to choose.
    std::stable_sort(next.begin(), next.end(), [](const Selection& a, const Selection& b) {
      if (a.proxy != b.proxy) return a.proxy < b.proxy;
      return a.required < b.required;
    });
    next.erase(std::unique(next.begin(), next.end(),
                           [](const Selection& a, const Selection& b) {
                             return a.variant == b.variant && a.required == b.required;
                           }),
               next.end());
    if (static_cast<int>(next.size()) > beam_width) next.resize(beam_width);
    beam = std::move(next);
    if (beam.empty()) break;
  }
  std::vector<std::vector<int>> result;
  for (const Selection& s : beam) {
    if (EstimateAccuracy(problem, s.variant) >= problem.objective.accuracy_target - 1e-9 &&
        std::find(result.begin(), result.end(), s.variant) == result.end()) {
      result.push_back(s.variant);
    }
  }
  return result;
}

std::vector<std::vector<int>> TopologicalOrders(const Problem& problem, int count) {
  std::vector<std::vector<int>> orders;
  std::vector<int> first;
  for (int op : problem.topological_order) {
    if (problem.operators[op].kind != OperatorKind::kSource) first.push_back(op);
  }
  orders.push_back(first);
  std::set<std::vector<int>> seen = {first};
  std::mt19937_64 random(0x6a656c6c79);
  const size_t n = problem.operators.size();
  for (int attempt = 0; attempt < 20 * count && static_cast<int>(orders.size()) < count;
       ++attempt) {
    std::vector<int> indegree(n, 0);
    for (const Edge& edge : problem.edges) ++indegree[edge.to];
    std::vector<int> ready, order;
    for (size_t op = 0; op < n; ++op) {
      if (indegree[op] == 0) ready.push_back(static_cast<int>(op));
    }
    while (!ready.empty()) {
      const size_t pick = std::uniform_int_distribution<size_t>(0, ready.size() - 1)(random);
      const int op = ready[pick];
      ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
      if (problem.operators[op].kind != OperatorKind::kSource) order.push_back(op);
      for (int e : problem.out_edges[op]) {
        if (--indegree[problem.edges[e].to] == 0) ready.push_back(problem.edges[e].to);
      }
    }
    if (seen.insert(order).second) orders.push_back(order);
  }
  return orders;
}

namespace {

struct Entry {
  std::vector<uint64_t> used;  // bitset over workers
  std::vector<std::vector<WorkerShare>> placed;
  std::vector<int> top_tier;  // highest tier among an operator's workers; -1: not placed
  double cost = 0;
};

struct Eligible {
  int worker;
  int tier;
  Position position;
  double throughput;
  double price;
};

bool IsUsed(const Entry& entry, int worker) {
  return (entry.used[static_cast<size_t>(worker) / 64] >> (worker % 64)) & 1;
}
void MarkUsed(Entry& entry, int worker) {
  entry.used[static_cast<size_t>(worker) / 64] |= uint64_t{1} << (worker % 64);
}

class Assigner {
 public:
  Assigner(const Problem& problem, const std::vector<int>& variant)
      : p_(problem), variant_(variant), eligible_(problem.operators.size()) {
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (p_.operators[op].kind == OperatorKind::kSource) continue;
      for (size_t w = 0; w < p_.workers.size(); ++w) {
        const double throughput =
            WorkerThroughput(p_, static_cast<int>(op), variant_[op], static_cast<int>(w));
        if (throughput <= 0) continue;
        eligible_[op].push_back({static_cast<int>(w), p_.workers[w].tier,
                                 WorkerPosition(p_, static_cast<int>(w)), throughput,
                                 WorkerPrice(p_, static_cast<int>(w))});
      }
    }
  }

  // Runs the beam over one topological order; false (with *failure) when no entry survives.
  bool Run(const std::vector<int>& order, int beam_width, Entry* best, std::string* failure) {
    Entry initial;
    initial.used.assign((p_.workers.size() + 63) / 64, 0);
    initial.placed.assign(p_.operators.size(), {});
    initial.top_tier.assign(p_.operators.size(), -1);
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (p_.operators[op].kind == OperatorKind::kSource) {
        initial.top_tier[op] = p_.operators[op].source_tier;
      }
    }
    std::vector<Entry> beam = {std::move(initial)};
    for (int op : order) {
      std::vector<Entry> next;
      for (const Entry& entry : beam) Expand(entry, op, next);
      if (next.empty()) {
        double capacity = 0;
        for (const Eligible& e : eligible_[op]) capacity += e.throughput;
        *failure = absl::StrFormat(
            "infeasible: no assignment covers operator '%s' (variant '%s') at %.4g req/s with "
            "the workers left after placing its parents, on their tiers or higher; all the "
            "workers able to run it offer %.4g req/s in total",
            p_.operators[op].name, p_.operators[op].variants[variant_[op]], p_.rate[op], capacity);
        return false;
      }
      std::stable_sort(next.begin(), next.end(),
                       [](const Entry& a, const Entry& b) { return a.cost < b.cost; });
      next.erase(std::unique(next.begin(), next.end(),
                             [](const Entry& a, const Entry& b) {
                               return a.used == b.used && std::abs(a.cost - b.cost) <= 1e-12;
                             }),
                 next.end());
      if (static_cast<int>(next.size()) > beam_width) next.resize(beam_width);
      beam = std::move(next);
    }
    *best = std::move(beam.front());
    return true;
  }

 private:
  void Expand(const Entry& entry, int op, std::vector<Entry>& out) {
    int lowest_tier = 0;
    for (int e : p_.in_edges[op]) {
      lowest_tier = std::max(lowest_tier, entry.top_tier[p_.edges[e].from]);
    }
    // Per-input network cost of each candidate worker (Eq. 5.2): traffic from the parents'
    // already placed workers, weighted by their shares, per request of this operator.
    pool_.clear();
    net_.clear();
    for (const Eligible& e : eligible_[op]) {
      if (e.tier < lowest_tier || IsUsed(entry, e.worker)) continue;
      const double net = InputNetworkCost(p_, op, variant_, e.position, [&](int parent_op) {
        double price = 0;
        for (const WorkerShare& parent : entry.placed[parent_op]) {
          price += parent.share * PricePerGb(p_, WorkerPosition(p_, parent.worker), e.position);
        }
        return price;
      });
      pool_.push_back(&e);
      net_.push_back(net);
    }
    // One candidate per tier pool [lowest_tier, top]; a tier adding no worker repeats the last.
    for (int top = lowest_tier; top < static_cast<int>(p_.tiers.size()); ++top) {
      bool grows = top == lowest_tier;
      for (const Eligible* e : pool_) grows = grows || e->tier == top;
      if (!grows) continue;
      Greedy(entry, op, top, /*remainder_aware=*/true, out);
      Greedy(entry, op, top, /*remainder_aware=*/false, out);
    }
  }

  void Greedy(const Entry& entry, int op, int top, bool remainder_aware, std::vector<Entry>& out) {
    const double rate = p_.rate[op];
    taken_.assign(pool_.size(), false);
    chosen_.clear();
    double remaining = rate;
    while (remaining > rate * 1e-9) {
      int best = -1;
      double best_cost = kInfinity;
      for (size_t i = 0; i < pool_.size(); ++i) {
        if (taken_[i] || pool_[i]->tier > top) continue;
        // Per-input cost (Eq. 5.2). Remainder-aware, a worker that would be only partly used
        // pays its full price for the part it serves (docs/placement.md).
        const double served =
            remainder_aware ? std::min(pool_[i]->throughput, remaining) : pool_[i]->throughput;
        const double cost = pool_[i]->price / served + net_[i];
        if (cost < best_cost - 1e-15 || (best >= 0 && std::abs(cost - best_cost) <= 1e-15 &&
                                         pool_[i]->throughput > pool_[best]->throughput)) {
          best = static_cast<int>(i);
          best_cost = cost;
        }
      }
      if (best < 0) return;  // the pool cannot cover the rate
      taken_[best] = true;
      chosen_.push_back(best);
      remaining -= pool_[best]->throughput;
    }
    double capacity = 0;
    for (int i : chosen_) capacity += pool_[i]->throughput;
    Prune(rate, capacity);
    Emit(entry, op, chosen_, capacity, out);
    // A second candidate: the single worker of the pool that serves the whole rate cheapest, when
    // one exists (the greedy's small first picks can crowd it out).
    int single = -1;
    double single_cost = kInfinity;
    for (size_t i = 0; i < pool_.size(); ++i) {
      if (pool_[i]->tier > top || pool_[i]->throughput < rate * (1 - 1e-9)) continue;
      const double cost = pool_[i]->price + rate * net_[i];
      if (cost < single_cost) {
        single_cost = cost;
        single = static_cast<int>(i);
      }
    }
    if (remainder_aware && single >= 0 && !(chosen_.size() == 1 && chosen_[0] == single)) {
      Emit(entry, op, {single}, pool_[single]->throughput, out);
    }
  }

  // The operator's cost (compute + network) for a set of pool workers with proportional shares.
  double SetCost(const std::vector<int>& set, double rate) const {
    double capacity = 0, price = 0, weighted = 0;
    for (int i : set) {
      capacity += pool_[i]->throughput;
      price += pool_[i]->price;
      weighted += pool_[i]->throughput * net_[i];
    }
    return price + rate * weighted / capacity;
  }

  // Drops workers that a later, larger pick made redundant, the biggest saving first, while the
  // rest still cover the rate and the operator gets cheaper.
  void Prune(double rate, double& capacity) {
    bool dropped = true;
    while (dropped && chosen_.size() > 1) {
      dropped = false;
      const double current = SetCost(chosen_, rate);
      int best = -1;
      double best_cost = current;
      for (size_t k = 0; k < chosen_.size(); ++k) {
        if (capacity - pool_[chosen_[k]]->throughput < rate * (1 - 1e-9)) continue;
        std::vector<int> rest = chosen_;
        rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(k));
        const double cost = SetCost(rest, rate);
        if (cost < best_cost - 1e-12) {
          best_cost = cost;
          best = static_cast<int>(k);
        }
      }
      if (best >= 0) {
        capacity -= pool_[chosen_[best]]->throughput;
        chosen_.erase(chosen_.begin() + best);
        dropped = true;
      }
    }
  }

  void Emit(const Entry& entry, int op, const std::vector<int>& chosen, double capacity,
            std::vector<Entry>& out) {
    const double rate = p_.rate[op];
    Entry child = entry;
    double added = 0;
    int top_tier = 0;
    for (int i : chosen) {
      const double share = pool_[i]->throughput / capacity;
      added += pool_[i]->price + share * rate * net_[i];
      child.placed[op].push_back({pool_[i]->worker, share});
      MarkUsed(child, pool_[i]->worker);
      top_tier = std::max(top_tier, pool_[i]->tier);
    }
    child.top_tier[op] = top_tier;
    child.cost += added;
    out.push_back(std::move(child));
  }

  const Problem& p_;
  const std::vector<int>& variant_;
  std::vector<std::vector<Eligible>> eligible_;
  std::vector<const Eligible*> pool_;
  std::vector<double> net_;
  std::vector<bool> taken_;
  std::vector<int> chosen_;
};

}  // namespace

absl::StatusOr<Plan> RunJellyBean(const Problem& problem) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> selections =
      SelectModels(problem, problem.options.model_selection_beam);
  if (selections.empty()) return UnreachableAccuracyError(problem);
  const std::vector<std::vector<int>> orders =
      TopologicalOrders(problem, problem.options.topological_orders);

  bool found = false;
  Plan best;
  double best_accuracy = -kInfinity;
  std::string failure;
  for (const std::vector<int>& variant : selections) {
    Assigner assigner(problem, variant);
    const double accuracy = EstimateAccuracy(problem, variant);
    for (const std::vector<int>& order : orders) {
      Entry entry;
      std::string why;
      if (!assigner.Run(order, problem.options.worker_assignment_beam, &entry, &why)) {
        if (failure.empty()) failure = why;
        continue;
      }
      const bool better = !found || entry.cost < best.total_cost - 1e-9 ||
                          (entry.cost <= best.total_cost + 1e-9 && accuracy > best_accuracy);
      if (better) {
        found = true;
        best.variant = variant;
        best.workers = std::move(entry.placed);
        best.total_cost = entry.cost;
        best_accuracy = accuracy;
      }
    }
  }
  if (!found) return absl::FailedPreconditionError(failure);
  best.strategy = "jb";
  PLEXUS_RETURN_IF_ERROR(EvaluatePlan(problem, best));
  best.optimizer_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return best;
}

}  // namespace plexus::placement::internal
