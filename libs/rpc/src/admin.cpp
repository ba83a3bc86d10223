#include "plexus/rpc/admin.hpp"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/qos.hpp"

namespace plexus::rpc {
namespace {

namespace bj = base::json;
using Json = nlohmann::json;
using base::admin::AdminRequest;

const base::Param<std::string> kAdminParam(
    "PLEXUS_RPC_ADMIN", "",
    "loopback host:port of the rpc admin endpoint (RpcAdmin::FromEnv); empty: off");
const base::Param<std::string> kAdminTokenParam("PLEXUS_RPC_ADMIN_TOKEN", "",
                                                "the token every rpc admin request must carry");

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

absl::StatusOr<Json> ParseConfig(std::string_view text, const std::string& where) {
  if (text.empty()) return Json::object();
  Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  return j;
}

absl::StatusOr<std::string> Arg(const AdminRequest& r, const std::string& key,
                                const char* fallback = nullptr) {
  auto it = r.args.find(key);
  if (it == r.args.end() || it->second.empty()) {
    if (fallback != nullptr) return std::string(fallback);
    return absl::InvalidArgumentError(
        absl::StrCat("admin command '", r.command, "': missing argument '", key, "'"));
  }
  return it->second;
}

using base::admin::CheckArgs;

Json EngineJson(const Policy& p) {
  Json j{{"name", p.name()}, {"kind", p.kind()}, {"version", p.version()}};
  Json state = Json::parse(p.DescribeJson(), nullptr, false);
  j["state"] = state.is_discarded() ? Json(p.DescribeJson()) : state;
  return j;
}

Json Micros(absl::Duration d) { return absl::ToDoubleMicroseconds(d); }

}  // namespace

absl::StatusOr<std::shared_ptr<Policy>> MakePolicy(
    std::string_view kind, const std::string& name, std::string_view json_config,
    const std::vector<const ServiceDesc*>& services) {
  const std::string where = absl::StrCat(std::string(kind), " '", name, "' configuration");
  PLEXUS_ASSIGN_OR_RETURN(Json j, ParseConfig(json_config, where));
  if (kind == "metrics") {
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {}));
    return std::shared_ptr<Policy>(std::make_shared<MetricsPolicy>(name));
  }
  if (kind == "rate_limit") {
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"rate", "burst", "scope", "over_limit"}));
    RateLimitOptions o;
    if (auto it = j.find("rate"); it != j.end() && !(it->is_string() && *it == "inf")) {
      PLEXUS_ASSIGN_OR_RETURN(o.rate, bj::NumberField(j, where, "rate", true));
    }
    PLEXUS_ASSIGN_OR_RETURN(o.burst, bj::NumberField(j, where, "burst", false, 1));
    PLEXUS_ASSIGN_OR_RETURN(std::string scope,
                            bj::StringField(j, where, "scope", false, "connection"));
    PLEXUS_ASSIGN_OR_RETURN(std::string over,
                            bj::StringField(j, where, "over_limit", false, "fail"));
    if (scope != "connection" && scope != "method") {
      return bj::Invalid(bj::Child(where, "scope"), "expected \"connection\" or \"method\"");
    }
    if (over != "fail" && over != "wait") {
      return bj::Invalid(bj::Child(where, "over_limit"), "expected \"fail\" or \"wait\"");
    }
    o.scope =
        scope == "method" ? RateLimitOptions::Scope::kMethod : RateLimitOptions::Scope::kConnection;
    o.over_limit =
        over == "wait" ? RateLimitOptions::OverLimit::kWait : RateLimitOptions::OverLimit::kFail;
    PLEXUS_ASSIGN_OR_RETURN(auto p, RateLimitPolicy::Create(name, std::move(o)));
    return std::shared_ptr<Policy>(std::move(p));
  }
  if (kind == "acl") {
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"rules"}));
    PLEXUS_ASSIGN_OR_RETURN(const Json* rules, bj::ArrayField(j, where, "rules", true));
    std::vector<AclRule> out;
    for (size_t i = 0; i < rules->size(); ++i) {
      const Json& r = (*rules)[i];
      const std::string at = bj::Index(bj::Child(where, "rules"), i);
      if (!r.is_object()) return bj::Invalid(at, "expected an object");
      PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(r, at, {"name", "method", "field", "deny"}));
      AclRule rule;
      PLEXUS_ASSIGN_OR_RETURN(rule.name, bj::StringField(r, at, "name", true));
      PLEXUS_ASSIGN_OR_RETURN(rule.method, bj::StringField(r, at, "method", true));
      PLEXUS_ASSIGN_OR_RETURN(rule.field, bj::StringField(r, at, "field", true));
      PLEXUS_ASSIGN_OR_RETURN(const Json* deny, bj::ArrayField(r, at, "deny", true));
      for (size_t k = 0; k < deny->size(); ++k) {
        if (!(*deny)[k].is_string()) {
          return bj::Invalid(bj::Index(bj::Child(at, "deny"), k), "expected a string");
        }
        rule.deny.push_back((*deny)[k].get<std::string>());
      }
      out.push_back(std::move(rule));
    }
    PLEXUS_ASSIGN_OR_RETURN(auto p, AclPolicy::Create(name, services, std::move(out)));
    return std::shared_ptr<Policy>(std::move(p));
  }
  if (kind == "balance") {
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"policy", "delta", "seed", "estimate_ttl_ms"}));
    PLEXUS_ASSIGN_OR_RETURN(auto p, LoadBalancePolicy::Create(name, {}));
    if (!j.empty()) PLEXUS_RETURN_IF_ERROR(p->Configure(json_config));
    return std::shared_ptr<Policy>(std::move(p));
  }
  if (kind == "admission") {
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"max_outstanding", "scope"}));
    AdmissionOptions o;
    PLEXUS_ASSIGN_OR_RETURN(double max, bj::NumberField(j, where, "max_outstanding", true));
    if (!(max >= 1) || max > 1e12 || max != static_cast<double>(static_cast<uint64_t>(max))) {
      return bj::Invalid(bj::Child(where, "max_outstanding"), "expected an integer >= 1");
    }
    o.max_outstanding = static_cast<uint64_t>(max);
    PLEXUS_ASSIGN_OR_RETURN(std::string scope,
                            bj::StringField(j, where, "scope", false, "connection"));
    if (scope != "connection" && scope != "method") {
      return bj::Invalid(bj::Child(where, "scope"), "expected \"connection\" or \"method\"");
    }
    o.scope =
        scope == "method" ? AdmissionOptions::Scope::kMethod : AdmissionOptions::Scope::kConnection;
    PLEXUS_ASSIGN_OR_RETURN(auto p, AdmissionPolicy::Create(name, o));
    return std::shared_ptr<Policy>(std::move(p));
  }
  if (kind == "qos") {
    PLEXUS_ASSIGN_OR_RETURN(auto p, QosPolicy::Create(name, {}));
    if (!j.empty()) PLEXUS_RETURN_IF_ERROR(p->Configure(json_config));
    return std::shared_ptr<Policy>(std::move(p));
  }
  return absl::NotFoundError(absl::StrCat("no policy kind '", std::string(kind),
                                          "' (built in: metrics, rate_limit, acl, balance, "
                                          "admission, qos)"));
}

