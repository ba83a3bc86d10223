// Plan evaluation (the cost model every strategy and the simulator share) and plan JSON.
#include "plexus/placement/plan.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/placement/optimizer.hpp"

namespace plexus::placement {

using base::json::Invalid;
using base::json::Json;

namespace internal {

void SetProportionalShares(const Problem& problem, int op, int variant,
                           std::vector<WorkerShare>& workers) {
  double total = 0;
  for (const WorkerShare& w : workers) total += WorkerThroughput(problem, op, variant, w.worker);
  for (WorkerShare& w : workers) {
    w.share = total > 0 ? WorkerThroughput(problem, op, variant, w.worker) / total
                        : 1.0 / static_cast<double>(workers.size());
  }
}

void ApplyShareRule(const Problem& problem, Plan& plan) {
  for (size_t op = 0; op < plan.workers.size(); ++op) {
    std::vector<WorkerShare>& workers = plan.workers[op];
    if (workers.empty() || plan.variant[op] < 0) continue;
    const int variant = plan.variant[op];
    if (problem.options.share_rule == ShareRule::kProportional) {
      SetProportionalShares(problem, static_cast<int>(op), variant, workers);
      continue;
    }
    // The release's greedy picks the cheapest worker per request first (ties: the cheaper one),
    // gives every pick its full throughput and the last pick what is left of the rate.
    auto throughput = [&](const WorkerShare& w) {
      return WorkerThroughput(problem, static_cast<int>(op), variant, w.worker);
    };
    std::stable_sort(workers.begin(), workers.end(),
                     [&](const WorkerShare& a, const WorkerShare& b) {
                       const double pa = WorkerPrice(problem, a.worker);
                       const double pb = WorkerPrice(problem, b.worker);
                       const double ua = pa / throughput(a), ub = pb / throughput(b);
                       if (ua != ub) return ua < ub;
                       return pa < pb;
                     });
    const double rate = problem.rate[op];
    double left = rate;
    for (size_t i = 0; i < workers.size(); ++i) {
      const double served = i + 1 == workers.size() ? left : std::min(left, throughput(workers[i]));
      workers[i].share = rate > 0 ? served / rate : 0;
      left -= served;
    }
  }
}

}  // namespace internal

double EdgeNetworkCost(const Problem& problem, const Plan& plan, int edge) {
  const Edge& e = problem.edges[edge];
  const double kb_per_second = internal::EdgeKbPerSecond(problem, edge, plan.variant);
  std::vector<std::pair<internal::Position, double>> from;
  if (problem.operators[e.from].kind == OperatorKind::kSource) {
    from.push_back({internal::SourcePosition(problem, e.from), 1.0});
  } else {
    for (const WorkerShare& w : plan.workers[e.from]) {
      from.push_back({internal::WorkerPosition(problem, w.worker), w.share});
    }
  }
  double price = 0;
  for (const auto& [position, share] : from) {
    for (const WorkerShare& w : plan.workers[e.to]) {
      if (share <= 0 || w.share <= 0) continue;
      price += share * w.share *
               internal::PricePerGb(problem, position, internal::WorkerPosition(problem, w.worker));
    }
  }
  return kb_per_second * internal::HourlyGbPerKbPerSecond(problem) * price;
}

absl::Status EvaluatePlan(const Problem& problem, Plan& plan) {
  const size_t n = problem.operators.size();
  if (plan.variant.size() != n || plan.workers.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.variant.size(), " operators but the workflow has ", n));
  }
  for (size_t op = 0; op < n; ++op) {
    const Operator& o = problem.operators[op];
    const std::string at = absl::StrCat("plan operator '", o.name, "'");
    if (o.kind == OperatorKind::kSource) {
      if (!plan.workers[op].empty()) return Invalid(at, "a source is not placed on workers");
      plan.variant[op] = -1;
      continue;
    }
    if (plan.variant[op] < 0 || plan.variant[op] >= static_cast<int>(o.variants.size())) {
      return Invalid(at, "has no valid variant");
    }
    if (plan.workers[op].empty()) return Invalid(at, "has no workers");
    double total = 0;
    std::set<int> seen;
    for (const WorkerShare& w : plan.workers[op]) {
      if (w.worker < 0 || w.worker >= static_cast<int>(problem.workers.size())) {
        return Invalid(at, absl::StrCat("unknown worker index ", w.worker));
      }
      const Worker& worker = problem.workers[w.worker];
      if (!seen.insert(w.worker).second) {
        return Invalid(at, absl::StrCat("lists worker '", worker.name, "' twice"));
      }
      if (!(w.share >= 0) || w.share > 1 + 1e-9) {
        return Invalid(at, absl::StrCat("share of worker '", worker.name, "' must be in [0, 1]"));
      }
      if (!problem.latency[op][plan.variant[op]][worker.type].has_value()) {
        return Invalid(at, absl::StrCat("variant '", o.variants[plan.variant[op]],
                                        "' has no execution profile on worker '", worker.name,
                                        "' (type '", problem.worker_types[worker.type].name, "')"));
      }
      total += w.share;
    }
    if (std::abs(total - 1) > 1e-6) {
      return Invalid(at, absl::StrCat("worker shares sum to ", total, ", not 1"));
    }
  }
  // Data only flows to the same or a higher tier (A2).
  for (const Edge& edge : problem.edges) {
    for (const WorkerShare& to : plan.workers[edge.to]) {
      if (to.share <= 0) continue;
      const int to_tier = problem.workers[to.worker].tier;
      auto check = [&](int from_tier, const std::string& from_name) -> absl::Status {
        if (from_tier <= to_tier) return absl::OkStatus();
        return Invalid(
            absl::StrCat("plan edge ", problem.operators[edge.from].name, " -> ",
                         problem.operators[edge.to].name),
            absl::StrCat("sends data from ", from_name, " on tier '", problem.tiers[from_tier].name,
                         "' down to worker '", problem.workers[to.worker].name, "' on tier '",
                         problem.tiers[to_tier].name,
                         "': data only flows to the same or a higher tier"));
      };
      if (problem.operators[edge.from].kind == OperatorKind::kSource) {
        PLEXUS_RETURN_IF_ERROR(
            check(problem.operators[edge.from].source_tier,
                  absl::StrCat("source '", problem.operators[edge.from].name, "'")));
      } else {
        for (const WorkerShare& from : plan.workers[edge.from]) {
          if (from.share <= 0) continue;
          PLEXUS_RETURN_IF_ERROR(
              check(problem.workers[from.worker].tier,
                    absl::StrCat("worker '", problem.workers[from.worker].name, "'")));
        }
      }
    }
  }

  plan.worker_utilisation.assign(problem.workers.size(), 0);
  std::vector<bool> used(problem.workers.size(), false);
  for (size_t op = 0; op < n; ++op) {
    for (const WorkerShare& w : plan.workers[op]) {
      used[w.worker] = true;
      const double throughput =
          WorkerThroughput(problem, static_cast<int>(op), plan.variant[op], w.worker);
      plan.worker_utilisation[w.worker] += w.share * problem.rate[op] / throughput;
    }
  }
  plan.capacity_ok = true;
  plan.compute_cost = 0;
  for (size_t w = 0; w < problem.workers.size(); ++w) {
    if (used[w]) plan.compute_cost += WorkerPrice(problem, static_cast<int>(w));
    if (plan.worker_utilisation[w] > 1 + 1e-9) plan.capacity_ok = false;
  }
  plan.network_cost = 0;
  for (size_t e = 0; e < problem.edges.size(); ++e) {
    plan.network_cost += EdgeNetworkCost(problem, plan, static_cast<int>(e));
  }
  plan.total_cost = plan.compute_cost + plan.network_cost;
  plan.accuracy = EstimateAccuracy(problem, plan.variant);
  return absl::OkStatus();
}

