#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "plexus/base/clock.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/rpc/policies.hpp"

namespace plexus::rpc {
namespace {
absl::Status CheckRate(double rate, double burst) {
  if (!(rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate limit: rate must be > 0 calls/s (infinity: unlimited), not ", rate));
  }
  if (!(burst >= 1) || std::isinf(burst)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate limit: burst must be a finite number >= 1, not ", burst));
  }
  return absl::OkStatus();
}
}  // namespace

RateLimitPolicy::RateLimitPolicy(std::string name, RateLimitOptions options)
    : name_(std::move(name)), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<RateLimitPolicy>> RateLimitPolicy::Create(std::string name,
                                                                         RateLimitOptions options) {
  if (absl::Status s = CheckRate(options.rate, options.burst); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", name, "': ", s.message()));
  }
  if (!options.clock)
    base::TicksPerSecond();  // the clock's one-off calibration, here, not in a call
  return std::shared_ptr<RateLimitPolicy>(new RateLimitPolicy(std::move(name), std::move(options)));
}

absl::Time RateLimitPolicy::Now() const {
  return options_.clock ? options_.clock() : base::WallNow();
}

int64_t RateLimitPolicy::NowTicks() const {
  return options_.clock ? absl::ToUnixNanos(options_.clock()) : base::TickNow();
}

double RateLimitPolicy::TicksPerSecond() const {
  return options_.clock ? 1e9 : base::TicksPerSecond();
}

void RateLimitPolicy::Refill(Live& b, int64_t now, double rate, double burst) const {
  if (std::isinf(rate)) {
    b.tokens = burst;
  } else if (now > b.last) {
    b.tokens =
        std::min(burst, b.tokens + rate * (static_cast<double>(now - b.last) / TicksPerSecond()));
  }
  // Reads on two CPUs may disagree slightly: time never runs backwards for a bucket.
  b.last = std::max(b.last, now);
}

absl::Status RateLimitPolicy::Reconfigure(double rate, double burst) {
  if (absl::Status s = CheckRate(rate, burst); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", name_, "': ", s.message()));
  }
  const int64_t now = NowTicks();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, b] : buckets_) {
    // Settle the old rate's refill up to now first; an infinite rate kept every bucket full.
    Refill(b, now, options_.rate, options_.burst);
    b.tokens = std::min(b.tokens, burst);
  }
  options_.rate = rate;
  options_.burst = burst;
  return absl::OkStatus();
}

absl::Status RateLimitPolicy::Configure(std::string_view json_config) {
  namespace bj = base::json;
  const std::string where = absl::StrCat("rate limit '", name_, "' configuration");
  bj::Json j = bj::Json::parse(json_config.begin(), json_config.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   ": expected a JSON object such as "
                                                   "{\"rate\": 100, \"burst\": 10}"));
  }
  PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(j, where, {"rate", "burst"}));
  double rate, burst;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rate = options_.rate;
    burst = options_.burst;
  }
  if (auto it = j.find("rate"); it != j.end()) {
    if (it->is_string() && it->get<std::string>() == "inf") {
      rate = std::numeric_limits<double>::infinity();
    } else {
      PLEXUS_ASSIGN_OR_RETURN(rate, bj::NumberField(j, where, "rate", true));
    }
  }
  if (j.contains("burst")) {
    PLEXUS_ASSIGN_OR_RETURN(burst, bj::NumberField(j, where, "burst", true));
  }
  return Reconfigure(rate, burst);
}

std::string RateLimitPolicy::DescribeJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrCat(
      "{\"rate\":",
      std::isinf(options_.rate) ? std::string("\"inf\"") : absl::StrCat(options_.rate),
      ",\"burst\":", options_.burst, ",\"scope\":\"",
      options_.scope == RateLimitOptions::Scope::kMethod ? "method" : "connection",
      "\",\"over_limit\":\"",
      options_.over_limit == RateLimitOptions::OverLimit::kWait ? "wait" : "fail",
      "\",\"buckets\":", buckets_.size(), ",\"admitted\":", admitted_.load(),
      ",\"rejected\":", rejected_.load(), "}");
}