struct RpcAdmin::Target {
  std::string name;
  Server* server = nullptr;
  std::weak_ptr<Channel> channel;
  std::vector<const ServiceDesc*> services;
  // Per engine attached through this endpoint, its configuration as attach and configure left
  // it (configure changes only the fields it names): what an upgrade without a configuration
  // keeps. Guarded by RpcAdmin::mu_.
  std::map<std::string, Json, std::less<>> configs;
  // The chain, or Unavailable when the channel is gone.
  absl::StatusOr<EngineChain*> chain() const {
    if (server != nullptr) return &server->engines();
    if (auto c = channel.lock()) return &c->engines();
    return absl::UnavailableError(absl::StrCat("channel '", name, "' was closed and released"));
  }
};

namespace {
const char* const kCommands[] = {"list",      "engines", "attach", "detach",
                                 "configure", "upgrade", "metrics"};
}

RpcAdmin::RpcAdmin(base::admin::AdminServer* endpoint) : endpoint_(endpoint) {
  using R = const AdminRequest&;
  endpoint_->Handle("list", "servers and channels with their connections and engines",
                    [this](R r) { return List(r); });
  endpoint_->Handle("engines", "target=NAME: the engine chain of one server or channel",
                    [this](R r) { return Engines(r); });
  endpoint_->Handle("attach",
                    "target=NAME kind=KIND name=ENGINE [after=ENGINE] [config=JSON]: a new policy",
                    [this](R r) { return Attach(r); });
  endpoint_->Handle("detach", "target=NAME name=ENGINE: removes a policy",
                    [this](R r) { return Detach(r); });
  endpoint_->Handle("configure", "target=NAME name=ENGINE config=JSON: reconfigures a policy",
                    [this](R r) { return Configure(r); });
  endpoint_->Handle("upgrade",
                    "target=NAME name=ENGINE [kind=KIND] [config=JSON]: replaces a policy by a new "
                    "version that adopts its state",
                    [this](R r) { return Upgrade(r); });
  endpoint_->Handle("metrics", "[target=NAME]: every metrics engine's counters",
                    [this](R r) { return Metrics(r); });
}