std::string PlanToJson(const Problem& problem, const Plan& plan) {
  Json root;
  root["strategy"] = plan.strategy;
  Json operators = Json::array();
  for (int op : problem.topological_order) {
    const Operator& o = problem.operators[op];
    if (o.kind == OperatorKind::kSource) continue;
    Json workers = Json::array();
    for (const WorkerShare& w : plan.workers[op]) {
      const Worker& worker = problem.workers[w.worker];
      workers.push_back(
          {{"name", worker.name},
           {"share", w.share},
           {"tier", problem.tiers[worker.tier].name},
           {"location", worker.location},
           {"throughput", WorkerThroughput(problem, op, plan.variant[op], w.worker)}});
    }
    operators.push_back({{"name", o.name},
                         {"variant", o.variants[plan.variant[op]]},
                         {"rate", problem.rate[op]},
                         {"workers", workers}});
  }
  root["operators"] = operators;
  root["compute_cost"] = plan.compute_cost;
  root["network_cost"] = plan.network_cost;
  root["total_cost"] = plan.total_cost;
  root["accuracy"] = std::isfinite(plan.accuracy) ? Json(plan.accuracy) : Json(nullptr);
  root["accuracy_target"] = problem.objective.accuracy_target;
  root["capacity_ok"] = plan.capacity_ok;
  root["optimizer_ms"] = plan.optimizer_ms;
  if (plan.strategy == "lb") {
    root["proven_optimal"] = plan.proven_optimal;
    root["search_nodes"] = plan.search_nodes;
  }
  if (!plan.note.empty()) root["note"] = plan.note;
  return root.dump(1);
}

