// AdmissionPolicy: refuse calls beyond N outstanding per connection or per method.
#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/policies.hpp"

namespace plexus::rpc {

absl::StatusOr<std::shared_ptr<AdmissionPolicy>> AdmissionPolicy::Create(std::string name,
                                                                         AdmissionOptions options) {
  if (options.max_outstanding == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy '", name, "': admission max_outstanding must be >= 1"));
  }
  return std::shared_ptr<AdmissionPolicy>(new AdmissionPolicy(std::move(name), options));
}

uint64_t AdmissionPolicy::MethodKey(const CallInfo& call) {
  if (call.service == nullptr || call.method == nullptr) return 0;
  return (uint64_t{call.service->id} << 32) | call.method->id;
}

uint64_t AdmissionPolicy::Key(const CallInfo& call) const {
  return options_.scope == AdmissionOptions::Scope::kMethod ? MethodKey(call) : call.connection_id;
}

absl::Status AdmissionPolicy::OnRequest(const CallInfo& call) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t key = Key(call);
  uint64_t& n = counts_[key];
  if (n >= options_.max_outstanding) {
    ++refused_;
    const bool per_method = options_.scope == AdmissionOptions::Scope::kMethod;
    return absl::ResourceExhaustedError(absl::StrCat(
        "admission '", name_, "': ", call.service ? call.service->full_name : "?", "/",
        call.method ? call.method->name : "?", " refused: ", n, " calls outstanding ",
        per_method ? std::string("for the method") : absl::StrCat("on connection ", key),
        " (limit ", options_.max_outstanding, ")"));
  }
  ++n;
  ++admitted_;
  calls_[&call] = key;
  return absl::OkStatus();
}

void AdmissionPolicy::OnComplete(const CallInfo& call, const absl::Status& status) {
  (void)status;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(&call);
  if (it == calls_.end()) return;  // refused here or before reaching this engine
  auto c = counts_.find(it->second);
  if (c != counts_.end() && --c->second == 0) counts_.erase(c);
  calls_.erase(it);
}

absl::Status AdmissionPolicy::Configure(std::string_view json_config) {
  namespace bj = base::json;
  const std::string where = absl::StrCat("admission '", name_, "' configuration");
  bj::Json j = bj::Json::parse(json_config.begin(), json_config.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object such as {\"max_outstanding\": 16}"));
  }
  PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"max_outstanding"}));
  PLEXUS_ASSIGN_OR_RETURN(double d, bj::NumberField(j, where, "max_outstanding", true));
  if (!(d >= 1) || d > 1e12 || d != static_cast<double>(static_cast<uint64_t>(d))) {
    return bj::Invalid(bj::Child(where, "max_outstanding"), "expected an integer >= 1");
  }
  std::lock_guard<std::mutex> lock(mu_);
  options_.max_outstanding = static_cast<uint64_t>(d);
  return absl::OkStatus();
}

std::string AdmissionPolicy::DescribeJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrCat("{\"max_outstanding\":", options_.max_outstanding, ",\"scope\":\"",
                      options_.scope == AdmissionOptions::Scope::kMethod ? "method" : "connection",
                      "\",\"outstanding\":", calls_.size(), ",\"admitted\":", admitted_,
                      ",\"refused\":", refused_, "}");
}

absl::StatusOr<EngineState> AdmissionPolicy::Decompose() const {
  EngineState state(kind(), version());
  std::lock_guard<std::mutex> lock(mu_);
  state.Put("admitted_calls", calls_);
  state.Put("admitted", admitted_);
  state.Put("refused", refused_);
  return state;
}

absl::Status AdmissionPolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  using Calls = absl::flat_hash_map<const CallInfo*, uint64_t>;
  PLEXUS_ASSIGN_OR_RETURN(Calls calls, state.Get<Calls>("admitted_calls"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t admitted, state.Get<uint64_t>("admitted"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t refused, state.Get<uint64_t>("refused"));
  std::lock_guard<std::mutex> lock(mu_);
  // The old version's calls are in flight under the old scope's keys; recount them under ours.
  for (const auto& [info, key] : calls) {
    const uint64_t mine = Key(*info);
    calls_[info] = mine;
    ++counts_[mine];
  }
  admitted_ += admitted;
  refused_ += refused;
  return absl::OkStatus();
}

uint64_t AdmissionPolicy::admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_;
}

uint64_t AdmissionPolicy::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

uint64_t AdmissionPolicy::outstanding(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(key);
  return it == counts_.end() ? 0 : it->second;
}

}  // namespace plexus::rpc
