// The placement input's model: parsing entry points (the section parsers live in
// problem_parse_*.cpp), lookups, derived quantities and the JSON writer (docs/placement.md).
#include "plexus/placement/problem.hpp"

#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "problem_parse.hpp"

namespace plexus::placement {

namespace {

using base::json::CheckKeys;
using base::json::Invalid;
using base::json::Json;
using base::json::ObjectField;
using base::json::StringField;

absl::Status ParseRoot(const Json& root, Problem& p) {
  if (!root.is_object()) return Invalid("input", "expected a JSON object at the top level");
  PLEXUS_RETURN_IF_ERROR(
      CheckKeys(root, "",
                {"name", "description", "workflow", "accuracy_profiles", "execution_profiles",
                 "infrastructure", "objective", "options"}));
  PLEXUS_ASSIGN_OR_RETURN(p.name, StringField(root, "", "name", false, "unnamed"));
  PLEXUS_ASSIGN_OR_RETURN(p.description, StringField(root, "", "description", false));
  const Json* workflow = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(workflow, ObjectField(root, "", "workflow", true));
  PLEXUS_RETURN_IF_ERROR(internal::ParseWorkflow(*workflow, p));
  const Json* infrastructure = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(infrastructure, ObjectField(root, "", "infrastructure", true));
  PLEXUS_RETURN_IF_ERROR(internal::ParseInfrastructure(*infrastructure, p));
  PLEXUS_RETURN_IF_ERROR(internal::ParseAccuracyProfiles(root, p));
  PLEXUS_RETURN_IF_ERROR(internal::ParseExecutionProfiles(root, p));
  PLEXUS_RETURN_IF_ERROR(internal::ParseObjective(root, p));
  PLEXUS_RETURN_IF_ERROR(internal::ParseOptions(root, p));
  return internal::ComputeRates(p);
}

}  // namespace

std::string_view ByteUnitsName(ByteUnits units) {
  return units == ByteUnits::kBinary ? "binary" : "decimal";
}

std::string_view ShareRuleName(ShareRule rule) {
  return rule == ShareRule::kFillInOrder ? "fill_in_order" : "proportional";
}

absl::StatusOr<ByteUnits> ParseByteUnits(std::string_view name) {
  if (name == "decimal") return ByteUnits::kDecimal;
  if (name == "binary") return ByteUnits::kBinary;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown byte units '", std::string(name),
                   "' (decimal: KB = 10^3, GB = 10^9 bytes; binary: KB = 2^10, GB = 2^30 bytes)"));
}

absl::StatusOr<ShareRule> ParseShareRule(std::string_view name) {
  if (name == "proportional") return ShareRule::kProportional;
  if (name == "fill_in_order" || name == "fill-in-order") return ShareRule::kFillInOrder;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown share rule '", std::string(name), "' (proportional or fill_in_order)"));
}

std::string_view PercentileName(Percentile percentile) {
  switch (percentile) {
    case Percentile::kP50:
      return "p50";
    case Percentile::kP75:
      return "p75";
    case Percentile::kP90:
      return "p90";
  }
  return "?";
}

