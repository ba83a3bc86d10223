#include "plexus/rpc/policy.hpp"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "plexus/base/clock.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/thread_counter.hpp"
#include "private_request.hpp"

namespace plexus::rpc {
namespace {
constexpr std::string_view kFixed[] = {"frontend", "marshal", "transport"};
bool IsFixed(std::string_view n) {
  return std::find(std::begin(kFixed), std::end(kFixed), n) != std::end(kFixed);
}
}  // namespace

absl::Status EngineState::Missing(std::string_view key) const {
  return absl::NotFoundError(absl::StrCat("the state of a '", kind_, "' engine (version ", version_,
                                          ") has no '", std::string(key), "'"));
}

absl::Status EngineState::WrongType(std::string_view key) const {
  return absl::InvalidArgumentError(absl::StrCat("the state of a '", kind_, "' engine (version ",
                                                 version_, ") holds '", std::string(key),
                                                 "' as another type than this version expects"));
}

absl::Status Policy::Configure(std::string_view json_config) {
  (void)json_config;
  return absl::UnimplementedError(
      absl::StrCat("engine '", name(), "' (", kind(), ") cannot be reconfigured"));
}

absl::Status Policy::Restore(const EngineState& state) {
  if (state.kind() != kind()) {
    return absl::InvalidArgumentError(absl::StrCat("engine '", name(), "' (", kind(), " v",
                                                   version(), ") cannot adopt the state of a '",
                                                   state.kind(), "' engine"));
  }
  return absl::OkStatus();
}

// ---- The gate ----------------------------------------------------------------------------------
// A call passes the slot's base::Gate (no atomic read-modify-write: the closer pays, see
// plexus/base/gate.hpp); a swap closes it, so a policy is never swapped under a call.

EngineSlot::EngineSlot(std::shared_ptr<Policy> policy)
    : name_(policy->name()),
      hooks_(policy->hooks()),
      content_(policy->inspects_content()),
      plans_(std::make_unique<internal::ContentPlans>()),
      policy_(std::move(policy)) {}

EngineSlot::~EngineSlot() = default;

Policy* EngineSlot::Enter() {
  gate_.Enter();
  return policy_.get();
}

void EngineSlot::Leave() { gate_.Leave(); }

absl::Status EngineSlot::OnRequest(const CallInfo& call) {
  if (!Has(kHookRequest)) return absl::OkStatus();
  Policy* p = Enter();
  absl::Status st = p->OnRequest(call);
  Leave();
  return st;
}

absl::Status EngineSlot::OnRequest(CallInfo& call, internal::PrivateRequest& copy) {
  if (!Has(kHookRequest)) return absl::OkStatus();
  Policy* p = Enter();
  absl::Status st;
  if (content_) {
    st = copy.Add(plans_->For(*p, *call.method));
    call.request = copy.message();
  }
  if (st.ok()) st = p->OnRequest(call);
  Leave();
  return st;
}

void EngineSlot::OnComplete(const CallInfo& call, const absl::Status& status) {
  if (!Has(kHookComplete)) return;
  Policy* p = Enter();
  p->OnComplete(call, status);
  Leave();
}

std::optional<uint32_t> EngineSlot::Route(const CallInfo& call, const std::vector<bool>& usable) {
  if (!Has(kHookRoute)) return std::nullopt;
  Policy* p = Enter();
  std::optional<uint32_t> r = p->Route(call, usable);
  Leave();
  return r;
}

void EngineSlot::OnLoadReport(uint32_t replica, uint32_t load) {
  if (!Has(kHookLoadReport)) return;
  Policy* p = Enter();
  p->OnLoadReport(replica, load);
  Leave();
}

std::optional<QosVerdict> EngineSlot::Classify(const CallInfo& call) {
  if (!Has(kHookClassify)) return std::nullopt;
  Policy* p = Enter();
  std::optional<QosVerdict> v = p->Classify(call);
  Leave();
  return v;
}

std::shared_ptr<Policy> EngineSlot::policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_;
}

template <typename Fn>
absl::StatusOr<EngineSwapReport> EngineSlot::Exclusive(Fn&& fn) {
  const absl::Time t0 = absl::Now();
  EngineSwapReport report;
  gate_.Close();
  report.drain = absl::Now() - t0;
  absl::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st = fn(policy_);
    hooks_.store(policy_->hooks());
    content_ = policy_->inspects_content();
    plans_->Clear();
  }
  gate_.Open();
  report.pause = absl::Now() - t0;
  if (!st.ok()) return st;
  return report;
}

// ---- The chain ---------------------------------------------------------------------------------

struct alignas(64) EngineChain::Line {
  Snapshot chain;  // null: copied from slots_ by the thread's next snapshot()
};

// Closes the lines' gate for an Attach or Detach; the closer takes mu_ only once it is closed
// (a thread inside takes mu_ to copy the chain).
class EngineChain::ClosedLines {
 public:
  explicit ClosedLines(base::Gate& gate) : gate_(gate) { gate_.Close(); }
  ~ClosedLines() { gate_.Open(); }

 private:
  base::Gate& gate_;
};

EngineChain::EngineChain()
    : slots_(std::make_shared<const std::vector<std::shared_ptr<EngineSlot>>>()) {}

EngineChain::~EngineChain() = default;

