// The accuracy and execution profiles, the objective and the options of the placement input.
#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "problem_parse.hpp"

namespace plexus::placement::internal {

namespace {

// The ML operators whose accuracy reaches `op` directly or through relational operators.
std::set<int> NearestMlInputs(int op, const Problem& p) {
  std::set<int> result;
  for (int e : p.in_edges[op]) {
    const int parent = p.edges[e].from;
    if (p.operators[parent].kind == OperatorKind::kMl) {
      result.insert(parent);
    } else if (p.operators[parent].kind == OperatorKind::kRelational) {
      std::set<int> more = NearestMlInputs(parent, p);
      result.insert(more.begin(), more.end());
    }
  }
  return result;
}

}  // namespace

absl::Status ParseAccuracyProfiles(const Json& root, Problem& p) {
  const std::string path = "accuracy_profiles";
  const Json* profiles = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(profiles, ArrayField(root, "", "accuracy_profiles", true));
  std::vector<bool> has_profile(p.operators.size(), false);
  for (size_t i = 0; i < profiles->size(); ++i) {
    const std::string at = Index(path, i);
    const Json& entry = (*profiles)[i];
    if (!entry.is_object()) return Invalid(at, "expected an object");
    PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"operator", "inputs", "variants"}));
    std::string name;
    PLEXUS_ASSIGN_OR_RETURN(name, StringField(entry, at, "operator", true));
    const int op = p.FindOperator(name);
    if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name, p));
    Operator& target = p.operators[op];
    if (target.kind != OperatorKind::kMl) {
      return Invalid(Child(at, "operator"),
                     absl::StrCat("'", name,
                                  "' is not an ML operator: only ML operators have accuracy "
                                  "profiles"));
    }
    if (has_profile[op]) {
      return Invalid(Child(at, "operator"), absl::StrCat("second profile for '", name, "'"));
    }
    has_profile[op] = true;
    const Json* inputs = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(inputs, ArrayField(entry, at, "inputs", false));
    if (inputs != nullptr) {
      for (size_t k = 0; k < inputs->size(); ++k) {
        const std::string kat = Index(Child(at, "inputs"), k);
        if (!(*inputs)[k].is_string()) return Invalid(kat, "expected an operator name");
        const std::string input = (*inputs)[k].get<std::string>();
        const int input_op = p.FindOperator(input);
        if (input_op < 0) return Invalid(kat, UnknownOperator(input, p));
        if (std::find(target.accuracy_inputs.begin(), target.accuracy_inputs.end(), input_op) !=
            target.accuracy_inputs.end()) {
          return Invalid(kat, absl::StrCat("'", input, "' listed twice"));
        }
        target.accuracy_inputs.push_back(input_op);
      }
    }
    const std::set<int> expected = NearestMlInputs(op, p);
    const std::set<int> listed(target.accuracy_inputs.begin(), target.accuracy_inputs.end());
    if (expected != listed) {
      std::vector<std::string> names;
      for (int e : expected) names.push_back(p.operators[e].name);
      return Invalid(Child(at, "inputs"), absl::StrCat("must list the ML operators feeding '", name,
                                                       "': [", absl::StrJoin(names, ", "), "]"));
    }
    const Json* variants = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(variants, ObjectField(entry, at, "variants", true));
    target.accuracy_rows.assign(target.variants.size(), {});
    for (auto it = variants->begin(); it != variants->end(); ++it) {
      const std::string vat = Child(Child(at, "variants"), it.key());
      const int v = p.FindVariant(op, it.key());
      if (v < 0) {
        return Invalid(vat, absl::StrCat("operator '", name, "' has no variant '", it.key(), "'"));
      }
      if (!it.value().is_array()) return Invalid(vat, "expected an array of rows");
      for (size_t r = 0; r < it.value().size(); ++r) {
        const std::string rat = Index(vat, r);
        const Json& row_json = it.value()[r];
        if (!row_json.is_object()) return Invalid(rat, "expected {\"in\": [...], \"out\": x}");
        PLEXUS_RETURN_IF_ERROR(CheckKeys(row_json, rat, {"in", "out"}));
        AccuracyRow row;
        PLEXUS_ASSIGN_OR_RETURN(row.output, NumberField(row_json, rat, "out", true));
        const Json* in = nullptr;
        PLEXUS_ASSIGN_OR_RETURN(in, ArrayField(row_json, rat, "in", false));
        if (in != nullptr) {
          for (const Json& value : *in) {
            if (!value.is_number()) return Invalid(Child(rat, "in"), "expected numbers");
            row.inputs.push_back(value.get<double>());
          }
        }
        if (row.inputs.size() != target.accuracy_inputs.size()) {
          return Invalid(Child(rat, "in"),
                         absl::StrCat("has ", row.inputs.size(), " accuracies but '", name,
                                      "' has ", target.accuracy_inputs.size(), " ML inputs"));
        }
        target.accuracy_rows[v].push_back(std::move(row));
      }
    }
    for (size_t v = 0; v < target.variants.size(); ++v) {
      if (target.accuracy_rows[v].empty()) {
        return Invalid(Child(at, "variants"),
                       absl::StrCat("variant '", target.variants[v], "' of '", name,
                                    "' has no accuracy rows"));
      }
    }
  }
  for (size_t op = 0; op < p.operators.size(); ++op) {
    if (p.operators[op].kind == OperatorKind::kMl && !has_profile[op]) {
      return Invalid(
          path, absl::StrCat("ML operator '", p.operators[op].name, "' has no accuracy profile"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseExecutionProfiles(const Json& root, Problem& p) {
  const std::string path = "execution_profiles";
  const Json* profiles = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(profiles, ArrayField(root, "", "execution_profiles", true));
  p.latency.assign(p.operators.size(), {});
  for (size_t op = 0; op < p.operators.size(); ++op) {
    p.latency[op].assign(p.operators[op].variants.size(),
                         std::vector<std::optional<LatencyProfile>>(p.worker_types.size()));
  }
  for (size_t i = 0; i < profiles->size(); ++i) {
    const std::string at = Index(path, i);
    const Json& entry = (*profiles)[i];
    if (!entry.is_object()) return Invalid(at, "expected an object");
    PLEXUS_RETURN_IF_ERROR(
        CheckKeys(entry, at, {"operator", "variant", "worker_type", "p50", "p75", "p90"}));
    std::string name, variant, type;
    PLEXUS_ASSIGN_OR_RETURN(name, StringField(entry, at, "operator", true));
    PLEXUS_ASSIGN_OR_RETURN(variant, StringField(entry, at, "variant", false, "default"));
    PLEXUS_ASSIGN_OR_RETURN(type, StringField(entry, at, "worker_type", true));
    const int op = p.FindOperator(name);
    if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name, p));
    if (p.operators[op].kind == OperatorKind::kSource) {
      return Invalid(Child(at, "operator"),
                     absl::StrCat("'", name, "' is a source: it does not run on workers"));
    }
    const int v = p.FindVariant(op, variant);
    if (v < 0) {
      return Invalid(Child(at, "variant"),
                     absl::StrCat("operator '", name, "' has no variant '", variant, "'"));
    }
    const int t = FindType(type, p);
    if (t < 0) {
      return Invalid(Child(at, "worker_type"), absl::StrCat("unknown worker type '", type, "'"));
    }
    LatencyProfile profile;
    PLEXUS_ASSIGN_OR_RETURN(profile.p50, NumberField(entry, at, "p50", true));
    PLEXUS_ASSIGN_OR_RETURN(profile.p75, NumberField(entry, at, "p75", false, -1));
    PLEXUS_ASSIGN_OR_RETURN(profile.p90, NumberField(entry, at, "p90", false, -1));
    if (!entry.contains("p75")) profile.p75 = profile.p50;
    if (!entry.contains("p90")) profile.p90 = profile.p75;
    if (!(profile.p50 > 0)) return Invalid(Child(at, "p50"), "latency must be > 0 ms");
    if (profile.p75 < profile.p50 || profile.p90 < profile.p75) {
      return Invalid(at, "percentiles must not decrease (p50 <= p75 <= p90)");
    }
    auto& slot = p.latency[op][v][t];
    if (slot.has_value()) {
      return Invalid(at,
                     absl::StrCat("duplicate profile for (", name, ", ", variant, ", ", type, ")"));
    }
    slot = profile;
  }
  for (size_t op = 0; op < p.operators.size(); ++op) {
    for (size_t v = 0; v < p.operators[op].variants.size(); ++v) {
      bool any = false;
      for (const auto& slot : p.latency[op][v]) any = any || slot.has_value();
      if (!any) {
        return Invalid(path, absl::StrCat("variant '", p.operators[op].variants[v],
                                          "' of operator '", p.operators[op].name,
                                          "' has no execution profile on any worker type"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseObjective(const Json& root, Problem& p) {
  const std::string path = "objective";
  const Json* objective = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(objective, ObjectField(root, "", "objective", true));
  PLEXUS_RETURN_IF_ERROR(CheckKeys(*objective, path, {"accuracy_target", "input_rate", "sink"}));
  PLEXUS_ASSIGN_OR_RETURN(p.objective.accuracy_target,
                          NumberField(*objective, path, "accuracy_target", true));
  bool every_source_has_rate = true;
  for (const Operator& op : p.operators) {
    if (op.kind == OperatorKind::kSource && op.source_rate <= 0) every_source_has_rate = false;
  }
  PLEXUS_ASSIGN_OR_RETURN(p.objective.input_rate,
                          NumberField(*objective, path, "input_rate", !every_source_has_rate, 0));
  if (objective->contains("input_rate") && !(p.objective.input_rate > 0)) {
    return Invalid(Child(path, "input_rate"), "must be > 0 requests per second");
  }
  std::string sink;
  PLEXUS_ASSIGN_OR_RETURN(sink, StringField(*objective, path, "sink", false));
  if (!sink.empty()) {
    p.objective.sink = p.FindOperator(sink);
    if (p.objective.sink < 0) return Invalid(Child(path, "sink"), UnknownOperator(sink, p));
    if (p.operators[p.objective.sink].kind != OperatorKind::kMl) {
      return Invalid(Child(path, "sink"), absl::StrCat("'", sink, "' is not an ML operator"));
    }
    return absl::OkStatus();
  }
  // Default: the one ML operator whose accuracy no other ML operator uses.
  std::vector<int> candidates;
  for (size_t op = 0; op < p.operators.size(); ++op) {
    if (p.operators[op].kind != OperatorKind::kMl) continue;
    bool feeds_ml = false;
    for (const Operator& other : p.operators) {
      for (int input : other.accuracy_inputs) {
        feeds_ml = feeds_ml || input == static_cast<int>(op);
      }
    }
    if (!feeds_ml) candidates.push_back(static_cast<int>(op));
  }
  if (candidates.size() != 1) {
    return Invalid(Child(path, "sink"),
                   absl::StrCat("required: the workflow has ", candidates.size(),
                                " ML operators whose accuracy no other ML operator uses"));
  }
  p.objective.sink = candidates[0];
  return absl::OkStatus();
}

absl::Status ParseOptions(const Json& root, Problem& p) {
  const std::string path = "options";
  const Json* options = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(options, ObjectField(root, "", "options", false));
  if (options == nullptr) return absl::OkStatus();
  PLEXUS_RETURN_IF_ERROR(CheckKeys(
      *options, path,
      {"model_selection_beam", "worker_assignment_beam", "topological_orders", "latency_percentile",
       "lb_time_limit_s", "lb_node_limit", "byte_units", "share_rule"}));
  OptimizerOptions& o = p.options;
  for (auto [key, slot] :
       {std::pair<const char*, int*>{"model_selection_beam", &o.model_selection_beam},
        {"worker_assignment_beam", &o.worker_assignment_beam},
        {"topological_orders", &o.topological_orders}}) {
    int64_t value = 0;
    PLEXUS_ASSIGN_OR_RETURN(value, IntegerField(*options, path, key, false, *slot));
    if (value < 1 || value > 100000) {
      return Invalid(Child(path, key), "must be between 1 and 100000");
    }
    *slot = static_cast<int>(value);
  }
  std::string percentile;
  PLEXUS_ASSIGN_OR_RETURN(percentile,
                          StringField(*options, path, "latency_percentile", false, "p75"));
  if (percentile == "p50") {
    o.percentile = Percentile::kP50;
  } else if (percentile == "p75") {
    o.percentile = Percentile::kP75;
  } else if (percentile == "p90") {
    o.percentile = Percentile::kP90;
  } else {
    return Invalid(Child(path, "latency_percentile"),
                   absl::StrCat("unknown percentile '", percentile, "' (p50, p75 or p90)"));
  }
  PLEXUS_ASSIGN_OR_RETURN(o.lb_time_limit_s,
                          NumberField(*options, path, "lb_time_limit_s", false, o.lb_time_limit_s));
  if (!(o.lb_time_limit_s > 0)) return Invalid(Child(path, "lb_time_limit_s"), "must be > 0");
  PLEXUS_ASSIGN_OR_RETURN(o.lb_node_limit,
                          IntegerField(*options, path, "lb_node_limit", false, o.lb_node_limit));
  if (o.lb_node_limit < 1) return Invalid(Child(path, "lb_node_limit"), "must be >= 1");
  std::string units, rule;
  PLEXUS_ASSIGN_OR_RETURN(units, StringField(*options, path, "byte_units", false, "decimal"));
  auto parsed_units = ParseByteUnits(units);
  if (!parsed_units.ok()) {
    return Invalid(Child(path, "byte_units"), std::string(parsed_units.status().message()));
  }
  o.byte_units = *parsed_units;
  PLEXUS_ASSIGN_OR_RETURN(rule, StringField(*options, path, "share_rule", false, "proportional"));
  auto parsed_rule = ParseShareRule(rule);
  if (!parsed_rule.ok()) {
    return Invalid(Child(path, "share_rule"), std::string(parsed_rule.status().message()));
  }
  o.share_rule = *parsed_rule;
  return absl::OkStatus();
}

}  // namespace plexus::placement::internal
