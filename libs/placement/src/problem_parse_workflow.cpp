// The "workflow" section of the placement input: operators, edges, message sizes, the
// topological order, and the request rate every operator receives.
#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "problem_parse.hpp"

namespace plexus::placement::internal {

namespace {

// The largest request rate an operator may receive.
constexpr double kMaxRate = 1e12;

absl::Status ParseMessageSizes(const Json& entry, const std::string& at, Edge& edge, Problem& p) {
  const Json* sizes = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(sizes, ArrayField(entry, at, "message_kb", true));
  const Operator& from = p.operators[edge.from];
  const Operator& to = p.operators[edge.to];
  for (size_t s = 0; s < sizes->size(); ++s) {
    const std::string sat = Index(Child(at, "message_kb"), s);
    const Json& item = (*sizes)[s];
    if (!item.is_object()) return Invalid(sat, "expected an object");
    PLEXUS_RETURN_IF_ERROR(CheckKeys(item, sat, {"from_variant", "to_variant", "kb"}));
    MessageSize size;
    PLEXUS_ASSIGN_OR_RETURN(size.from_variant, StringField(item, sat, "from_variant", false, "*"));
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
        return Invalid(
            Child(at, "message_kb"),
            absl::StrCat("no message size for variants (", from_name.empty() ? "source" : from_name,
                         ", ", to.variants[tv], "); add an entry or a '*' entry"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TopologicalSort(Problem& p) {
  const size_t n = p.operators.size();
  std::vector<int> indegree(n, 0);
  for (const Edge& edge : p.edges) ++indegree[edge.to];
  std::vector<int> ready;
  for (size_t op = 0; op < n; ++op) {
    if (indegree[op] == 0) ready.push_back(static_cast<int>(op));
  }
  // Sources first, then declaration order: a stable, readable order.
  while (!ready.empty()) {
    auto it = std::min_element(ready.begin(), ready.end(), [&](int a, int b) {
      const bool sa = p.operators[a].kind == OperatorKind::kSource;
      const bool sb = p.operators[b].kind == OperatorKind::kSource;
      return sa != sb ? sa : a < b;
    });
    const int op = *it;
    ready.erase(it);
    p.topological_order.push_back(op);
    for (int e : p.out_edges[op]) {
      if (--indegree[p.edges[e].to] == 0) ready.push_back(p.edges[e].to);
    }
  }
  if (p.topological_order.size() == n) return absl::OkStatus();
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
    for (int e : p.in_edges[walk.back()]) {
      if (indegree[p.edges[e].from] > 0) next = p.edges[e].from;
    }
    if (position[next] >= 0) {
      // walk[position[next]] ... walk.back() goes backwards along edges; print it forwards.
      std::vector<std::string> names;
      for (size_t i = walk.size(); i-- > static_cast<size_t>(position[next]);) {
        names.push_back(p.operators[walk[i]].name);
      }
      names.push_back(p.operators[walk.back()].name);
      return Invalid("workflow.edges",
                     absl::StrCat("the workflow has a cycle: ", absl::StrJoin(names, " -> ")));
    }
    position[next] = static_cast<int>(walk.size());
    walk.push_back(next);
  }
}

}  // namespace

absl::Status ParseWorkflow(const Json& workflow, Problem& p) {
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
    if (p.FindOperator(op.name) >= 0) {
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
    p.operators.push_back(std::move(op));
  }

  const Json* edges = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(edges, ArrayField(workflow, path, "edges", true));
  const size_t n = p.operators.size();
  p.in_edges.assign(n, {});
  p.out_edges.assign(n, {});
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
    edge.from = p.FindOperator(from);
    edge.to = p.FindOperator(to);
    if (edge.from < 0) return Invalid(Child(at, "from"), UnknownOperator(from, p));
    if (edge.to < 0) return Invalid(Child(at, "to"), UnknownOperator(to, p));
    if (edge.from == edge.to) return Invalid(at, absl::StrCat("self-loop on '", from, "'"));
    if (p.operators[edge.to].kind == OperatorKind::kSource) {
      return Invalid(Child(at, "to"), absl::StrCat("'", to, "' is a source: it has no inputs"));
    }
    if (!seen.insert({edge.from, edge.to}).second) {
      return Invalid(at, absl::StrCat("duplicate edge ", from, " -> ", to));
    }
    PLEXUS_ASSIGN_OR_RETURN(edge.rate_ratio, NumberField(entry, at, "rate_ratio", false, 1.0));
    if (!(edge.rate_ratio > 0)) return Invalid(Child(at, "rate_ratio"), "must be > 0");
    PLEXUS_RETURN_IF_ERROR(ParseMessageSizes(entry, at, edge, p));
    p.out_edges[edge.from].push_back(static_cast<int>(p.edges.size()));
    p.in_edges[edge.to].push_back(static_cast<int>(p.edges.size()));
    p.edges.push_back(std::move(edge));
  }
  for (size_t op = 0; op < n; ++op) {
    if (p.operators[op].kind != OperatorKind::kSource && p.in_edges[op].empty()) {
      return Invalid("workflow", absl::StrCat("operator '", p.operators[op].name,
                                              "' has no incoming edge: connect it to a source"));
    }
  }
  return TopologicalSort(p);
}

absl::Status ComputeRates(Problem& p) {
  p.rate.assign(p.operators.size(), 0);
  for (int op : p.topological_order) {
    const Operator& o = p.operators[op];
    if (o.kind == OperatorKind::kSource) {
      p.rate[op] = o.source_rate > 0 ? o.source_rate : p.objective.input_rate;
      continue;
    }
    double total = 0;
    for (size_t k = 0; k < p.in_edges[op].size(); ++k) {
      const Edge& edge = p.edges[p.in_edges[op][k]];
      const double incoming = p.rate[edge.from] * edge.rate_ratio;
      if (o.combine == Combine::kJoin && k > 0 &&
          std::abs(incoming - total) > 1e-6 * std::max(incoming, total)) {
        return Invalid("workflow",
                       absl::StrCat("join '", o.name, "' receives ", total, " req/s from '",
                                    p.operators[p.edges[p.in_edges[op][0]].from].name, "' but ",
                                    incoming, " req/s from '", p.operators[edge.from].name,
                                    "': a join needs equal rates (or set \"combine\": "
                                    "\"union\")"));
      }
      total = o.combine == Combine::kJoin ? incoming : total + incoming;
    }
    p.rate[op] = total;
  }
  // Larger rates overflow the capacity and cost arithmetic (inf - inf: NaN costs).
  for (size_t op = 0; op < p.rate.size(); ++op) {
    if (!(p.rate[op] <= kMaxRate)) {
      return Invalid("workflow",
                     absl::StrCat("operator '", p.operators[op].name, "' would receive ",
                                  p.rate[op], " req/s (source rates times rate_ratio); at most ",
                                  kMaxRate, " req/s are supported"));
    }
  }
  return absl::OkStatus();
}

std::string UnknownOperator(const std::string& name, const Problem& p) {
  std::vector<std::string> names;
  for (const Operator& op : p.operators) names.push_back(op.name);
  return absl::StrCat("unknown operator '", name, "' (operators: ", absl::StrJoin(names, ", "),
                      ")");
}

}  // namespace plexus::placement::internal