absl::StatusOr<EngineState> RateLimitPolicy::Decompose() const {
  EngineState state(kind(), version());
  // Every bucket settled up to now, so its time is now's.
  const absl::Time now_time = Now();
  const int64_t now = NowTicks();
  absl::flat_hash_map<uint64_t, Bucket> buckets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, live] : buckets_) {
      Live b = live;
      Refill(b, now, options_.rate, options_.burst);
      buckets[key] = Bucket{b.tokens, now_time};
    }
  }
  state.Put("buckets", std::move(buckets));
  state.Put("admitted", admitted_.load());
  state.Put("rejected", rejected_.load());
  return state;
}

absl::Status RateLimitPolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  PLEXUS_ASSIGN_OR_RETURN(auto buckets,
                          (state.Get<absl::flat_hash_map<uint64_t, Bucket>>("buckets")));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t admitted, state.Get<uint64_t>("admitted"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t rejected, state.Get<uint64_t>("rejected"));
  // Each bucket's time as ticks of this limiter's clock: the refill since the state was taken
  // is still granted (never beyond now).
  const absl::Time now_time = Now();
  const int64_t now = NowTicks();
  const double per_second = TicksPerSecond();
  std::lock_guard<std::mutex> lock(mu_);
  buckets_.clear();
  for (const auto& [key, b] : buckets) {
    const double ago = std::max(0.0, absl::ToDoubleSeconds(now_time - b.last)) * per_second;
    buckets_[key] =
        Live{std::min(b.tokens, options_.burst), now - static_cast<int64_t>(std::min(ago, 1e18))};
  }
  admitted_ += admitted;
  rejected_ += rejected;
  return absl::OkStatus();
}

absl::Status RateLimitPolicy::OnRequest(const CallInfo& call) {
  const bool per_method = options_.scope == RateLimitOptions::Scope::kMethod;
  uint64_t key = call.connection_id;
  if (per_method && call.service != nullptr && call.method != nullptr) {
    key = (uint64_t{call.service->id} << 32) | call.method->id;
  }
  const int64_t ticks = NowTicks();
  absl::Duration wait;
  absl::Time now;  // read only over the limit: the deadline's comparisons need the wall clock
  double rate, burst;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rate = options_.rate;
    burst = options_.burst;
    auto [it, fresh] = buckets_.try_emplace(key);
    Live& b = it->second;
    if (fresh) {
      b.tokens = burst;
      b.last = ticks;
    } else {
      Refill(b, ticks, rate, burst);
    }
    if (b.tokens >= 1) {
      b.tokens -= 1;
      // Written only under mu_: a plain increment, not a locked one (a third of this path's
      // atomic work), read by admitted() without the lock.
      admitted_.store(admitted_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    wait = absl::Seconds((1 - b.tokens) / rate);
    now = Now();
    if (options_.over_limit == RateLimitOptions::OverLimit::kWait && now + wait <= call.deadline) {
      b.tokens -= 1;  // reserved: the next caller waits behind this one
    }
  }
  auto what = [&] {
    return absl::StrCat(call.service ? call.service->full_name : "?", "/",
                        call.method ? call.method->name : "?");
  };
  auto scope = [&] {
    return per_method ? std::string("per method")
                      : absl::StrCat("on connection ", call.connection_id);
  };
  if (options_.over_limit == RateLimitOptions::OverLimit::kFail) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat("rate limit '", name_, "': ", what(),
                                                     " is over ", rate, " calls/s (burst ", burst,
                                                     ") ", scope()));
  }
  if (now + wait > call.deadline) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return absl::DeadlineExceededError(absl::StrCat(
        "rate limit '", name_, "': ", what(), " would wait ", absl::FormatDuration(wait),
        " for a token (", rate, " calls/s ", scope(), "), past the call's deadline"));
  }
  if (options_.sleep) {
    options_.sleep(wait);
  } else {
    absl::SleepFor(wait);
  }
  std::lock_guard<std::mutex> lock(mu_);
  admitted_.store(admitted_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace plexus::rpc