RpcAdmin::~RpcAdmin() {
  for (const char* c : kCommands) endpoint_->Remove(c);
}

absl::StatusOr<std::unique_ptr<RpcAdmin>> RpcAdmin::FromEnv() {
  PLEXUS_ASSIGN_OR_RETURN(std::string address, kAdminParam.Get());
  if (address.empty()) return std::unique_ptr<RpcAdmin>();
  PLEXUS_ASSIGN_OR_RETURN(std::string token, kAdminTokenParam.Get());
  if (token.empty()) {
    return absl::InvalidArgumentError(
        "PLEXUS_RPC_ADMIN is set but PLEXUS_RPC_ADMIN_TOKEN is empty: the admin endpoint needs "
        "a token");
  }
  PLEXUS_ASSIGN_OR_RETURN(auto endpoint,
                          base::admin::AdminServer::Start({.address = address, .token = token}));
  auto admin = std::make_unique<RpcAdmin>(endpoint.get());
  admin->owned_ = std::move(endpoint);
  return admin;
}

absl::StatusOr<std::pair<std::string, std::string>> RpcAdmin::EnvSettings() {
  PLEXUS_ASSIGN_OR_RETURN(std::string address, kAdminParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(std::string token, kAdminTokenParam.Get());
  return std::make_pair(std::move(address), std::move(token));
}

std::string RpcAdmin::address() const { return endpoint_->address(); }

absl::Status RpcAdmin::AddTarget(std::shared_ptr<Target> target) {
  std::lock_guard<std::mutex> lock(mu_);
  if (targets_.contains(target->name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("admin target '", target->name, "' already exists"));
  }
  std::string name = target->name;
  targets_.emplace(std::move(name), std::move(target));
  return absl::OkStatus();
}

absl::Status RpcAdmin::AddServer(std::string name, Server* server,
                                 std::vector<const ServiceDesc*> services) {
  auto t = std::make_shared<Target>();
  t->name = std::move(name);
  t->server = server;
  t->services = std::move(services);
  return AddTarget(std::move(t));
}

absl::Status RpcAdmin::AddChannel(std::string name, std::shared_ptr<Channel> channel,
                                  std::vector<const ServiceDesc*> services) {
  auto t = std::make_shared<Target>();
  t->name = std::move(name);
  t->channel = std::move(channel);
  t->services = std::move(services);
  return AddTarget(std::move(t));
}

void RpcAdmin::Remove(std::string_view name) {
  // Holding the endpoint's handler lock is not needed: Find copies the shared Target, and a
  // Server is only touched while the caller keeps it alive (documented on AddServer).
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(name);
  if (it != targets_.end()) targets_.erase(it);
}

void RpcAdmin::RegisterKind(std::string kind, PolicyFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  kinds_[std::move(kind)] = std::move(factory);
}

absl::StatusOr<std::shared_ptr<RpcAdmin::Target>> RpcAdmin::Find(const AdminRequest& r) const {
  PLEXUS_ASSIGN_OR_RETURN(std::string name, Arg(r, "target"));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(name);
  if (it == targets_.end()) {
    std::string known;
    for (const auto& [n, t] : targets_) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
    return absl::NotFoundError(
        absl::StrCat("no rpc server or channel named '", name, "' (known: ", known, ")"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Policy>> RpcAdmin::Make(const std::string& kind,
                                                       const std::string& name,
                                                       std::string_view config,
                                                       const Target& t) const {
  PolicyFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = kinds_.find(kind); it != kinds_.end()) factory = it->second;
  }
  if (factory) return factory(name, config, t.services);
  return MakePolicy(kind, name, config, t.services);
}

absl::StatusOr<std::string> RpcAdmin::List(const AdminRequest& r) const {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {}));
  std::vector<std::shared_ptr<Target>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, t] : targets_) targets.push_back(t);
  }
  Json out = Json::array();
  for (const auto& t : targets) {
    Json j{{"name", t->name}};
    Json conns = Json::array();
    if (t->server != nullptr) {
      j["role"] = "server";
      j["address"] = t->server->address();
      for (const auto& c : t->server->Connections()) {
        conns.push_back({{"id", c.id}, {"peer", c.peer}, {"active_calls", c.active_calls}});
      }
    } else if (auto ch = t->channel.lock()) {
      j["role"] = "channel";
      j["address"] = ch->peer();
      const auto replicas = ch->Replicas();
      for (size_t i = 0; i < replicas.size(); ++i) {
        const auto& rep = replicas[i];
        conns.push_back({{"id", i},
                         {"peer", rep.address},
                         {"status", rep.status.ok() ? "OK" : rep.status.ToString()},
                         {"in_flight", rep.in_flight},
                         {"connections", rep.connections}});
      }
    } else {
      j["role"] = "channel";
      j["address"] = "(released)";
    }
    j["connections"] = conns;
    Json engines = Json::array();
    if (auto chain = t->chain(); chain.ok()) {
      for (const std::string& n : (*chain)->Names()) engines.push_back(n);
    }
    j["engines"] = engines;
    out.push_back(j);
  }
  return Dump(out);
}