int Problem::FindOperator(std::string_view name) const {
  for (size_t i = 0; i < operators.size(); ++i) {
    if (operators[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int Problem::FindVariant(int op, std::string_view variant) const {
  const auto& variants = operators[op].variants;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i] == variant) return static_cast<int>(i);
  }
  return -1;
}

int Problem::FindWorker(std::string_view name) const {
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int Problem::FindTier(std::string_view name) const {
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (tiers[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<Problem> ParseProblem(std::string_view json_text) {
  PLEXUS_ASSIGN_OR_RETURN(base::json::Json root,
                          base::json::ParseJsonText(json_text, "placement input"));
  Problem problem;
  PLEXUS_RETURN_IF_ERROR(ParseRoot(root, problem));
  return problem;
}

absl::StatusOr<Problem> LoadProblem(const std::string& path) {
  PLEXUS_ASSIGN_OR_RETURN(std::string text, base::ReadFile(path));
  auto problem = ParseProblem(text);
  if (!problem.ok()) {
    return absl::Status(problem.status().code(),
                        absl::StrCat(path, ": ", std::string(problem.status().message())));
  }
  return problem;
}

double WorkerThroughput(const Problem& problem, int op, int variant, int worker) {
  if (variant < 0) return 0;
  const Worker& w = problem.workers[worker];
  const auto& profile = problem.latency[op][variant][w.type];
  if (!profile.has_value()) return 0;
  double latency = profile->p75;
  if (problem.options.percentile == Percentile::kP50) latency = profile->p50;
  if (problem.options.percentile == Percentile::kP90) latency = profile->p90;
  const Tier& tier = problem.tiers[w.tier];
  return 1000.0 / latency * (tier.replicated ? tier.locations : 1);
}

double WorkerPrice(const Problem& problem, int worker) {
  const Worker& w = problem.workers[worker];
  const Tier& tier = problem.tiers[w.tier];
  return problem.worker_types[w.type].price_per_hour * (tier.replicated ? tier.locations : 1);
}

std::string ProblemToJson(const Problem& p) {
  using base::json::Json;
  Json root;
  root["name"] = p.name;
  if (!p.description.empty()) root["description"] = p.description;
  Json operators = Json::array();
  for (size_t i = 0; i < p.operators.size(); ++i) {
    const Operator& op = p.operators[i];
    Json o;
    o["name"] = op.name;
    o["kind"] = op.kind == OperatorKind::kSource ? "source"
                : op.kind == OperatorKind::kMl   ? "ml"
                                                 : "relational";
    if (op.kind == OperatorKind::kMl) o["variants"] = op.variants;
    if (p.in_edges[i].size() > 1) o["combine"] = op.combine == Combine::kJoin ? "join" : "union";
    operators.push_back(o);
  }
  Json edges = Json::array();
  for (const Edge& edge : p.edges) {
    Json sizes = Json::array();
    for (const MessageSize& size : edge.message_sizes) {
      sizes.push_back(
          {{"from_variant", size.from_variant}, {"to_variant", size.to_variant}, {"kb", size.kb}});
    }
    edges.push_back({{"from", p.operators[edge.from].name},
                     {"to", p.operators[edge.to].name},
                     {"rate_ratio", edge.rate_ratio},
                     {"message_kb", sizes}});
  }
  root["workflow"] = {{"operators", operators}, {"edges", edges}};
  Json accuracy = Json::array();
  Json execution = Json::array();
  for (size_t op = 0; op < p.operators.size(); ++op) {
    const Operator& o = p.operators[op];
    if (o.kind == OperatorKind::kMl) {
      Json inputs = Json::array();
      for (int input : o.accuracy_inputs) inputs.push_back(p.operators[input].name);
      Json variants = Json::object();
      for (size_t v = 0; v < o.variants.size(); ++v) {
        Json rows = Json::array();
        for (const AccuracyRow& row : o.accuracy_rows[v]) {
          rows.push_back({{"in", row.inputs}, {"out", row.output}});
        }
        variants[o.variants[v]] = rows;
      }
      accuracy.push_back({{"operator", o.name}, {"inputs", inputs}, {"variants", variants}});
    }
    for (size_t v = 0; v < o.variants.size(); ++v) {
      for (size_t t = 0; t < p.worker_types.size(); ++t) {
        const auto& profile = p.latency[op][v][t];
        if (!profile.has_value()) continue;
        execution.push_back({{"operator", o.name},
                             {"variant", o.variants[v]},
                             {"worker_type", p.worker_types[t].name},
                             {"p50", profile->p50},
                             {"p75", profile->p75},
                             {"p90", profile->p90}});
      }
    }
  }
  root["accuracy_profiles"] = accuracy;
  root["execution_profiles"] = execution;
  auto link_json = [](const Link& link) {
    return Json{{"price_per_gb", link.price_per_gb},
                {"latency_ms", link.latency_ms},
                {"bandwidth_gbps", link.bandwidth_gbps}};
  };
  Json tiers = Json::array();
  for (const Tier& tier : p.tiers) {
    Json t{{"name", tier.name}, {"locations", tier.locations}, {"replicated", tier.replicated}};
    if (tier.locations > 1 && !tier.replicated) {
      t["between_locations"] = link_json(tier.between_locations);
    }
    tiers.push_back(t);
  }
  Json types = Json::array();
  for (const WorkerType& type : p.worker_types) {
    types.push_back(
        {{"name", type.name}, {"price_per_hour", type.price_per_hour}, {"gpu", type.gpu}});
  }
  Json workers = Json::array();
  for (const Worker& worker : p.workers) {
    workers.push_back({{"name", worker.name},
                       {"type", p.worker_types[worker.type].name},
                       {"tier", p.tiers[worker.tier].name},
                       {"location", worker.location}});
  }
  Json network = Json::array();
  for (size_t a = 0; a < p.tiers.size(); ++a) {
    for (size_t b = a + 1; b < p.tiers.size(); ++b) {
      Json link = link_json(*p.tier_links[a][b]);
      link["from"] = p.tiers[a].name;
      link["to"] = p.tiers[b].name;
      network.push_back(link);
    }
  }
  Json sources = Json::array();
  for (const Operator& op : p.operators) {
    if (op.kind != OperatorKind::kSource) continue;
    Json s{{"operator", op.name},
           {"tier", p.tiers[op.source_tier].name},
           {"location", op.source_location}};
    if (op.source_rate > 0) s["rate"] = op.source_rate;
    sources.push_back(s);
  }
  root["infrastructure"] = {{"tiers", tiers},
                            {"worker_types", types},
                            {"workers", workers},
                            {"network", network},
                            {"sources", sources}};
  root["objective"] = {{"accuracy_target", p.objective.accuracy_target},
                       {"sink", p.operators[p.objective.sink].name}};
  if (p.objective.input_rate > 0) root["objective"]["input_rate"] = p.objective.input_rate;
  root["options"] = {{"model_selection_beam", p.options.model_selection_beam},
                     {"worker_assignment_beam", p.options.worker_assignment_beam},
                     {"topological_orders", p.options.topological_orders},
                     {"latency_percentile", std::string(PercentileName(p.options.percentile))},
                     {"lb_time_limit_s", p.options.lb_time_limit_s},
                     {"lb_node_limit", p.options.lb_node_limit},
                     {"byte_units", std::string(ByteUnitsName(p.options.byte_units))},
                     {"share_rule", std::string(ShareRuleName(p.options.share_rule))}};
  return root.dump(1);
}

}  // namespace plexus::placement
