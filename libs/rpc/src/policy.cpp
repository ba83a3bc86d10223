#include "plexus/rpc/policy.hpp"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"

namespace plexus::rpc {
namespace {
constexpr std::string_view kFixed[] = {"frontend", "marshal", "transport"};
bool IsFixed(std::string_view n) {
  return std::find(std::begin(kFixed), std::end(kFixed), n) != std::end(kFixed);
}
}  // namespace

EngineChain::EngineChain()
    : policies_(std::make_shared<const std::vector<std::shared_ptr<Policy>>>()) {}

std::vector<std::string> EngineChain::Names() const {
  Snapshot s = snapshot();
  std::vector<std::string> names{"frontend"};
  for (const auto& p : *s) names.push_back(p->name());
  names.push_back("marshal");
  names.push_back("transport");
  return names;
}

absl::Status EngineChain::Attach(std::shared_ptr<Policy> policy, std::string_view after) {
  if (policy == nullptr) return absl::InvalidArgumentError("Attach: null policy");
  const std::string name = policy->name();
  std::lock_guard<std::mutex> lock(mu_);
  auto next = std::make_shared<std::vector<std::shared_ptr<Policy>>>(*policies_);
  if (IsFixed(name) ||
      std::any_of(next->begin(), next->end(), [&](const auto& p) { return p->name() == name; })) {
    return absl::AlreadyExistsError(
        absl::StrCat("an engine named '", name, "' is already in the chain"));
  }
  size_t at;
  if (after == "frontend") {
    at = 0;
  } else if (after == "marshal" || after == "transport") {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot attach '", name, "' after '", std::string(after),
                     "': policies run on typed messages, before marshalling"));
  } else {
    auto it =
        std::find_if(next->begin(), next->end(), [&](const auto& p) { return p->name() == after; });
    if (it == next->end()) {
      return absl::NotFoundError(
          absl::StrCat("no engine named '", std::string(after), "' to attach '", name, "' after"));
    }
    at = static_cast<size_t>(it - next->begin()) + 1;
  }
  next->insert(next->begin() + static_cast<std::ptrdiff_t>(at), std::move(policy));
  policies_ = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Policy>> EngineChain::Detach(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (IsFixed(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(name), "' is a fixed engine and cannot be detached"));
  }
  auto next = std::make_shared<std::vector<std::shared_ptr<Policy>>>(*policies_);
  auto it =
      std::find_if(next->begin(), next->end(), [&](const auto& p) { return p->name() == name; });
  if (it == next->end()) {
    return absl::NotFoundError(absl::StrCat("no engine named '", std::string(name), "'"));
  }
  std::shared_ptr<Policy> p = *it;
  next->erase(it);
  policies_ = std::move(next);
  return p;
}

std::shared_ptr<Policy> EngineChain::Find(std::string_view name) const {
  Snapshot s = snapshot();
  for (const auto& p : *s) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

EngineChain::Snapshot EngineChain::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policies_;
}

double MetricsPolicy::MethodMetrics::QuantileUpperUs(double q) const {
  uint64_t total = 0;
  for (uint64_t c : latency_us) total += c;
  if (total == 0) return 0;
  const double want = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += latency_us[b];
    if (static_cast<double>(seen) >= want) return b == 0 ? 1.0 : static_cast<double>(1ull << b);
  }
  return static_cast<double>(1ull << (kBuckets - 1));
}

void MetricsPolicy::OnComplete(const CallInfo& call, const absl::Status& status) {
  const int64_t us = absl::ToInt64Microseconds(absl::Now() - call.start);
  int bucket = us <= 0 ? 0 : std::bit_width(static_cast<uint64_t>(us));
  bucket = std::min(bucket, kBuckets - 1);
  std::string key = absl::StrCat(call.service ? call.service->full_name : "?", "/",
                                 call.method ? call.method->name : "?");
  std::lock_guard<std::mutex> lock(mu_);
  MethodMetrics& m = methods_[key];
  ++m.calls;
  if (!status.ok()) ++m.errors;
  m.request_bytes += call.request_bytes;
  m.response_bytes += call.response_bytes;
  ++m.latency_us[bucket];
}

std::map<std::string, MetricsPolicy::MethodMetrics> MetricsPolicy::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return methods_;
}

std::string MetricsPolicy::ToJson() const {
  auto all = Get();
  std::string out = "{";
  bool first = true;
  for (const auto& [k, m] : all) {
    absl::StrAppend(&out, first ? "" : ",", "\"", k, "\":{\"calls\":", m.calls,
                    ",\"errors\":", m.errors, ",\"request_bytes\":", m.request_bytes,
                    ",\"response_bytes\":", m.response_bytes,
                    ",\"latency_us_p50\":", m.QuantileUpperUs(0.5),
                    ",\"latency_us_p99\":", m.QuantileUpperUs(0.99), ",\"latency_us_buckets\":[");
    for (int b = 0; b < kBuckets; ++b) absl::StrAppend(&out, b ? "," : "", m.latency_us[b]);
    out += "]}";
    first = false;
  }
  return out + "}";
}

}  // namespace plexus::rpc