absl::StatusOr<Plan> ParsePlan(const Problem& problem, std::string_view json_text) {
  PLEXUS_ASSIGN_OR_RETURN(Json root, base::json::ParseJsonText(json_text, "plan"));
  if (!root.is_object()) return Invalid("plan", "expected a JSON object");
  Plan plan;
  plan.variant = internal::DefaultVariants(problem);
  for (int& v : plan.variant) v = v < 0 ? -1 : -2;  // -2: not listed yet
  plan.workers.assign(problem.operators.size(), {});
  PLEXUS_ASSIGN_OR_RETURN(plan.strategy,
                          base::json::StringField(root, "plan", "strategy", false, "?"));
  PLEXUS_ASSIGN_OR_RETURN(plan.optimizer_ms,
                          base::json::NumberField(root, "plan", "optimizer_ms", false, 0));
  PLEXUS_ASSIGN_OR_RETURN(plan.note, base::json::StringField(root, "plan", "note", false, ""));
  const Json* operators = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(operators, base::json::ArrayField(root, "plan", "operators", true));
  for (size_t i = 0; i < operators->size(); ++i) {
    const std::string at = base::json::Index("plan.operators", i);
    const Json& entry = (*operators)[i];
    if (!entry.is_object()) return Invalid(at, "expected an object");
    std::string name, variant;
    PLEXUS_ASSIGN_OR_RETURN(name, base::json::StringField(entry, at, "name", true));
    PLEXUS_ASSIGN_OR_RETURN(variant,
                            base::json::StringField(entry, at, "variant", false, "default"));
    const int op = problem.FindOperator(name);
    if (op < 0) {
      return Invalid(base::json::Child(at, "name"), absl::StrCat("unknown operator '", name, "'"));
    }
    if (problem.operators[op].kind == OperatorKind::kSource) {
      return Invalid(base::json::Child(at, "name"), absl::StrCat("'", name, "' is a source"));
    }
    if (plan.variant[op] != -2) {
      return Invalid(base::json::Child(at, "name"), absl::StrCat("'", name, "' listed twice"));
    }
    plan.variant[op] = problem.FindVariant(op, variant);
    if (plan.variant[op] < 0) {
      return Invalid(base::json::Child(at, "variant"),
                     absl::StrCat("operator '", name, "' has no variant '", variant, "'"));
    }
    const Json* workers = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(workers, base::json::ArrayField(entry, at, "workers", true));
    for (size_t k = 0; k < workers->size(); ++k) {
      const std::string wat = base::json::Index(base::json::Child(at, "workers"), k);
      const Json& item = (*workers)[k];
      if (!item.is_object()) return Invalid(wat, "expected an object");
      std::string worker;
      WorkerShare share;
      PLEXUS_ASSIGN_OR_RETURN(worker, base::json::StringField(item, wat, "name", true));
      PLEXUS_ASSIGN_OR_RETURN(share.share, base::json::NumberField(item, wat, "share", true));
      share.worker = problem.FindWorker(worker);
      if (share.worker < 0) {
        return Invalid(base::json::Child(wat, "name"),
                       absl::StrCat("unknown worker '", worker, "'"));
      }
      plan.workers[op].push_back(share);
    }
  }
  for (size_t op = 0; op < problem.operators.size(); ++op) {
    if (plan.variant[op] == -2) {
      return Invalid("plan.operators",
                     absl::StrCat("operator '", problem.operators[op].name, "' is missing"));
    }
  }
  PLEXUS_RETURN_IF_ERROR(EvaluatePlan(problem, plan));
  return plan;
}

absl::StatusOr<Plan> LoadPlan(const Problem& problem, const std::string& path) {
  PLEXUS_ASSIGN_OR_RETURN(std::string text, base::ReadFile(path));
  auto plan = ParsePlan(problem, text);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(path, ": ", std::string(plan.status().message())));
  }
  return plan;
}

std::string PlanSummary(const Problem& problem, const Plan& plan) {
  std::string out = absl::StrFormat(
      "plan '%s' for '%s': total %.3f/h (compute %.3f + network %.3f), accuracy %.4g "
      "(target %.4g), optimizer %.2f ms%s\n",
      plan.strategy, problem.name, plan.total_cost, plan.compute_cost, plan.network_cost,
      plan.accuracy, problem.objective.accuracy_target, plan.optimizer_ms,
      plan.strategy == "lb" ? (plan.proven_optimal ? ", proven optimal" : ", NOT proven optimal")
                            : "");
  if (!plan.capacity_ok) absl::StrAppend(&out, "  WARNING: over capacity (some worker > 100%)\n");
  if (problem.options.byte_units != ByteUnits::kDecimal ||
      problem.options.share_rule != ShareRule::kProportional) {
    absl::StrAppend(&out, "  cost model: ", std::string(ByteUnitsName(problem.options.byte_units)),
                    " byte units, ", std::string(ShareRuleName(problem.options.share_rule)),
                    " shares\n");
  }
  for (int op : problem.topological_order) {
    const Operator& o = problem.operators[op];
    if (o.kind == OperatorKind::kSource) continue;
    absl::StrAppendFormat(&out, "  %-20s %-30s %7.2f req/s on", o.name,
                          o.variants[plan.variant[op]], problem.rate[op]);
    for (const WorkerShare& w : plan.workers[op]) {
      const Worker& worker = problem.workers[w.worker];
      absl::StrAppendFormat(&out, " %s@%s(%.0f%%, util %.0f%%)", worker.name,
                            problem.tiers[worker.tier].name, 100 * w.share,
                            100 * plan.worker_utilisation[w.worker]);
    }
    absl::StrAppend(&out, "\n");
  }
  if (!plan.note.empty()) absl::StrAppend(&out, "  note: ", plan.note, "\n");
  return out;
}

}  // namespace plexus::placement
