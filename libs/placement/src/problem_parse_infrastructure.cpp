// The "infrastructure" section of the placement input: tiers, worker types, workers, network
// links and sources.
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "problem_parse.hpp"

namespace plexus::placement::internal {

namespace {

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

absl::Status ParseTiers(const Json& infra, const std::string& path, Problem& p) {
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
    if (p.FindTier(tier.name) >= 0) {
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
    p.tiers.push_back(tier);
  }
  return absl::OkStatus();
}

absl::Status ParseWorkers(const Json& infra, const std::string& path, Problem& p) {
  const Json* types = nullptr;
  PLEXUS_ASSIGN_OR_RETURN(types, ArrayField(infra, path, "worker_types", true));
  for (size_t i = 0; i < types->size(); ++i) {
    const std::string at = Index(Child(path, "worker_types"), i);
    const Json& entry = (*types)[i];
    if (!entry.is_object()) return Invalid(at, "expected an object");
    PLEXUS_RETURN_IF_ERROR(CheckKeys(entry, at, {"name", "price_per_hour", "gpu"}));
    WorkerType type;
    PLEXUS_ASSIGN_OR_RETURN(type.name, StringField(entry, at, "name", true));
    if (FindType(type.name, p) >= 0) {
      return Invalid(Child(at, "name"), absl::StrCat("duplicate worker type '", type.name, "'"));
    }
    PLEXUS_ASSIGN_OR_RETURN(type.price_per_hour, NumberField(entry, at, "price_per_hour", true));
    if (type.price_per_hour < 0) return Invalid(Child(at, "price_per_hour"), "must be >= 0");
    PLEXUS_ASSIGN_OR_RETURN(type.gpu, BoolField(entry, at, "gpu", false));
    p.worker_types.push_back(type);
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
    worker.type = FindType(type, p);
    if (worker.type < 0) {
      return Invalid(Child(at, "type"), absl::StrCat("unknown worker type '", type, "'"));
    }
    worker.tier = p.FindTier(tier);
    if (worker.tier < 0) return Invalid(Child(at, "tier"), UnknownTier(tier, p));
    int64_t location = 0, count = 1;
    PLEXUS_ASSIGN_OR_RETURN(location, IntegerField(entry, at, "location", false, 0));
    PLEXUS_ASSIGN_OR_RETURN(count, IntegerField(entry, at, "count", false, 1));
    if (location < 0 || location >= p.tiers[worker.tier].locations) {
      return Invalid(Child(at, "location"),
                     absl::StrCat("must be in [0, ", p.tiers[worker.tier].locations, ") for tier '",
                                  tier, "'"));
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
      p.workers.push_back(worker);
    }
  }
  if (p.workers.empty()) return Invalid(Child(path, "workers"), "no workers");
  return absl::OkStatus();
}

absl::Status ParseNetwork(const Json& infra, const std::string& path, Problem& p) {
  const size_t tier_count = p.tiers.size();
  p.tier_links.assign(tier_count, std::vector<std::optional<Link>>(tier_count));
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
      const int a = p.FindTier(from), b = p.FindTier(to);
      if (a < 0) return Invalid(Child(at, "from"), UnknownTier(from, p));
      if (b < 0) return Invalid(Child(at, "to"), UnknownTier(to, p));
      if (a >= b) {
        return Invalid(at, absl::StrCat("tier '", from, "' is not below tier '", to,
                                        "': data only flows to higher tiers, and traffic "
                                        "inside a tier is priced by its between_locations"));
      }
      if (p.tier_links[a][b].has_value()) {
        return Invalid(at, absl::StrCat("duplicate link ", from, " -> ", to));
      }
      Link link;
      PLEXUS_ASSIGN_OR_RETURN(link, ParseLink(entry, at, {"from", "to"}));
      p.tier_links[a][b] = link;
    }
  }
  for (size_t a = 0; a < tier_count; ++a) {
    for (size_t b = a + 1; b < tier_count; ++b) {
      if (!p.tier_links[a][b].has_value()) {
        return Invalid(Child(path, "network"), absl::StrCat("no link from tier '", p.tiers[a].name,
                                                            "' to tier '", p.tiers[b].name, "'"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSources(const Json& infra, const std::string& path, Problem& p) {
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
    const int op = p.FindOperator(name);
    if (op < 0) return Invalid(Child(at, "operator"), UnknownOperator(name, p));
    Operator& source = p.operators[op];
    if (source.kind != OperatorKind::kSource) {
      return Invalid(Child(at, "operator"), absl::StrCat("'", name, "' is not a source"));
    }
    if (source.source_tier >= 0) {
      return Invalid(Child(at, "operator"), absl::StrCat("source '", name, "' placed twice"));
    }
    source.source_tier = p.FindTier(tier);
    if (source.source_tier < 0) return Invalid(Child(at, "tier"), UnknownTier(tier, p));
    int64_t location = 0;
    PLEXUS_ASSIGN_OR_RETURN(location, IntegerField(entry, at, "location", false, 0));
    if (location < 0 || location >= p.tiers[source.source_tier].locations) {
      return Invalid(Child(at, "location"),
                     absl::StrCat("must be in [0, ", p.tiers[source.source_tier].locations,
                                  ") for tier '", tier, "'"));
    }
    source.source_location = static_cast<int>(location);
    PLEXUS_ASSIGN_OR_RETURN(source.source_rate, NumberField(entry, at, "rate", false, 0));
    if (entry.contains("rate") && !(source.source_rate > 0)) {
      return Invalid(Child(at, "rate"), "must be > 0 requests per second");
    }
  }
  for (const Operator& op : p.operators) {
    if (op.kind == OperatorKind::kSource && op.source_tier < 0) {
      return Invalid(Child(path, "sources"),
                     absl::StrCat("source '", op.name, "' has no tier and location"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseInfrastructure(const Json& infra, Problem& p) {
  const std::string path = "infrastructure";
  PLEXUS_RETURN_IF_ERROR(
      CheckKeys(infra, path, {"tiers", "worker_types", "workers", "network", "sources"}));
  PLEXUS_RETURN_IF_ERROR(ParseTiers(infra, path, p));
  PLEXUS_RETURN_IF_ERROR(ParseWorkers(infra, path, p));
  PLEXUS_RETURN_IF_ERROR(ParseNetwork(infra, path, p));
  return ParseSources(infra, path, p);
}

std::string UnknownTier(const std::string& name, const Problem& p) {
  std::vector<std::string> names;
  for (const Tier& tier : p.tiers) names.push_back(tier.name);
  return absl::StrCat("unknown tier '", name, "' (tiers: ", absl::StrJoin(names, ", "), ")");
}

int FindType(const std::string& name, const Problem& p) {
  for (size_t i = 0; i < p.worker_types.size(); ++i) {
    if (p.worker_types[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace plexus::placement::internal
