// Parsing and validation of the placement input format (docs/placement.md).
#include "plexus/placement/problem.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement {

namespace {

// The largest request rate an operator may receive.
constexpr double kMaxRate = 1e12;

using base::json::ArrayField;
using base::json::BoolField;
using base::json::CheckKeys;
using base::json::Child;
using base::json::Index;
using base::json::IntegerField;
using base::json::Invalid;
using base::json::Json;
using base::json::NumberField;
using base::json::ObjectField;
using base::json::StringField;

absl::StatusOr<Link> ParseLink(const Json& object, const std::string& path,
                               std::initializer_list<std::string_view> extra_keys = {}) {
  std::vector<std::string_view> keys = {"price_per_gb", "latency_ms", "bandwidth_gbps"};
  keys.insert(keys.end(), extra_keys.begin(), extra_keys.end());
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (key == "comment" || (!key.empty() && key[0] == '_')) continue;
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      return Invalid(Child(path, key), "unknown field");
    }
  }
  Link link;
  PLEXUS_ASSIGN_OR_RETURN(link.price_per_gb, NumberField(object, path, "price_per_gb", true));
  PLEXUS_ASSIGN_OR_RETURN(link.latency_ms, NumberField(object, path, "latency_ms", false));
  PLEXUS_ASSIGN_OR_RETURN(link.bandwidth_gbps, NumberField(object, path, "bandwidth_gbps", false));
  if (link.price_per_gb < 0) return Invalid(Child(path, "price_per_gb"), "must be >= 0");
  if (link.latency_ms < 0) return Invalid(Child(path, "latency_ms"), "must be >= 0");
  if (link.bandwidth_gbps < 0) return Invalid(Child(path, "bandwidth_gbps"), "must be >= 0");
  return link;
}

class Parser {
 public:
  explicit Parser(Problem& problem) : p_(problem) {}

  absl::Status Parse(const Json& root) {
    if (!root.is_object()) return Invalid("input", "expected a JSON object at the top level");
    PLEXUS_RETURN_IF_ERROR(
        CheckKeys(root, "",
                  {"name", "description", "workflow", "accuracy_profiles", "execution_profiles",
                   "infrastructure", "objective", "options"}));
    PLEXUS_ASSIGN_OR_RETURN(p_.name, StringField(root, "", "name", false, "unnamed"));
    PLEXUS_ASSIGN_OR_RETURN(p_.description, StringField(root, "", "description", false));
    const Json* workflow = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(workflow, ObjectField(root, "", "workflow", true));
    PLEXUS_RETURN_IF_ERROR(ParseWorkflow(*workflow));
    const Json* infrastructure = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(infrastructure, ObjectField(root, "", "infrastructure", true));
    PLEXUS_RETURN_IF_ERROR(ParseInfrastructure(*infrastructure));
    PLEXUS_RETURN_IF_ERROR(ParseAccuracyProfiles(root));
    PLEXUS_RETURN_IF_ERROR(ParseExecutionProfiles(root));
    PLEXUS_RETURN_IF_ERROR(ParseObjective(root));
    PLEXUS_RETURN_IF_ERROR(ParseOptions(root));
    return ComputeRates();
  }

