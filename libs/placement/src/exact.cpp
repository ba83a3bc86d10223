// `lb`: the exact optimum under JellyBean's rules by branch-and-bound over variant combinations
// and worker assignments, with a node and time limit after which it is not proven optimal.
//
// Search space: every combination of variants meeting the accuracy target; per operator, in a
// topological order, any set of unused workers on tiers at or above its parents' workers that
// covers its rate (minimal or not), shares proportional to throughput. Identical workers (same
// type, tier and location) are interchangeable, so a set is a count per worker class.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement::internal {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkerClass {
  std::vector<int> workers;
  int type = 0;
  int tier = 0;
  Position position;
  double price = 0;
};

struct Option {  // one class available to the operator being placed
  int cls;
  double throughput;
  double price;
  double net;  // network cost per unit of the operator's rate served by this class
  int limit;   // workers of this class still available
};

class ExactSearch {
 public:
  ExactSearch(const Problem& problem, const ProgressFn& progress)
      : p_(problem), progress_(progress) {
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      const Position pos = WorkerPosition(p_, static_cast<int>(w));
      const int type = p_.workers[w].type;
      auto it = std::find_if(classes_.begin(), classes_.end(), [&](const WorkerClass& c) {
        return c.type == type && c.tier == pos.tier && c.position.location == pos.location;
      });
      if (it == classes_.end()) {
        classes_.push_back({{}, type, pos.tier, pos, WorkerPrice(p_, static_cast<int>(w))});
        it = classes_.end() - 1;
      }
      it->workers.push_back(static_cast<int>(w));
    }
    for (int op : p_.topological_order) {
      if (p_.operators[op].kind != OperatorKind::kSource) order_.push_back(op);
    }
  }

  absl::StatusOr<Plan> Run() {
    start_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(p_.options.lb_time_limit_s));
    last_progress_ = start_;
    // The JellyBean plan is the first incumbent: it only tightens the bound, never the optimum.
    auto jb = RunJellyBean(p_);
    if (jb.ok()) {
      best_cost_ = jb->total_cost;
      best_accuracy_ = jb->accuracy;
      best_plan_ = *jb;
      have_best_ = true;
    }
    std::vector<std::vector<int>> combos = VariantCombinations();
    if (combos.empty()) return UnreachableAccuracyError(p_);
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t i = 0; i < combos.size(); ++i) {
      SetVariant(combos[i]);
      if (combo_feasible_) ranked.push_back({rest_lb_[0], i});
    }
    std::stable_sort(ranked.begin(), ranked.end());
    for (size_t r = 0; r < ranked.size() && !aborted_; ++r) {
      combo_index_ = r;
      combo_count_ = ranked.size();
      if (have_best_ && ranked[r].first >= Threshold()) continue;
      SetVariant(combos[ranked[r].second]);
      accuracy_ = EstimateAccuracy(p_, variant_);
      used_.assign(classes_.size(), 0);
      counts_.assign(p_.operators.size(), std::vector<int>(classes_.size(), 0));
      top_tier_.assign(p_.operators.size(), -1);
      for (size_t op = 0; op < p_.operators.size(); ++op) {
        if (p_.operators[op].kind == OperatorKind::kSource) {
          top_tier_[op] = p_.operators[op].source_tier;
        }
      }
      PlaceOperator(0, 0);
    }
    if (!have_best_) {
      if (aborted_) {
        return absl::DeadlineExceededError(absl::StrCat(
            "lb found no plan within its limits (", p_.options.lb_time_limit_s, " s, ",
            p_.options.lb_node_limit, " nodes): raise options.lb_time_limit_s/lb_node_limit"));
      }
      return absl::FailedPreconditionError(
          "infeasible: no combination of variants meeting the accuracy target has enough "
          "workers on the allowed tiers to cover every operator's rate");
    }
    Plan plan = best_plan_;
    plan.strategy = "lb";
    plan.note.clear();
    PLEXUS_RETURN_IF_ERROR(EvaluatePlan(p_, plan));
    plan.proven_optimal = !aborted_;
    plan.search_nodes = nodes_;
    if (aborted_) {
      plan.note = absl::StrFormat(
          "search stopped at its limit (%s): best plan found, not proven "
          "optimal",
          abort_reason_);
    }
    plan.optimizer_ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
    return plan;
  }

 private:
  double Threshold() const { return best_cost_ - 1e-9 * std::max(1.0, std::abs(best_cost_)); }

  std::vector<std::vector<int>> VariantCombinations() const {
    std::vector<int> ml;
    for (int op : p_.topological_order) {
      if (p_.operators[op].kind == OperatorKind::kMl) ml.push_back(op);
    }
    std::vector<std::vector<int>> result;
    std::vector<int> variant = DefaultVariants(p_);
    // Odometer over the ML operators' variants.
    while (true) {
      if (EstimateAccuracy(p_, variant) >= p_.objective.accuracy_target - 1e-9) {
        result.push_back(variant);
      }
      size_t k = 0;
      while (k < ml.size()) {
        if (++variant[ml[k]] < static_cast<int>(p_.operators[ml[k]].variants.size())) break;
        variant[ml[k]] = 0;
        ++k;
      }
      if (k == ml.size()) break;
    }
    return result;
  }

  // Prepares per-class throughputs and the compute lower bound of every suffix of the order.
  void SetVariant(const std::vector<int>& variant) {
    variant_ = variant;
    throughput_.assign(p_.operators.size(), std::vector<double>(classes_.size(), 0));
    rest_lb_.assign(order_.size() + 1, 0);
    combo_feasible_ = true;
    std::vector<double> op_lb(order_.size(), 0);
    for (size_t i = 0; i < order_.size(); ++i) {
      const int op = order_[i];
      std::vector<std::pair<double, double>> items;  // (unit price, capacity)
      for (size_t c = 0; c < classes_.size(); ++c) {
        const double latency = LatencyMs(p_, op, variant_[op], classes_[c].type);
        if (latency <= 0) continue;
        const Tier& tier = p_.tiers[classes_[c].tier];
        const double t = 1000.0 / latency * (tier.replicated ? tier.locations : 1);
        throughput_[op][c] = t;
        items.push_back(
            {classes_[c].price / t, t * static_cast<double>(classes_[c].workers.size())});
      }
      std::sort(items.begin(), items.end());
      double need = p_.rate[op];
      for (const auto& [unit, capacity] : items) {
        const double take = std::min(need, capacity);
        op_lb[i] += take * unit;
        need -= take;
        if (need <= 0) break;
      }
      if (need > 1e-9 * p_.rate[op]) combo_feasible_ = false;
    }
    for (size_t i = order_.size(); i-- > 0;) rest_lb_[i] = rest_lb_[i + 1] + op_lb[i];
  }

  bool OutOfBudget() {
    ++nodes_;
    if (nodes_ >= p_.options.lb_node_limit) {
      aborted_ = true;
      abort_reason_ = absl::StrCat(p_.options.lb_node_limit, " nodes");
    }
    if ((nodes_ & 1023) == 0) {
      const auto now = Clock::now();
      if (now >= deadline_) {
        aborted_ = true;
        abort_reason_ = absl::StrCat(p_.options.lb_time_limit_s, " s");
      }
      if (progress_ && now - last_progress_ > std::chrono::seconds(1)) {
        last_progress_ = now;
        progress_(absl::StrFormat("lb: variant combination %d/%d, %d nodes, best %.4f/h",
                                  combo_index_ + 1, combo_count_, nodes_,
                                  have_best_ ? best_cost_ : kInfinity));
      }
    }
    return aborted_;
  }

  void PlaceOperator(size_t index, double cost_so_far) {
    if (index == order_.size()) {
      Record(cost_so_far);
      return;
    }
    const int op = order_[index];
    int lowest_tier = 0;
    for (int e : p_.in_edges[op]) lowest_tier = std::max(lowest_tier, top_tier_[p_.edges[e].from]);
    std::vector<Option> options;
    for (size_t c = 0; c < classes_.size(); ++c) {
      const int available = static_cast<int>(classes_[c].workers.size()) - used_[c];
      if (throughput_[op][c] <= 0 || classes_[c].tier < lowest_tier || available <= 0) continue;
      // A parent's classes share its traffic in proportion to their throughput.
      const double net =
          InputNetworkCost(p_, op, variant_, classes_[c].position, [&](int parent_op) {
            double total = 0;
            for (size_t pc = 0; pc < classes_.size(); ++pc) {
              total += counts_[parent_op][pc] * throughput_[parent_op][pc];
            }
            double price = 0;
            for (size_t pc = 0; pc < classes_.size(); ++pc) {
              if (counts_[parent_op][pc] == 0) continue;
              price += counts_[parent_op][pc] * throughput_[parent_op][pc] / total *
                       PricePerGb(p_, classes_[pc].position, classes_[c].position);
            }
            return price;
          });
      options.push_back(
          {static_cast<int>(c), throughput_[op][c], classes_[c].price, net, available});
    }
    std::sort(options.begin(), options.end(), [](const Option& a, const Option& b) {
      return a.price / a.throughput + a.net < b.price / b.throughput + b.net;
    });
    chosen_.assign(options.size(), 0);
    Branch(index, op, options, 0, cost_so_far, 0, 0, 0);
  }

  // Lower bound of the operator's cost: prices of the chosen workers plus the cheapest fractional
  // way to serve the rate, chosen workers costing only their network, undecided ones their
  // per-input price plus network (an LP relaxation of the proportional-share cost).
  double OperatorBound(const std::vector<Option>& options, size_t next, double chosen_price,
                       double rate) {
    items_.clear();
    for (size_t i = 0; i < options.size(); ++i) {
      if (i < next) {
        if (chosen_[i] > 0) items_.push_back({options[i].net, chosen_[i] * options[i].throughput});
      } else {
        items_.push_back({options[i].price / options[i].throughput + options[i].net,
                          options[i].limit * options[i].throughput});
      }
    }
    std::sort(items_.begin(), items_.end());
    double need = rate, cost = chosen_price;
    for (const auto& [unit, capacity] : items_) {
      const double take = std::min(need, capacity);
      cost += take * unit;
      need -= take;
      if (need <= 0) return cost;
    }
    return need > 1e-9 * rate ? kInfinity : cost;
  }

  void Branch(size_t index, int op, const std::vector<Option>& options, size_t next,
              double cost_so_far, double chosen_price, double capacity, double weighted_net) {
    if (OutOfBudget()) return;
    const double rate = p_.rate[op];
    const double bound =
        cost_so_far + OperatorBound(options, next, chosen_price, rate) + rest_lb_[index + 1];
    if (have_best_ && bound >= Threshold()) return;
    if (bound == kInfinity) return;
    if (next == options.size()) {
      if (capacity < rate * (1 - 1e-9)) return;
      const double op_cost = chosen_price + rate * weighted_net / capacity;
      int top = 0;
      for (size_t i = 0; i < options.size(); ++i) {
        if (chosen_[i] == 0) continue;
        counts_[op][options[i].cls] = chosen_[i];
        used_[options[i].cls] += chosen_[i];
        top = std::max(top, classes_[options[i].cls].tier);
      }
      top_tier_[op] = top;
      const std::vector<int> saved = chosen_;
      PlaceOperator(index + 1, cost_so_far + op_cost);
      chosen_ = saved;
      top_tier_[op] = -1;
      for (size_t i = 0; i < options.size(); ++i) {
        if (chosen_[i] == 0) continue;
        counts_[op][options[i].cls] = 0;
        used_[options[i].cls] -= chosen_[i];
      }
      return;
    }
    const Option& o = options[next];
    for (int n = o.limit; n >= 0 && !aborted_; --n) {
      chosen_[next] = n;
      Branch(index, op, options, next + 1, cost_so_far, chosen_price + n * o.price,
             capacity + n * o.throughput, weighted_net + n * o.throughput * o.net);
    }
    chosen_[next] = 0;
  }

  void Record(double cost) {
    const bool better =
        !have_best_ || cost < Threshold() ||
        (cost <= best_cost_ + 1e-9 * std::max(1.0, best_cost_) && accuracy_ > best_accuracy_);
    if (!better) return;
    have_best_ = true;
    best_cost_ = cost;
    best_accuracy_ = accuracy_;
    Plan plan;
    plan.variant = variant_;
    plan.workers.assign(p_.operators.size(), {});
    std::vector<int> next_worker(classes_.size(), 0);
    for (int op : order_) {
      for (size_t c = 0; c < classes_.size(); ++c) {
        for (int k = 0; k < counts_[op][c]; ++k) {
          plan.workers[op].push_back({classes_[c].workers[next_worker[c]++], 0});
        }
      }
      SetProportionalShares(p_, op, variant_[op], plan.workers[op]);
    }
    best_plan_ = std::move(plan);
  }

  const Problem& p_;
  const ProgressFn& progress_;
  std::vector<WorkerClass> classes_;
  std::vector<int> order_;

  std::vector<int> variant_;
  double accuracy_ = 0;
  bool combo_feasible_ = true;
  std::vector<std::vector<double>> throughput_;  // [op][class]
  std::vector<double> rest_lb_;
  std::vector<int> used_;
  std::vector<std::vector<int>> counts_;
  std::vector<int> top_tier_;
  std::vector<int> chosen_;
  std::vector<std::pair<double, double>> items_;

  bool have_best_ = false;
  double best_cost_ = kInfinity;
  double best_accuracy_ = -kInfinity;
  Plan best_plan_;

  int64_t nodes_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  Clock::time_point start_, deadline_, last_progress_;
  size_t combo_index_ = 0, combo_count_ = 0;
};

}  // namespace

absl::StatusOr<Plan> RunExact(const Problem& problem, const ProgressFn& progress) {
  return ExactSearch(problem, progress).Run();
}

}  // namespace plexus::placement::internal