void EngineChain::ForgetLinesLocked(std::vector<Snapshot>* old) {
  if (owned_lines_ == nullptr) {
    if (slots_->empty()) return;
    owned_lines_ = std::make_unique<Line[]>(base::kThreadLines);
    lines_.store(owned_lines_.get(), std::memory_order_release);
    return;
  }
  for (int i = 0; i < base::kThreadLines; ++i) {
    if (owned_lines_[i].chain != nullptr) old->push_back(std::move(owned_lines_[i].chain));
  }
}

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
  std::vector<Snapshot> old;  // destroyed last: with the gate open and mu_ free
  ClosedLines closed(lines_gate_);
  std::lock_guard<std::mutex> lock(mu_);
  auto next = std::make_shared<std::vector<std::shared_ptr<EngineSlot>>>(*slots_);
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
  next->insert(next->begin() + static_cast<std::ptrdiff_t>(at),
               std::make_shared<EngineSlot>(std::move(policy)));
  slots_ = std::move(next);
  ForgetLinesLocked(&old);
  empty_.store(false, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Policy>> EngineChain::Detach(std::string_view name) {
  std::vector<Snapshot> old;  // destroyed last: with the gate open and mu_ free
  ClosedLines closed(lines_gate_);
  std::lock_guard<std::mutex> lock(mu_);
  if (IsFixed(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(name), "' is a fixed engine and cannot be detached"));
  }
  auto next = std::make_shared<std::vector<std::shared_ptr<EngineSlot>>>(*slots_);
  auto it =
      std::find_if(next->begin(), next->end(), [&](const auto& p) { return p->name() == name; });
  if (it == next->end()) {
    return absl::NotFoundError(absl::StrCat("no engine named '", std::string(name), "'"));
  }
  std::shared_ptr<Policy> p = (*it)->policy();
  next->erase(it);
  slots_ = std::move(next);
  ForgetLinesLocked(&old);
  empty_.store(slots_->empty(), std::memory_order_release);
  return p;
}

absl::StatusOr<EngineSwapReport> EngineChain::Upgrade(std::string_view name,
                                                      std::shared_ptr<Policy> next) {
  if (next == nullptr) return absl::InvalidArgumentError("Upgrade: null policy");
  if (next->name() != name) {
    return absl::InvalidArgumentError(absl::StrCat("upgrade of engine '", std::string(name),
                                                   "': the new version is named '", next->name(),
                                                   "' (an upgrade keeps the name)"));
  }
  std::lock_guard<std::mutex> admin(admin_mu_);
  std::shared_ptr<EngineSlot> slot = FindSlot(name);
  if (slot == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no engine named '", std::string(name), "' to upgrade"));
  }
  return slot->Exclusive([&](std::shared_ptr<Policy>& current) -> absl::Status {
    absl::StatusOr<EngineState> state = current->Decompose();
    if (!state.ok()) {
      return base::Annotate(state.status(),
                            absl::StrCat("upgrade of engine '", std::string(name), "': decompose"));
    }
    if (absl::Status st = next->Restore(*state); !st.ok()) {
      return base::Annotate(st, absl::StrCat("upgrade of engine '", std::string(name),
                                             "': restore (the old version stays)"));
    }
    current = std::move(next);
    return absl::OkStatus();
  });
}

absl::StatusOr<EngineSwapReport> EngineChain::Configure(std::string_view name,
                                                        std::string_view json_config) {
  std::lock_guard<std::mutex> admin(admin_mu_);
  std::shared_ptr<EngineSlot> slot = FindSlot(name);
  if (slot == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no engine named '", std::string(name), "' to configure"));
  }
  return slot->Exclusive(
      [&](std::shared_ptr<Policy>& current) { return current->Configure(json_config); });
}

std::shared_ptr<EngineSlot> EngineChain::FindSlot(std::string_view name) const {
  Snapshot s = snapshot();
  for (const auto& p : *s) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

std::shared_ptr<Policy> EngineChain::Find(std::string_view name) const {
  std::shared_ptr<EngineSlot> slot = FindSlot(name);
  return slot ? slot->policy() : nullptr;
}

EngineChain::Snapshot EngineChain::snapshot() const {
  if (empty_.load(std::memory_order_acquire)) {
    // The calling thread's own empty chain: taking it touches no line another thread writes. A
    // call that read `empty_` just before an Attach runs as one started before it.
    thread_local const Snapshot empty_chain =
        std::make_shared<const std::vector<std::shared_ptr<EngineSlot>>>();
    return empty_chain;
  }
  Line* lines = lines_.load(std::memory_order_acquire);
  const int i = base::ThisThreadLine();
  if (lines != nullptr && i < base::kThreadLines && lines_gate_.TryEnter()) {
    Line& line = lines[i];
    if (line.chain == nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      line.chain = std::make_shared<const std::vector<std::shared_ptr<EngineSlot>>>(*slots_);
    }
    Snapshot mine = line.chain;
    lines_gate_.Leave();
    return mine;
  }
  // Past the first kThreadLines threads, or while an Attach or Detach holds the gate.
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
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
  // A call that started while no engine of its chain read the start (this engine arrived by an
  // upgrade while it was in flight) has none: it counts, but not in the latency histogram.
  const bool timed = call.start != absl::Time();
  const int64_t us = timed ? absl::ToInt64Microseconds(base::WallNow() - call.start) : 0;
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
  if (timed) ++m.latency_us[bucket];
}

absl::StatusOr<EngineState> MetricsPolicy::Decompose() const {
  EngineState state(kind(), version());
  state.Put("methods", Get());
  return state;
}

absl::Status MetricsPolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  PLEXUS_ASSIGN_OR_RETURN(auto old, (state.Get<std::map<std::string, MethodMetrics>>("methods")));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, m] : old) {
    MethodMetrics& mine = methods_[key];
    mine.calls += m.calls;
    mine.errors += m.errors;
    mine.request_bytes += m.request_bytes;
    mine.response_bytes += m.response_bytes;
    for (int b = 0; b < kBuckets; ++b) mine.latency_us[b] += m.latency_us[b];
  }
  return absl::OkStatus();
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
