// Global QoS: QosPolicy (the classifying engine) and QosQueue (the server's reorder point).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/qos.hpp"
#include "qos_queue.hpp"

namespace plexus::rpc {
namespace bj = base::json;

absl::Status QosPolicy::Check(const std::string& name, const QosOptions& o) {
  if (o.schedule.max_concurrent == 0 || o.schedule.latency_burst == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("qos '", name, "': max_concurrent and latency_burst must be >= 1 (got ",
                     o.schedule.max_concurrent, " and ", o.schedule.latency_burst, ")"));
  }
  if (o.schedule.max_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("qos '", name, "': max_wait is negative"));
  }
  for (const std::string& m : o.latency_methods) {
    if (m.find('/') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("qos '", name, "': latency_methods entry '", m,
                                                     "' is not \"package.Service/Method\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<QosPolicy>> QosPolicy::Create(std::string name, QosOptions options) {
  PLEXUS_RETURN_IF_ERROR(Check(name, options));
  return std::shared_ptr<QosPolicy>(new QosPolicy(std::move(name), std::move(options)));
}

std::optional<QosVerdict> QosPolicy::Classify(const CallInfo& call) {
  std::lock_guard<std::mutex> lock(mu_);
  QosVerdict v;
  v.schedule = options_.schedule;
  std::optional<QosClass> cls;
  if (!options_.metadata_key.empty() && call.metadata != nullptr) {
    for (const auto& [k, value] : *call.metadata) {
      if (k != options_.metadata_key) continue;
      if (value == "latency") cls = QosClass::kLatency;
      if (value == "bulk") cls = QosClass::kBulk;
      break;
    }
  }
  if (!cls && call.service != nullptr && call.method != nullptr &&
      !options_.latency_methods.empty()) {
    const std::string key = absl::StrCat(call.service->full_name, "/", call.method->name);
    if (std::find(options_.latency_methods.begin(), options_.latency_methods.end(), key) !=
        options_.latency_methods.end()) {
      cls = QosClass::kLatency;
    }
  }
  if (!cls && options_.small_bytes > 0 && call.request_bytes <= options_.small_bytes) {
    cls = QosClass::kLatency;
  }
  v.cls = cls.value_or(QosClass::kBulk);
  ++(v.cls == QosClass::kLatency ? latency_ : bulk_);
  return v;
}

absl::Status QosPolicy::Configure(std::string_view json_config) {
  const std::string where = absl::StrCat("qos '", name_, "' configuration");
  bj::Json j = bj::Json::parse(json_config.begin(), json_config.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object such as {\"small_bytes\": 256}"));
  }
  PLEXUS_RETURN_IF_ERROR(
      bj::CheckKeys(j, where,
                    {"metadata_key", "latency_methods", "small_bytes", "max_concurrent",
                     "latency_burst", "max_wait_ms", "max_in_flight"}));
  QosOptions o = options();
  PLEXUS_ASSIGN_OR_RETURN(o.metadata_key,
                          bj::StringField(j, where, "metadata_key", false, o.metadata_key));
  if (j.contains("latency_methods")) {
    PLEXUS_ASSIGN_OR_RETURN(const bj::Json* ms, bj::ArrayField(j, where, "latency_methods", true));
    o.latency_methods.clear();
    for (size_t i = 0; i < ms->size(); ++i) {
      if (!(*ms)[i].is_string()) {
        return bj::Invalid(bj::Index(bj::Child(where, "latency_methods"), i), "expected a string");
      }
      o.latency_methods.push_back((*ms)[i].get<std::string>());
    }
  }
  auto count = [&](std::string_view key, int64_t min, int64_t fallback) -> absl::StatusOr<int64_t> {
    PLEXUS_ASSIGN_OR_RETURN(int64_t v, bj::IntegerField(j, where, key, false, fallback));
    if (v < min || v > (int64_t{1} << 40)) {
      return bj::Invalid(bj::Child(where, key), absl::StrCat("expected an integer >= ", min));
    }
    return v;
  };
  PLEXUS_ASSIGN_OR_RETURN(int64_t small,
                          count("small_bytes", 0, static_cast<int64_t>(o.small_bytes)));
  PLEXUS_ASSIGN_OR_RETURN(int64_t conc, count("max_concurrent", 1, o.schedule.max_concurrent));
  PLEXUS_ASSIGN_OR_RETURN(int64_t burst, count("latency_burst", 1, o.schedule.latency_burst));
  PLEXUS_ASSIGN_OR_RETURN(int64_t in_flight, count("max_in_flight", 0, o.schedule.max_in_flight));
  PLEXUS_ASSIGN_OR_RETURN(int64_t wait,
                          count("max_wait_ms", 0, absl::ToInt64Milliseconds(o.schedule.max_wait)));
  o.small_bytes = static_cast<size_t>(small);
  o.schedule.max_concurrent = static_cast<uint32_t>(std::min<int64_t>(conc, UINT32_MAX));
  o.schedule.latency_burst = static_cast<uint32_t>(std::min<int64_t>(burst, UINT32_MAX));
  o.schedule.max_in_flight = static_cast<uint32_t>(std::min<int64_t>(in_flight, UINT32_MAX));
  if (j.contains("max_wait_ms")) o.schedule.max_wait = absl::Milliseconds(wait);
  PLEXUS_RETURN_IF_ERROR(Check(name_, o));
  std::lock_guard<std::mutex> lock(mu_);
  options_ = std::move(o);
  return absl::OkStatus();
}

std::string QosPolicy::DescribeJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  bj::Json j{{"metadata_key", options_.metadata_key},
             {"latency_methods", options_.latency_methods},
             {"small_bytes", options_.small_bytes},
             {"max_concurrent", options_.schedule.max_concurrent},
             {"latency_burst", options_.schedule.latency_burst},
             {"max_wait_ms", absl::ToDoubleMilliseconds(options_.schedule.max_wait)},
             {"max_in_flight", options_.schedule.max_in_flight},
             {"latency_calls", latency_},
             {"bulk_calls", bulk_}};
  return j.dump();
}

