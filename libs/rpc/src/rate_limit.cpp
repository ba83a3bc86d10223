#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "plexus/base/clock.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/thread_counter.hpp"
#include "plexus/base/wait_policy.hpp"
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

// Tokens a thread took from a bucket ahead of its calls (one line per base::ThisThreadLine()):
// its next calls spend them with a load and a store to a line of its own, no lock, no clock read.
// Both counts are written by the line's owner only (`granted` under the bucket's lock), read by
// anyone; a line passes to a later thread with its tokens.
struct alignas(64) RateLimitLease {
  std::atomic<uint64_t> granted{0};
  std::atomic<uint64_t> used{0};
};

namespace {
// A lease is at most this many tokens and this much of the rate, at most a quarter of the burst,
// and is taken only while the bucket keeps half its burst after it: near the limit every call
// goes through the bucket, and tokens idle in leases can hold back at most half a burst.
constexpr uint64_t kMaxLease = 64;
constexpr double kLeaseSeconds = 1e-3;

uint64_t LeaseSize(double rate, double burst) {
  if (std::isinf(rate)) return kMaxLease;
  const double n = std::min({static_cast<double>(kMaxLease), rate * kLeaseSeconds, burst / 4});
  return n >= 2 ? static_cast<uint64_t>(n) : 0;
}
}  // namespace

// One bucket. A spin lock, not a mutex: a call holds it for a refill's arithmetic (tens of
// nanoseconds), and the rate and burst live here so that the call reads nothing else under it.
struct RateLimitPolicy::Slot {
  explicit Slot(uint64_t key) : key(key) {}