 private:
  absl::Status ParseWorkflow(const Json& workflow) {
    const std::string path = "workflow";
    PLEXUS_RETURN_IF_ERROR(CheckKeys(workflow, path, {"operators", "edges"}));
    const Json* operators = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(operators, ArrayField(workflow, path, "operators", true));
    if (operators->empty()) return Invalid(Child(path, "operators"), "the workflow is empty");
    for (size_t i = 0; i < operators->size(); ++i) {
      const std::string at = Index(Child(path, "operators"), i);
      const Json& entry = (*operators)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"name", "kind", "variants", "combine"}));
      Operator op;
      PLEXUS_ASSIGN_OR_RETURN(op.name, StringField(entry, at, "name", true));
      if (p_.FindOperator(op.name) >= 0) {
        return Invalid(Child(at, "name"), absl::StrCat("duplicate operator '", op.name, "'"));
      }
      std::string kind;
      PLEXUS_ASSIGN_OR_RETURN(kind, StringField(entry, at, "kind", true));
      if (kind == "source") {
        op.kind = OperatorKind::kSource;
      } else if (kind == "ml") {
        op.kind = OperatorKind::kMl;
      } else if (kind == "relational") {
        op.kind = OperatorKind::kRelational;
      } else {
        return Invalid(Child(at, "kind"),
                       absl::StrCat("unknown kind '", kind, "' (expected source, ml, relational)"));
      }
      std::string combine;
      PLEXUS_ASSIGN_OR_RETURN(combine, StringField(entry, at, "combine", false, "join"));
      if (combine == "join") {
        op.combine = Combine::kJoin;
      } else if (combine == "union") {
        op.combine = Combine::kUnion;
      } else {
        return Invalid(Child(at, "combine"),
                       absl::StrCat("unknown combine '", combine, "' (expected join or union)"));
      }
      const Json* variants = nullptr;
      PLEXUS_ASSIGN_OR_RETURN(variants, ArrayField(entry, at, "variants", false));
      if (variants != nullptr) {
        for (size_t v = 0; v < variants->size(); ++v) {
          const std::string vat = Index(Child(at, "variants"), v);
          if (!(*variants)[v].is_string() || (*variants)[v].get<std::string>().empty()) {
            return Invalid(vat, "expected a non-empty variant name");
          }
          std::string name = (*variants)[v].get<std::string>();
          if (name == "*") return Invalid(vat, "'*' is reserved for 'any variant'");
          if (std::find(op.variants.begin(), op.variants.end(), name) != op.variants.end()) {
            return Invalid(vat, absl::StrCat("duplicate variant '", name, "'"));
          }
          op.variants.push_back(name);
        }
      }
      if (op.kind == OperatorKind::kSource && !op.variants.empty()) {
        return Invalid(Child(at, "variants"), "a source has no variants");
      }
      if (op.kind == OperatorKind::kRelational &&
          !(op.variants.empty() || (op.variants.size() == 1 && op.variants[0] == "default"))) {
        return Invalid(Child(at, "variants"),
                       "a relational operator has exactly one variant, 'default'");
      }
      if (op.kind != OperatorKind::kSource && op.variants.empty()) op.variants = {"default"};
      p_.operators.push_back(std::move(op));
    }

    const Json* edges = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(edges, ArrayField(workflow, path, "edges", true));
    const size_t n = p_.operators.size();
    p_.in_edges.assign(n, {});
    p_.out_edges.assign(n, {});
    std::set<std::pair<int, int>> seen;
    for (size_t i = 0; i < edges->size(); ++i) {
      const std::string at = Index(Child(path, "edges"), i);
      const Json& entry = (*edges)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"from", "to", "rate_ratio", "message_kb"}));
      Edge edge;
      std::string from, to;
      PLEXUS_ASSIGN_OR_RETURN(from, StringField(entry, at, "from", true));
      PLEXUS_ASSIGN_OR_RETURN(to, StringField(entry, at, "to", true));
      edge.from = p_.FindOperator(from);
      edge.to = p_.FindOperator(to);
      if (edge.from < 0) return Invalid(Child(at, "from"), UnknownOperator(from));
      if (edge.to < 0) return Invalid(Child(at, "to"), UnknownOperator(to));
      if (edge.from == edge.to) return Invalid(at, absl::StrCat("self-loop on '", from, "'"));
      if (p_.operators[edge.to].kind == OperatorKind::kSource) {
        return Invalid(Child(at, "to"), absl::StrCat("'", to, "' is a source: it has no inputs"));
      }
      if (!seen.insert({edge.from, edge.to}).second) {
        return Invalid(at, absl::StrCat("duplicate edge ", from, " -> ", to));
      }
      PLEXUS_ASSIGN_OR_RETURN(edge.rate_ratio, NumberField(entry, at, "rate_ratio", false, 1.0));
      if (!(edge.rate_ratio > 0)) return Invalid(Child(at, "rate_ratio"), "must be > 0");
      PLEXUS_RETURN_IF_ERROR(ParseMessageSizes(entry, at, edge));
      p_.out_edges[edge.from].push_back(static_cast<int>(p_.edges.size()));
      p_.in_edges[edge.to].push_back(static_cast<int>(p_.edges.size()));
      p_.edges.push_back(std::move(edge));
    }
    for (size_t op = 0; op < n; ++op) {
      if (p_.operators[op].kind != OperatorKind::kSource && p_.in_edges[op].empty()) {
        return Invalid("workflow", absl::StrCat("operator '", p_.operators[op].name,
                                                "' has no incoming edge: connect it to a source"));
      }
    }
    return TopologicalSort();
  }

  std::string UnknownOperator(const std::string& name) const {
    std::vector<std::string> names;
    for (const Operator& op : p_.operators) names.push_back(op.name);
    return absl::StrCat("unknown operator '", name, "' (operators: ", absl::StrJoin(names, ", "),
                        ")");
  }

  absl::Status ParseMessageSizes(const Json& entry, const std::string& at, Edge& edge) {
    const Json* sizes = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(sizes, ArrayField(entry, at, "message_kb", true));
    const Operator& from = p_.operators[edge.from];
    const Operator& to = p_.operators[edge.to];
    for (size_t s = 0; s < sizes->size(); ++s) {
      const std::string sat = Index(Child(at, "message_kb"), s);
      const Json& item = (*sizes)[s];
      if (!item.is_object()) return Invalid(sat, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(item, sat, {"from_variant", "to_variant", "kb"}));
      MessageSize size;
      PLEXUS_ASSIGN_OR_RETURN(size.from_variant,
                              StringField(item, sat, "from_variant", false, "*"));
      PLEXUS_ASSIGN_OR_RETURN(size.to_variant, StringField(item, sat, "to_variant", false, "*"));
      PLEXUS_ASSIGN_OR_RETURN(size.kb, NumberField(item, sat, "kb", true));
      if (size.kb < 0) return Invalid(Child(sat, "kb"), "must be >= 0");
      if (size.from_variant != "*" && std::find(from.variants.begin(), from.variants.end(),
                                                size.from_variant) == from.variants.end()) {
        return Invalid(
            Child(sat, "from_variant"),
            absl::StrCat("operator '", from.name, "' has no variant '", size.from_variant, "'"));
      }
      if (size.to_variant != "*" &&
          std::find(to.variants.begin(), to.variants.end(), size.to_variant) == to.variants.end()) {
        return Invalid(
            Child(sat, "to_variant"),
            absl::StrCat("operator '", to.name, "' has no variant '", size.to_variant, "'"));
      }
      edge.message_sizes.push_back(size);
    }
    // The most specific entry wins: the exact pair, then an exact upstream variant, then an exact
    // downstream variant, then "*"/"*".
    const size_t from_count = std::max<size_t>(1, from.variants.size());
    edge.size_kb.assign(from_count, std::vector<double>(to.variants.size(), 0));
    for (size_t fv = 0; fv < from_count; ++fv) {
      const std::string from_name = from.variants.empty() ? "" : from.variants[fv];
      for (size_t tv = 0; tv < to.variants.size(); ++tv) {
        int best_rank = -1;
        for (const MessageSize& size : edge.message_sizes) {
          const bool from_exact = size.from_variant == from_name;
          const bool to_exact = size.to_variant == to.variants[tv];
          if (!(from_exact || size.from_variant == "*") || !(to_exact || size.to_variant == "*")) {
            continue;
          }
          const int rank = (from_exact ? 2 : 0) + (to_exact ? 1 : 0);
          if (rank > best_rank) {
            best_rank = rank;
            edge.size_kb[fv][tv] = size.kb;
          }
        }
        if (best_rank < 0) {
          return Invalid(Child(at, "message_kb"),
                         absl::StrCat("no message size for variants (",
                                      from_name.empty() ? "source" : from_name, ", ",
                                      to.variants[tv], "); add an entry or a '*' entry"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status TopologicalSort() {
    const size_t n = p_.operators.size();
    std::vector<int> indegree(n, 0);
    for (const Edge& edge : p_.edges) ++indegree[edge.to];
    std::vector<int> ready;
    for (size_t op = 0; op < n; ++op) {
      if (indegree[op] == 0) ready.push_back(static_cast<int>(op));
    }
    // Sources first, then declaration order: a stable, readable order.
    while (!ready.empty()) {
      auto it = std::min_element(ready.begin(), ready.end(), [&](int a, int b) {
        const bool sa = p_.operators[a].kind == OperatorKind::kSource;
        const bool sb = p_.operators[b].kind == OperatorKind::kSource;
        return sa != sb ? sa : a < b;
      });
      const int op = *it;
      ready.erase(it);
      p_.topological_order.push_back(op);
      for (int e : p_.out_edges[op]) {
        if (--indegree[p_.edges[e].to] == 0) ready.push_back(p_.edges[e].to);
      }
    }
    if (p_.topological_order.size() == n) return absl::OkStatus();
    // Name one cycle: walk backwards along edges between operators still waiting for inputs.
    int start = -1;
    for (size_t op = 0; op < n; ++op) {
      if (indegree[op] > 0) start = static_cast<int>(op);
    }
    std::vector<int> walk = {start};
    std::vector<int> position(n, -1);
    position[start] = 0;
    while (true) {
      int next = -1;
      for (int e : p_.in_edges[walk.back()]) {
        if (indegree[p_.edges[e].from] > 0) next = p_.edges[e].from;
      }
      if (position[next] >= 0) {
        // walk[position[next]] ... walk.back() goes backwards along edges; print it forwards.
        std::vector<std::string> names;
        for (size_t i = walk.size(); i-- > static_cast<size_t>(position[next]);) {
          names.push_back(p_.operators[walk[i]].name);
        }
        names.push_back(p_.operators[walk.back()].name);
        return Invalid("workflow.edges",
                       absl::StrCat("the workflow has a cycle: ", absl::StrJoin(names, " -> ")));
      }
      position[next] = static_cast<int>(walk.size());
      walk.push_back(next);
    }
  }

  std::string UnknownTier(const std::string& name) const {
    std::vector<std::string> names;
    for (const Tier& tier : p_.tiers) names.push_back(tier.name);
    return absl::StrCat("unknown tier '", name, "' (tiers: ", absl::StrJoin(names, ", "), ")");
  }

  int FindType(const std::string& name) const {
    for (size_t i = 0; i < p_.worker_types.size(); ++i) {
      if (p_.worker_types[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }

  absl::Status ParseInfrastructure(const Json& infra) {
    const std::string path = "infrastructure";
    PLEXUS_RETURN_IF_ERROR(
        CheckKeys(infra, path, {"tiers", "worker_types", "workers", "network", "sources"}));
    PLEXUS_RETURN_IF_ERROR(ParseTiers(infra, path));
    PLEXUS_RETURN_IF_ERROR(ParseWorkers(infra, path));
    PLEXUS_RETURN_IF_ERROR(ParseNetwork(infra, path));
    return ParseSources(infra, path);
  }

  absl::Status ParseTiers(const Json& infra, const std::string& path) {
    const Json* tiers = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(tiers, ArrayField(infra, path, "tiers", true));
    if (tiers->empty()) return Invalid(Child(path, "tiers"), "at least one tier is needed");
    for (size_t i = 0; i < tiers->size(); ++i) {
      const std::string at = Index(Child(path, "tiers"), i);
      const Json& entry = (*tiers)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(
          CheckKeys(entry, at, {"name", "locations", "replicated", "between_locations"}));
      Tier tier;
      PLEXUS_ASSIGN_OR_RETURN(tier.name, StringField(entry, at, "name", true));
      if (p_.FindTier(tier.name) >= 0) {
        return Invalid(Child(at, "name"), absl::StrCat("duplicate tier '", tier.name, "'"));
      }
      int64_t locations = 0;
      PLEXUS_ASSIGN_OR_RETURN(locations, IntegerField(entry, at, "locations", false, 1));
      if (locations < 1 || locations > 1'000'000) {
        return Invalid(Child(at, "locations"), "must be between 1 and 1000000");
      }
      tier.locations = static_cast<int>(locations);
      PLEXUS_ASSIGN_OR_RETURN(tier.replicated, BoolField(entry, at, "replicated", false));
      const Json* between = nullptr;
      PLEXUS_ASSIGN_OR_RETURN(between, ObjectField(entry, at, "between_locations", false));
      if (between != nullptr) {
        PLEXUS_ASSIGN_OR_RETURN(tier.between_locations,
                                ParseLink(*between, Child(at, "between_locations")));
      } else if (tier.locations > 1 && !tier.replicated) {
        return Invalid(Child(at, "between_locations"),
                       absl::StrCat("required: tier '", tier.name, "' has ", tier.locations,
                                    " locations that are not replicated"));
      }
      p_.tiers.push_back(tier);
    }
    return absl::OkStatus();
  }

  absl::Status ParseWorkers(const Json& infra, const std::string& path) {
    const Json* types = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(types, ArrayField(infra, path, "worker_types", true));
    for (size_t i = 0; i < types->size(); ++i) {
      const std::string at = Index(Child(path, "worker_types"), i);
      const Json& entry = (*types)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"name", "price_per_hour", "gpu"}));
      WorkerType type;
      PLEXUS_ASSIGN_OR_RETURN(type.name, StringField(entry, at, "name", true));
      if (FindType(type.name) >= 0) {
        return Invalid(Child(at, "name"), absl::StrCat("duplicate worker type '", type.name, "'"));
      }
      PLEXUS_ASSIGN_OR_RETURN(type.price_per_hour, NumberField(entry, at, "price_per_hour", true));
      if (type.price_per_hour < 0) return Invalid(Child(at, "price_per_hour"), "must be >= 0");
      PLEXUS_ASSIGN_OR_RETURN(type.gpu, BoolField(entry, at, "gpu", false));
      p_.worker_types.push_back(type);
    }

    const Json* workers = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(workers, ArrayField(infra, path, "workers", true));
    // A set, not Problem::FindWorker: 100000 workers of one entry would take a quadratic search.
    std::unordered_set<std::string> names;
    for (size_t i = 0; i < workers->size(); ++i) {
      const std::string at = Index(Child(path, "workers"), i);
      const Json& entry = (*workers)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"name", "type", "tier", "location", "count"}));
      Worker worker;
      std::string name, type, tier;
      PLEXUS_ASSIGN_OR_RETURN(name, StringField(entry, at, "name", true));
      PLEXUS_ASSIGN_OR_RETURN(type, StringField(entry, at, "type", true));
      PLEXUS_ASSIGN_OR_RETURN(tier, StringField(entry, at, "tier", true));
      worker.type = FindType(type);
      if (worker.type < 0) {
        return Invalid(Child(at, "type"), absl::StrCat("unknown worker type '", type, "'"));
      }
      worker.tier = p_.FindTier(tier);
      if (worker.tier < 0) return Invalid(Child(at, "tier"), UnknownTier(tier));
      int64_t location = 0, count = 1;
      PLEXUS_ASSIGN_OR_RETURN(location, IntegerField(entry, at, "location", false, 0));
      PLEXUS_ASSIGN_OR_RETURN(count, IntegerField(entry, at, "count", false, 1));
      if (location < 0 || location >= p_.tiers[worker.tier].locations) {
        return Invalid(Child(at, "location"),
                       absl::StrCat("must be in [0, ", p_.tiers[worker.tier].locations,
                                    ") for tier '", tier, "'"));
      }
      if (count < 1 || count > 100'000) {
        return Invalid(Child(at, "count"), "must be between 1 and 100000");
      }
      worker.location = static_cast<int>(location);
      for (int64_t c = 0; c < count; ++c) {
        worker.name = count == 1 ? name : absl::StrCat(name, "-", c);
        if (!names.insert(worker.name).second) {
          return Invalid(Child(at, "name"), absl::StrCat("duplicate worker '", worker.name, "'"));
        }
        p_.workers.push_back(worker);
      }
    }
    if (p_.workers.empty()) return Invalid(Child(path, "workers"), "no workers");
    return absl::OkStatus();
  }

  absl::Status ParseNetwork(const Json& infra, const std::string& path) {
    const size_t tier_count = p_.tiers.size();
    p_.tier_links.assign(tier_count, std::vector<std::optional<Link>>(tier_count));
    const Json* network = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(network, ArrayField(infra, path, "network", tier_count > 1));
    if (network != nullptr) {
      for (size_t i = 0; i < network->size(); ++i) {
        const std::string at = Index(Child(path, "network"), i);
        const Json& entry = (*network)[i];
        if (!entry.is_object()) return Invalid(at, "expected an object");
        std::string from, to;
        PLEXUS_ASSIGN_OR_RETURN(from, StringField(entry, at, "from", true));
        PLEXUS_ASSIGN_OR_RETURN(to, StringField(entry, at, "to", true));
        const int a = p_.FindTier(from), b = p_.FindTier(to);
        if (a < 0) return Invalid(Child(at, "from"), UnknownTier(from));
        if (b < 0) return Invalid(Child(at, "to"), UnknownTier(to));
        if (a >= b) {
          return Invalid(at, absl::StrCat("tier '", from, "' is not below tier '", to,
                                          "': data only flows to higher tiers, and traffic "
                                          "inside a tier is priced by its between_locations"));
        }
        if (p_.tier_links[a][b].has_value()) {
          return Invalid(at, absl::StrCat("duplicate link ", from, " -> ", to));
        }
        Link link;
        PLEXUS_ASSIGN_OR_RETURN(link, ParseLink(entry, at, {"from", "to"}));
        p_.tier_links[a][b] = link;
      }
    }
    for (size_t a = 0; a < tier_count; ++a) {
      for (size_t b = a + 1; b < tier_count; ++b) {
        if (!p_.tier_links[a][b].has_value()) {
          return Invalid(Child(path, "network"),
                         absl::StrCat("no link from tier '", p_.tiers[a].name, "' to tier '",
                                      p_.tiers[b].name, "'"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseSources(const Json& infra, const std::string& path) {
    const Json* sources = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(sources, ArrayField(infra, path, "sources", true));
    for (size_t i = 0; i < sources->size(); ++i) {
      const std::string at = Index(Child(path, "sources"), i);
      const Json& entry = (*sources)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"operator", "tier", "location", "rate"}));
      std::string name, tier;
      PLEXUS_ASSIGN_OR_RETURN(name, StringField(entry, at, "operator", true));
      PLEXUS_ASSIGN_OR_RETURN(tier, StringField(entry, at, "tier", true));
      const int op = p_.FindOperator(name);
      if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name));
      Operator& source = p_.operators[op];
      if (source.kind != OperatorKind::kSource) {
        return Invalid(Child(at, "operator"), absl::StrCat("'", name, "' is not a source"));
      }
      if (source.source_tier >= 0) {
        return Invalid(Child(at, "operator"), absl::StrCat("source '", name, "' placed twice"));
      }
      source.source_tier = p_.FindTier(tier);
      if (source.source_tier < 0) return Invalid(Child(at, "tier"), UnknownTier(tier));
      int64_t location = 0;
      PLEXUS_ASSIGN_OR_RETURN(location, IntegerField(entry, at, "location", false, 0));
      if (location < 0 || location >= p_.tiers[source.source_tier].locations) {
        return Invalid(Child(at, "location"),
                       absl::StrCat("must be in [0, ", p_.tiers[source.source_tier].locations,
                                    ") for tier '", tier, "'"));
      }
      source.source_location = static_cast<int>(location);
      PLEXUS_ASSIGN_OR_RETURN(source.source_rate, NumberField(entry, at, "rate", false, 0));
      if (entry.contains("rate") && !(source.source_rate > 0)) {
        return Invalid(Child(at, "rate"), "must be > 0 requests per second");
      }
    }
    for (const Operator& op : p_.operators) {
      if (op.kind == OperatorKind::kSource && op.source_tier < 0) {
        return Invalid(Child(path, "sources"),
                       absl::StrCat("source '", op.name, "' has no tier and location"));
      }
    }
    return absl::OkStatus();
  }

  // The ML operators whose accuracy reaches `op` directly or through relational operators.
  std::set<int> NearestMlInputs(int op) const {
    std::set<int> result;
    for (int e : p_.in_edges[op]) {
      const int parent = p_.edges[e].from;
      if (p_.operators[parent].kind == OperatorKind::kMl) {
        result.insert(parent);
      } else if (p_.operators[parent].kind == OperatorKind::kRelational) {
        std::set<int> more = NearestMlInputs(parent);
        result.insert(more.begin(), more.end());
      }
    }
    return result;
  }

  absl::Status ParseAccuracyProfiles(const Json& root) {
    const std::string path = "accuracy_profiles";
    const Json* profiles = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(profiles, ArrayField(root, "", "accuracy_profiles", true));
    std::vector<bool> has_profile(p_.operators.size(), false);
    for (size_t i = 0; i < profiles->size(); ++i) {
      const std::string at = Index(path, i);
      const Json& entry = (*profiles)[i];
      if (!entry.is_object()) return Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"operator", "inputs", "variants"}));
      std::string name;
      PLEXUS_ASSIGN_OR_RETURN(name, StringField(entry, at, "operator", true));
      const int op = p_.FindOperator(name);
      if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name));
      Operator& target = p_.operators[op];
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
          const int input_op = p_.FindOperator(input);
          if (input_op < 0) return Invalid(kat, UnknownOperator(input));
          if (std::find(target.accuracy_inputs.begin(), target.accuracy_inputs.end(), input_op) !=
              target.accuracy_inputs.end()) {
            return Invalid(kat, absl::StrCat("'", input, "' listed twice"));
          }
          target.accuracy_inputs.push_back(input_op);
        }
      }
      const std::set<int> expected = NearestMlInputs(op);
      const std::set<int> listed(target.accuracy_inputs.begin(), target.accuracy_inputs.end());
      if (expected != listed) {
        std::vector<std::string> names;
        for (int e : expected) names.push_back(p_.operators[e].name);
        return Invalid(Child(at, "inputs"),
                       absl::StrCat("must list the ML operators feeding '", name, "': [",
                                    absl::StrJoin(names, ", "), "]"));
      }
      const Json* variants = nullptr;
      PLEXUS_ASSIGN_OR_RETURN(variants, ObjectField(entry, at, "variants", true));
      target.accuracy_rows.assign(target.variants.size(), {});
      for (auto it = variants->begin(); it != variants->end(); ++it) {
        const std::string vat = Child(Child(at, "variants"), it.key());
        const int v = p_.FindVariant(op, it.key());
        if (v < 0) {
          return Invalid(vat,
                         absl::StrCat("operator '", name, "' has no variant '", it.key(), "'"));
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
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (p_.operators[op].kind == OperatorKind::kMl && !has_profile[op]) {
        return Invalid(path, absl::StrCat("ML operator '", p_.operators[op].name,
                                          "' has no accuracy profile"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseExecutionProfiles(const Json& root) {
    const std::string path = "execution_profiles";
    const Json* profiles = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(profiles, ArrayField(root, "", "execution_profiles", true));
    p_.latency.assign(p_.operators.size(), {});
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      p_.latency[op].assign(p_.operators[op].variants.size(),
                            std::vector<std::optional<LatencyProfile>>(p_.worker_types.size()));
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
      const int op = p_.FindOperator(name);
      if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name));
      if (p_.operators[op].kind == OperatorKind::kSource) {
        return Invalid(Child(at, "operator"),
                       absl::StrCat("'", name, "' is a source: it does not run on workers"));
      }
      const int v = p_.FindVariant(op, variant);
      if (v < 0) {
        return Invalid(Child(at, "variant"),
                       absl::StrCat("operator '", name, "' has no variant '", variant, "'"));
      }
      const int t = FindType(type);
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
      auto& slot = p_.latency[op][v][t];
      if (slot.has_value()) {
        return Invalid(
            at, absl::StrCat("duplicate profile for (", name, ", ", variant, ", ", type, ")"));
      }
      slot = profile;
    }
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      for (size_t v = 0; v < p_.operators[op].variants.size(); ++v) {
        bool any = false;
        for (const auto& slot : p_.latency[op][v]) any = any || slot.has_value();
        if (!any) {
          return Invalid(path, absl::StrCat("variant '", p_.operators[op].variants[v],
                                            "' of operator '", p_.operators[op].name,
                                            "' has no execution profile on any worker type"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseObjective(const Json& root) {
    const std::string path = "objective";
    const Json* objective = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(objective, ObjectField(root, "", "objective", true));
    PLEXUS_RETURN_IF_ERROR(CheckKeys(*objective, path, {"accuracy_target", "input_rate", "sink"}));
    PLEXUS_ASSIGN_OR_RETURN(p_.objective.accuracy_target,
                            NumberField(*objective, path, "accuracy_target", true));
    bool every_source_has_rate = true;
    for (const Operator& op : p_.operators) {
      if (op.kind == OperatorKind::kSource && op.source_rate <= 0) every_source_has_rate = false;
    }
    PLEXUS_ASSIGN_OR_RETURN(p_.objective.input_rate,
                            NumberField(*objective, path, "input_rate", !every_source_has_rate, 0));
    if (objective->contains("input_rate") && !(p_.objective.input_rate > 0)) {
      return Invalid(Child(path, "input_rate"), "must be > 0 requests per second");
    }
    std::string sink;
    PLEXUS_ASSIGN_OR_RETURN(sink, StringField(*objective, path, "sink", false));
    if (!sink.empty()) {
      p_.objective.sink = p_.FindOperator(sink);
      if (p_.objective.sink < 0) return Invalid(Child(path, "sink"), UnknownOperator(sink));
      if (p_.operators[p_.objective.sink].kind != OperatorKind::kMl) {
        return Invalid(Child(path, "sink"), absl::StrCat("'", sink, "' is not an ML operator"));
      }
      return absl::OkStatus();
    }
    // Default: the one ML operator whose accuracy no other ML operator uses.
    std::vector<int> candidates;
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (p_.operators[op].kind != OperatorKind::kMl) continue;
      bool feeds_ml = false;
      for (const Operator& other : p_.operators) {
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
    p_.objective.sink = candidates[0];
    return absl::OkStatus();
  }

  absl::Status ParseOptions(const Json& root) {
    const std::string path = "options";
    const Json* options = nullptr;
    PLEXUS_ASSIGN_OR_RETURN(options, ObjectField(root, "", "options", false));
    if (options == nullptr) return absl::OkStatus();
    PLEXUS_RETURN_IF_ERROR(CheckKeys(
        *options, path,
        {"model_selection_beam", "worker_assignment_beam", "topological_orders",
         "latency_percentile", "lb_time_limit_s", "lb_node_limit", "byte_units", "share_rule"}));
    OptimizerOptions& o = p_.options;
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
    PLEXUS_ASSIGN_OR_RETURN(o.lb_time_limit_s, NumberField(*options, path, "lb_time_limit_s", false,
                                                           o.lb_time_limit_s));
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

  absl::Status ComputeRates() {
    p_.rate.assign(p_.operators.size(), 0);
    for (int op : p_.topological_order) {
      const Operator& o = p_.operators[op];
      if (o.kind == OperatorKind::kSource) {
        p_.rate[op] = o.source_rate > 0 ? o.source_rate : p_.objective.input_rate;
        continue;
      }
      double total = 0;
      for (size_t k = 0; k < p_.in_edges[op].size(); ++k) {
        const Edge& edge = p_.edges[p_.in_edges[op][k]];
        const double incoming = p_.rate[edge.from] * edge.rate_ratio;
        if (o.combine == Combine::kJoin && k > 0 &&
            std::abs(incoming - total) > 1e-6 * std::max(incoming, total)) {
          return Invalid(
              "workflow",
              absl::StrCat("join '", o.name, "' receives ", total, " req/s from '",
                           p_.operators[p_.edges[p_.in_edges[op][0]].from].name, "' but ", incoming,
                           " req/s from '", p_.operators[edge.from].name,
                           "': a join needs equal rates (or set \"combine\": "
                           "\"union\")"));
        }
        total = o.combine == Combine::kJoin ? incoming : total + incoming;
      }
      p_.rate[op] = total;
    }
    // Larger rates overflow the capacity and cost arithmetic (inf - inf: NaN costs).
    for (size_t op = 0; op < p_.rate.size(); ++op) {
      if (!(p_.rate[op] <= kMaxRate)) {
        return Invalid("workflow",
                       absl::StrCat("operator '", p_.operators[op].name, "' would receive ",
                                    p_.rate[op], " req/s (source rates times rate_ratio); at most ",
                                    kMaxRate, " req/s are supported"));
      }
    }
    return absl::OkStatus();
  }

  Problem& p_;
};

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
  PLEXUS_RETURN_IF_ERROR(Parser(problem).Parse(root));
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