absl::StatusOr<EngineState> QosPolicy::Decompose() const {
  EngineState state(kind(), version());
  std::lock_guard<std::mutex> lock(mu_);
  state.Put("latency", latency_);
  state.Put("bulk", bulk_);
  return state;
}

absl::Status QosPolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t latency, state.Get<uint64_t>("latency"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t bulk, state.Get<uint64_t>("bulk"));
  std::lock_guard<std::mutex> lock(mu_);
  latency_ += latency;
  bulk_ += bulk;
  return absl::OkStatus();
}

QosOptions QosPolicy::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

uint64_t QosPolicy::latency_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latency_;
}

uint64_t QosPolicy::bulk_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bulk_;
}

namespace internal {

void QosQueue::Push(QosClass cls, const QosSchedule* schedule, Job job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) {
    lock.unlock();
    job.drop();  // outside the lock: it finishes the call, which calls Done()
    return;
  }
  if (schedule != nullptr) order_.set_schedule(*schedule);
  order_.Push(cls, std::move(job), absl::Now());
  ++pending_;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  cv_.notify_all();
}

bool QosQueue::Busy() const { return pending_.load() > 0; }

void QosQueue::Done() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ > 0) --running_;
  cv_.notify_all();
}

QosQueue::Stats QosQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& c = order_.counts();
  Stats s;
  s.latency = c.latency;
  s.bulk = c.bulk;
  s.aged = c.aged;
  s.shared = c.shared;
  s.max_queued = c.max_queued;
  s.queued = order_.size();
  s.running = running_;
  return s;
}

void QosQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] {
      return stop_ || (!order_.empty() && running_ < order_.schedule().max_concurrent);
    });
    if (stop_) break;
    Job job = std::move(*order_.Pop(absl::Now()));
    ++running_;
    lock.unlock();
    job.run();
    job = {};
    lock.lock();
    --pending_;
  }
}

void QosQueue::Stop() {
  std::vector<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    order_.Extract([](const Job&) { return true; }, &dropped);
    pending_ -= dropped.size();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  for (auto& j : dropped) j.drop();
}

}  // namespace internal
}  // namespace plexus::rpc