  // A holder preempted on a host with more threads than CPUs would keep a pure spinner spinning
  // for its time slice: after a short spin the waiter yields its CPU.
  void Lock() {
    int spins = 0;
    while (locked.exchange(true, std::memory_order_acquire)) {
      while (locked.load(std::memory_order_relaxed)) {
        if (++spins < 128) {
          base::WaitPolicy::CpuRelax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void Unlock() { locked.store(false, std::memory_order_release); }

  // `ticks_per_second`: the rate of the ticks Refill is given.
  void Set(double new_rate, double new_burst, double ticks_per_second) {
    rate = new_rate;
    burst = new_burst;
    per_tick = rate / ticks_per_second;
    lease_size = LeaseSize(rate, burst);
  }

  // Tokens granted to leases and not yet spent (under the lock). Lines found spent leave the
  // mask: their owner takes the lock again before spending more.
  double Leased() {
    if (lease_mask == 0) return 0;
    RateLimitLease* ls = leases.load(std::memory_order_relaxed);
    uint64_t sum = 0;
    for (uint64_t m = lease_mask; m != 0; m &= m - 1) {
      const int i = __builtin_ctzll(m);
      const uint64_t granted = ls[i].granted.load(std::memory_order_relaxed);
      const uint64_t used = ls[i].used.load(std::memory_order_relaxed);
      if (used >= granted) {
        lease_mask &= ~(uint64_t{1} << i);
      } else {
        sum += granted - used;
      }
    }
    return static_cast<double>(sum);
  }

  // Refilled at `rate` (infinite: full) up to `now` ticks, capped at `burst` less the tokens
  // held in leases (so that the bucket and its leases never hold more than a burst); a fresh
  // bucket (new, or not in a restored state) is full.
  void Refill(int64_t now) {
    const double cap = burst - Leased();
    if (fresh) {
      tokens = cap;
      last = now;
      fresh = false;
      return;
    }
    if (std::isinf(rate)) {
      tokens = cap;
    } else if (now > last) {
      tokens = std::min(cap, tokens + per_tick * static_cast<double>(now - last));
    } else {
      tokens = std::min(cap, tokens);
    }
    // Reads on two CPUs may disagree slightly: time never runs backwards for a bucket.
    last = std::max(last, now);
  }

  // After this thread's call took its token: a lease of lease_size tokens for `line`, when the
  // bucket can spare it (an infinite rate always can).
  void MaybeLease(int line) {
    if (lease_size == 0 || line >= base::kThreadLines) return;
    const bool infinite = std::isinf(rate);
    if (!infinite && tokens - static_cast<double>(lease_size) < burst / 2) return;
    RateLimitLease* ls = leases.load(std::memory_order_relaxed);
    if (ls == nullptr) {
      ls = new RateLimitLease[base::kThreadLines];
      lease_lines.reset(ls);
      leases.store(ls, std::memory_order_release);
    }
    // The owner's own count: exact here, whatever a revocation left in `granted`.
    RateLimitLease& l = ls[line];
    l.granted.store(l.used.load(std::memory_order_relaxed) + lease_size, std::memory_order_relaxed);
    // An infinite rate's leases come from no bucket: they hold nothing back.
    if (!infinite) {
      lease_mask |= uint64_t{1} << line;
      tokens -= static_cast<double>(lease_size);
    }
  }

  // New settings apply to every later call: the tokens left in leases are dropped (a call that
  // read its lease before this may still spend one: it ran beside the change).
  void RevokeLeases() {
    RateLimitLease* ls = leases.load(std::memory_order_relaxed);
    if (ls == nullptr) return;
    for (int i = 0; i < base::kThreadLines; ++i) {
      ls[i].granted.store(ls[i].used.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    lease_mask = 0;
  }

  // Calls admitted by the bucket and by every lease.
  uint64_t Admitted() const {
    uint64_t sum = admitted.load(std::memory_order_relaxed);
    if (const RateLimitLease* ls = leases.load(std::memory_order_acquire)) {
      for (int i = 0; i < base::kThreadLines; ++i)
        sum += ls[i].used.load(std::memory_order_relaxed);
    }
    return sum;
  }

  const uint64_t key;
  std::atomic<bool> locked{false};
  // Under the lock:
  bool fresh = true;
  double tokens = 0;
  int64_t last = 0;  // ticks of NowTicks()
  double rate = 0, burst = 1;
  double per_tick = 0;      // tokens per tick: rate / ticks per second
  uint64_t lease_size = 0;  // LeaseSize(rate, burst)
  uint64_t lease_mask = 0;  // lines that may hold unspent tokens of a finite rate
  std::unique_ptr<RateLimitLease[]> lease_lines;  // made with the first lease
  // lease_lines, read by calls without the lock.
  std::atomic<RateLimitLease*> leases{nullptr};
  // Written only under the lock (a plain increment, not a locked one), read by admitted().
  std::atomic<uint64_t> admitted{0};
};

RateLimitPolicy::RateLimitPolicy(std::string name, RateLimitOptions options)
    : name_(std::move(name)),
      options_(std::move(options)),
      ticks_per_second_(options_.clock ? 1e9 : base::TicksPerSecond()) {}

RateLimitPolicy::~RateLimitPolicy() = default;

absl::StatusOr<std::shared_ptr<RateLimitPolicy>> RateLimitPolicy::Create(std::string name,
                                                                         RateLimitOptions options) {
  if (absl::Status s = CheckRate(options.rate, options.burst); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", name, "': ", s.message()));
  }
  return std::shared_ptr<RateLimitPolicy>(new RateLimitPolicy(std::move(name), std::move(options)));
}

absl::Time RateLimitPolicy::Now() const {
  return options_.clock ? options_.clock() : base::WallNow();
}

int64_t RateLimitPolicy::NowTicks() const {
  return options_.clock ? absl::ToUnixNanos(options_.clock()) : base::TickNow();
}

RateLimitPolicy::Slot& RateLimitPolicy::SlotFor(uint64_t key) {
  Slot* last = last_.load(std::memory_order_acquire);
  if (last != nullptr && last->key == key) return *last;
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Slot>& slot = slots_[key];
  if (slot == nullptr) {
    slot = std::make_unique<Slot>(key);
    slot->Set(options_.rate, options_.burst, ticks_per_second_);
  }
  last_.store(slot.get(), std::memory_order_release);
  return *slot;
}

uint64_t RateLimitPolicy::admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t sum = restored_admitted_;
  for (const auto& [key, slot] : slots_) sum += slot->Admitted();
  return sum;
}

absl::Status RateLimitPolicy::Reconfigure(double rate, double burst) {
  if (absl::Status s = CheckRate(rate, burst); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", name_, "': ", s.message()));
  }
  const int64_t now = NowTicks();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, slot] : slots_) {
    slot->Lock();
    slot->RevokeLeases();
    // Settle the old rate's refill up to now first; an infinite rate kept every bucket full.
    if (!slot->fresh) {
      slot->Refill(now);
      slot->tokens = std::min(slot->tokens, burst);
    }
    slot->Set(rate, burst, ticks_per_second_);
    slot->Unlock();
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
  const uint64_t admitted = this->admitted();
  std::lock_guard<std::mutex> lock(mu_);
  size_t buckets = 0;
  for (const auto& [key, slot] : slots_) {
    slot->Lock();
    buckets += slot->fresh ? 0 : 1;
    slot->Unlock();
  }
  return absl::StrCat(
      "{\"rate\":",
      std::isinf(options_.rate) ? std::string("\"inf\"") : absl::StrCat(options_.rate),
      ",\"burst\":", options_.burst, ",\"scope\":\"",
      options_.scope == RateLimitOptions::Scope::kMethod ? "method" : "connection",
      "\",\"over_limit\":\"",
      options_.over_limit == RateLimitOptions::OverLimit::kWait ? "wait" : "fail",
      "\",\"buckets\":", buckets, ",\"admitted\":", admitted, ",\"rejected\":", rejected_.load(),
      "}");
}

absl::StatusOr<EngineState> RateLimitPolicy::Decompose() const {
  EngineState state(kind(), version());
  // Every bucket settled up to now, so its time is now's.
  const absl::Time now_time = Now();
  const int64_t now = NowTicks();
  absl::flat_hash_map<uint64_t, Bucket> buckets;
  const uint64_t admitted = this->admitted();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, slot] : slots_) {
      slot->Lock();
      if (!slot->fresh) {
        slot->Refill(now);
        buckets[key] = Bucket{slot->tokens, now_time};
      }
      slot->Unlock();
    }
  }
  state.Put("buckets", std::move(buckets));
  state.Put("admitted", admitted);
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
  // is still granted (never beyond now). Buckets the state does not hold start full again.
  const absl::Time now_time = Now();
  const int64_t now = NowTicks();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, slot] : slots_) {
    slot->Lock();
    slot->fresh = true;
    slot->RevokeLeases();
    slot->Unlock();
  }
  for (const auto& [key, b] : buckets) {
    std::unique_ptr<Slot>& slot = slots_[key];
    if (slot == nullptr) slot = std::make_unique<Slot>(key);
    const double ago = std::max(0.0, absl::ToDoubleSeconds(now_time - b.last)) * ticks_per_second_;
    slot->Lock();
    slot->Set(options_.rate, options_.burst, ticks_per_second_);
    slot->fresh = false;
    slot->tokens = std::min(b.tokens, options_.burst);
    slot->last = now - static_cast<int64_t>(std::min(ago, 1e18));
    slot->Unlock();
  }
  restored_admitted_ += admitted;
  rejected_ += rejected;
  return absl::OkStatus();
}