absl::StatusOr<std::string> RpcAdmin::Engines(const AdminRequest& r) const {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target"}));
  PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
  PLEXUS_ASSIGN_OR_RETURN(EngineChain * chain, t->chain());
  Json out = Json::array();
  for (const std::string& n : chain->Names()) {
    if (auto p = chain->Find(n)) {
      out.push_back(EngineJson(*p));
    } else {
      out.push_back({{"name", n}, {"kind", "builtin"}, {"version", 1}, {"state", Json::object()}});
    }
  }
  return Dump(out);
}

absl::StatusOr<std::string> RpcAdmin::Attach(const AdminRequest& r) {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target", "kind", "name", "after", "config"}));
  PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
  PLEXUS_ASSIGN_OR_RETURN(std::string kind, Arg(r, "kind"));
  PLEXUS_ASSIGN_OR_RETURN(std::string name, Arg(r, "name"));
  PLEXUS_ASSIGN_OR_RETURN(std::string after, Arg(r, "after", "frontend"));
  PLEXUS_ASSIGN_OR_RETURN(std::string config, Arg(r, "config", "{}"));
  PLEXUS_ASSIGN_OR_RETURN(EngineChain * chain, t->chain());
  PLEXUS_ASSIGN_OR_RETURN(auto policy, Make(kind, name, config, *t));
  PLEXUS_RETURN_IF_ERROR(chain->Attach(policy, after));
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->configs[name] = Json::parse(config, nullptr, false);
  }
  return Dump(Json{{"engines", chain->Names()}});
}