absl::Status RateLimitPolicy::OnRequest(const CallInfo& call) {
  const bool per_method = options_.scope == RateLimitOptions::Scope::kMethod;
  uint64_t key = call.connection_id;
  if (per_method && call.service != nullptr && call.method != nullptr) {
    key = (uint64_t{call.service->id} << 32) | call.method->id;
  }
  Slot& b = SlotFor(key);
  const int line = base::ThisThreadLine();
  if (RateLimitLease* ls = b.leases.load(std::memory_order_acquire);
      ls != nullptr && line < base::kThreadLines) {
    RateLimitLease& l = ls[line];
    const uint64_t used = l.used.load(std::memory_order_relaxed);
    if (used < l.granted.load(std::memory_order_relaxed)) {
      l.used.store(used + 1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
  }
  const int64_t ticks = NowTicks();
  absl::Duration wait;
  absl::Time now;  // read only over the limit: the deadline's comparisons need the wall clock
  double rate, burst;
  b.Lock();
  b.Refill(ticks);
  rate = b.rate;
  burst = b.burst;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    b.admitted.store(b.admitted.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    b.MaybeLease(line);
    b.Unlock();
    return absl::OkStatus();
  }
  wait = absl::Seconds((1 - b.tokens) / rate);
  now = Now();
  const bool reserve =
      options_.over_limit == RateLimitOptions::OverLimit::kWait && now + wait <= call.deadline;
  if (reserve) b.tokens -= 1;  // the next caller waits behind this one
  b.Unlock();
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
  b.Lock();
  b.admitted.store(b.admitted.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  b.Unlock();
  return absl::OkStatus();
}

}  // namespace plexus::rpc