absl::StatusOr<std::string> RpcAdmin::Detach(const AdminRequest& r) {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target", "name"}));
  PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
  PLEXUS_ASSIGN_OR_RETURN(std::string name, Arg(r, "name"));
  PLEXUS_ASSIGN_OR_RETURN(EngineChain * chain, t->chain());
  PLEXUS_ASSIGN_OR_RETURN(auto old, chain->Detach(name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->configs.erase(name);
  }
  return Dump(Json{{"detached", EngineJson(*old)}, {"engines", chain->Names()}});
}

absl::StatusOr<std::string> RpcAdmin::Configure(const AdminRequest& r) {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target", "name", "config"}));
  PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
  PLEXUS_ASSIGN_OR_RETURN(std::string name, Arg(r, "name"));
  PLEXUS_ASSIGN_OR_RETURN(std::string config, Arg(r, "config"));
  PLEXUS_ASSIGN_OR_RETURN(EngineChain * chain, t->chain());
  PLEXUS_ASSIGN_OR_RETURN(EngineSwapReport rep, chain->Configure(name, config));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = t->configs.find(name);
    const Json patch = Json::parse(config, nullptr, false);
    if (it != t->configs.end() && it->second.is_object() && patch.is_object()) {
      it->second.merge_patch(patch);
    }
  }
  return Dump(Json{{"engine", EngineJson(*chain->Find(name))},
                   {"pause_us", Micros(rep.pause)},
                   {"drain_us", Micros(rep.drain)}});
}

absl::StatusOr<std::string> RpcAdmin::Upgrade(const AdminRequest& r) {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target", "name", "kind", "config"}));
  PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
  PLEXUS_ASSIGN_OR_RETURN(std::string name, Arg(r, "name"));
  PLEXUS_ASSIGN_OR_RETURN(EngineChain * chain, t->chain());
  std::shared_ptr<Policy> old = chain->Find(name);
  if (old == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no engine named '", name, "' to upgrade on '", t->name, "'"));
  }
  PLEXUS_ASSIGN_OR_RETURN(std::string kind, Arg(r, "kind", old->kind().c_str()));
  // Without a configuration the new version keeps the running one (same kind), or starts from
  // its kind's defaults (another kind); the answer says which.
  std::string config, config_from = "given";
  if (r.args.contains("config")) {
    PLEXUS_ASSIGN_OR_RETURN(config, Arg(r, "config"));
  } else if (kind != old->kind()) {
    config = "{}";
    config_from = "defaults of the new kind";
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = t->configs.find(name);
    if (it == t->configs.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "engine '", name, "' on '", t->name,
          "' was not attached through this endpoint, so its configuration is unknown here: give "
          "the new version's configuration (config=JSON)"));
    }
    config = it->second.dump();
    config_from = "kept";
  }
  PLEXUS_ASSIGN_OR_RETURN(auto next, Make(kind, name, config, *t));
  PLEXUS_ASSIGN_OR_RETURN(EngineSwapReport rep, chain->Upgrade(name, next));
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->configs[name] = Json::parse(config, nullptr, false);
  }
  return Dump(Json{{"engine", EngineJson(*next)},
                   {"from_version", old->version()},
                   {"config", Json::parse(config, nullptr, false)},
                   {"config_from", config_from},
                   {"pause_us", Micros(rep.pause)},
                   {"drain_us", Micros(rep.drain)}});
}

absl::StatusOr<std::string> RpcAdmin::Metrics(const AdminRequest& r) const {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {"target"}));
  std::vector<std::shared_ptr<Target>> targets;
  if (r.args.contains("target")) {
    PLEXUS_ASSIGN_OR_RETURN(auto t, Find(r));
    targets.push_back(t);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, t] : targets_) targets.push_back(t);
  }
  Json out = Json::object();
  for (const auto& t : targets) {
    auto chain = t->chain();
    if (!chain.ok()) continue;
    Json engines = Json::object();
    for (const std::string& n : (*chain)->Names()) {
      auto p = (*chain)->Find(n);
      if (p == nullptr || p->kind() != "metrics") continue;
      engines[n] = EngineJson(*p)["state"];
    }
    out[t->name] = engines;
  }
  return Dump(out);
}

}  // namespace plexus::rpc
