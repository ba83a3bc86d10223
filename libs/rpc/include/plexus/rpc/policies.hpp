// Policies on the engine chain (plexus/rpc/policy.hpp) beside MetricsPolicy: a token-bucket rate
// limiter, a content ACL on a typed request field, and replica balancing. Attach the first two to
// a Channel's chain (client: before the request is marshalled) or a Server's (after it is
// unmarshalled, before the handler); the balancer to a Channel over several replicas.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/base/thread_counter.hpp"
#include "plexus/rpc/balance.hpp"
#include "plexus/rpc/policy.hpp"
#include "plexus/rpc/schema.hpp"

namespace plexus::rpc {

struct RateLimitOptions {
  enum class Scope { kConnection, kMethod };  // one bucket per connection, or per method
  enum class OverLimit { kFail, kWait };      // ResourceExhausted, or wait for a token
  Scope scope = Scope::kConnection;
  OverLimit over_limit = OverLimit::kFail;
  // Tokens per second; infinity never limits (the bucket still runs: its cost is measurable).
  double rate = std::numeric_limits<double>::infinity();
  double burst = 1;  // bucket size, >= 1; a new bucket starts full
  // For tests: the clock and the sleep of kWait (default absl::Now / absl::SleepFor).
  std::function<absl::Time()> clock;
  std::function<void(absl::Duration)> sleep;
};

// Token bucket. A call over the limit fails with ResourceExhausted naming the policy, the method
// and the limit (kFail), or waits for its token (kWait: a token is reserved, so waiters are served
// in order; a wait that would end after the call's deadline fails with DeadlineExceeded at once).
// kWait blocks the thread running the chain: the caller on a Channel, the dispatcher on a Server
// (prefer kFail there). At high rates (from 2,000 calls/s and a burst of 8) a call through the
// bucket also leases its thread a few tokens (at most 64, 1 ms of the rate, a quarter of the
// burst, and only while the bucket keeps half its burst), which its next calls spend without the
// bucket's lock or a clock read; the bucket and the leases never hold more than a burst, so the
// limit holds exactly. A reconfiguration drops the tokens left in leases.
class RateLimitPolicy : public Policy {
 public:
  // InvalidArgument for a rate <= 0 or NaN, or a burst < 1.
  static absl::StatusOr<std::shared_ptr<RateLimitPolicy>> Create(std::string name,
                                                                 RateLimitOptions options);
  std::string name() const override { return name_; }
  std::string kind() const override { return "rate_limit"; }
  std::string DescribeJson() const override;
  // The limiter keeps its own time (base::TickNow(): a third of a wall-clock read on a VM), so a
  // Channel stamps no start for it.
  uint32_t hooks() const override { return kHookRequest; }
  absl::Status OnRequest(const CallInfo& call) override;
  // New rate and burst for every bucket (tokens above the new burst are dropped).
  absl::Status Reconfigure(double rate, double burst);
  // {"rate": calls/s or "inf", "burst": n}: Reconfigure; other fields are refused.
  absl::Status Configure(std::string_view json_config) override;
  // State: "buckets" (every bucket's tokens, settled at the old rate up to now: negative while
  // kWait callers hold reservations), "admitted", "rejected". Restore keeps its own rate and
  // burst and caps the tokens at its burst, so an upgrade grants no fresh burst.
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;
  uint64_t admitted() const;
  uint64_t rejected() const { return rejected_.load(); }

  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  ~RateLimitPolicy() override;

 private:
  // One bucket (rate_limit.cpp): its own spin lock, rate and burst, and its threads' leases, so
  // that a call takes no lock but its bucket's (none while its lease lasts) and finds the bucket
  // it used last without a lookup.
  struct Slot;
  RateLimitPolicy(std::string name, RateLimitOptions options);
  absl::Time Now() const;
  // Now in ticks (their rate: ticks_per_second_): the test clock's nanoseconds, else
  // base::TickNow().
  int64_t NowTicks() const;
  // The bucket of `key`, made (full) on first use.
  Slot& SlotFor(uint64_t key);

  std::string name_;
  RateLimitOptions options_;  // rate and burst: the settings of buckets made from now on
  double ticks_per_second_;
  mutable std::mutex mu_;  // slots_, options_, restored_admitted_
  absl::flat_hash_map<uint64_t, std::unique_ptr<Slot>> slots_;  // never erased before the policy
  std::atomic<Slot*> last_{nullptr};                            // the bucket used last
  uint64_t restored_admitted_ = 0;
  std::atomic<uint64_t> rejected_{0};
};

// Denies a method's calls whose request field holds one of a set of values.
struct AclRule {
  std::string name;    // named in the error
  std::string method;  // "package.Service/Method"
  // The field of the request, through singular message fields: "user" or "auth.tenant". Singular
  // or optional bool, integer, enum, string or bytes; an unset optional or message never matches.
  std::string field;
  // Denied values as text: strings and bytes verbatim, integers and enums (by number) in decimal,
  // bools as true/false.
  std::vector<std::string> deny;
};

// Fails a matching call with PermissionDenied: "acl 'NAME': rule 'RULE' denies
// package.Service/Method: field F is 'V'". It inspects content, so on a Channel it reads a private
// copy of its rules' fields, and exactly the bytes it checked are sent (docs/rpc.md).
class AclPolicy : public Policy {
 public:
  // `services` resolve the rules' methods and fields: NotFound naming the rule and the missing
  // method or field, InvalidArgument for a field of an unsupported kind or a value that does not
  // parse as the field's type.
  static absl::StatusOr<std::shared_ptr<AclPolicy>> Create(
      std::string name, const std::vector<const ServiceDesc*>& services,
      std::vector<AclRule> rules);
  std::string name() const override { return name_; }
  std::string kind() const override { return "acl"; }
  std::string DescribeJson() const override;
  bool inspects_content() const override { return true; }
  // The fields of the method's rules (none for a method without rules).
  bool ContentFields(const MethodDesc& method,
                     absl::FunctionRef<void(FieldPath)> read) const override;
  uint32_t hooks() const override { return kHookRequest; }
  absl::Status OnRequest(const CallInfo& call) override;
  // State: "checked", "denied" (the rules are the new version's configuration).
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;
  uint64_t checked() const { return checked_.Value(); }
  uint64_t denied() const { return denied_.load(); }
  ~AclPolicy() override;

  struct Compiled;

 private:
  explicit AclPolicy(std::string name);
  using MethodRules = std::pair<const MethodDesc*, std::vector<Compiled>>;
  // The rules of `method`, or null. An ACL names few methods: a scan of a sorted vector beats a
  // hash on every call.
  const std::vector<Compiled>* Find(const MethodDesc* method) const;
  // rules_ and checked_ first: what a call reads shares a cache line with the vtable pointer.
  std::vector<MethodRules> rules_;  // sorted by the method descriptor's address
  // Every checked call counts, on the calling thread's own line (no shared atomic per call).
  base::ThreadCounter checked_;
  std::atomic<uint64_t> denied_{0};
  std::string name_;
};

struct LoadBalanceOptions {
  BalancePolicy policy = BalancePolicy::kDaronpon;
  uint32_t delta = 1;  // Daronpon: redirect when another replica's load + delta < the target's
  uint64_t seed = 1;   // random, po2 and tie breaks
  // A replica's reported load older than this is dropped (its load is then this channel's own
  // calls there). Gossip is silent while a load stays within a power of two and below the floor,
  // so without this a replica last seen loaded, and therefore avoided, would never be tried
  // again: now it gets a call per `estimate_ttl`, whose response refreshes the estimate.
  absl::Duration estimate_ttl = absl::Milliseconds(100);
};

// Chooses the replica of each call of a Channel over several replicas (Channel::ConnectReplicas
// attaches one as "balance"): round robin, random, power of two choices or Daronpon, run by
// plexus::rpc::Balancer (balance.hpp), the same code as the simulator plexus-rpc-sim. The
// channel is the dispatcher: its own calls in flight to each replica are exact; each replica's
// load from all its clients is an estimate, taken from the count its server piggybacks on every
// response and gossips when the count crosses a power of two. Daronpon takes the next replica in
// turn as the call's target and redirects the call, once, to the least loaded other replica when
// that one's load + delta is below the target's (docs/rpc.md). A replica that is not connected is
// never chosen while another is.
class LoadBalancePolicy : public Policy {
 public:
  static absl::StatusOr<std::shared_ptr<LoadBalancePolicy>> Create(std::string name,
                                                                   LoadBalanceOptions options);
  std::string name() const override { return name_; }
  std::string kind() const override { return "balance"; }
  std::string DescribeJson() const override;
  uint32_t hooks() const override { return kHookRoute | kHookComplete | kHookLoadReport; }
  std::optional<uint32_t> Route(const CallInfo& call, const std::vector<bool>& usable) override;
  void OnComplete(const CallInfo& call, const absl::Status& status) override;
  void OnLoadReport(uint32_t replica, uint32_t load) override;
  // {"policy": "round_robin"|"random"|"po2"|"daronpon", "delta": n, "seed": n,
  // "estimate_ttl_ms": n}: switches the policy in place, keeping the calls in flight and the load
  // estimates.
  absl::Status Configure(std::string_view json_config) override;
  // State: "outstanding", "load" (per replica), "picks", "redirects"; Restore keeps its own policy.
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;

  struct Stats {
    std::vector<uint64_t> picks;        // calls sent to each replica
    std::vector<uint32_t> outstanding;  // this channel's calls in flight to each
    std::vector<uint32_t> load;         // the load the policy sees (Balancer::Load)
    uint64_t redirects = 0;             // Daronpon: calls moved off their target
  };
  Stats stats() const;
  LoadBalanceOptions options() const;

 private:
  LoadBalancePolicy(std::string name, LoadBalanceOptions options)
      : name_(std::move(name)), options_(options) {}
  // With mu_: a balancer for n replicas, carrying `outstanding` and `load` over.
  absl::Status Rebuild(uint32_t n, const std::vector<uint32_t>& outstanding,
                       const std::vector<uint32_t>& load);
  // With mu_: a balancer for exactly n replicas, carrying what the current one knows.
  absl::Status EnsureLocked(uint32_t n);
  uint32_t Size() const { return balancer_ ? balancer_->size() : 0; }
  // With mu_: a report about `replica` arrived now / drop the reports older than the ttl.
  void Reported(uint32_t replica);
  void ExpireLocked() const;

  std::string name_;
  mutable std::mutex mu_;
  LoadBalanceOptions options_;
  std::unique_ptr<Balancer> balancer_;
  mutable std::vector<absl::Time> reported_;  // when each replica's load was last reported
  std::vector<uint64_t> picks_;
  uint64_t redirects_ = 0;
  uint32_t next_target_ = 0;
};

struct AdmissionOptions {
  enum class Scope { kConnection, kMethod };  // a count per connection, or per method
  Scope scope = Scope::kConnection;
  // Calls admitted and not completed yet, per scope key; a call beyond it is refused.
  uint64_t max_outstanding = 64;
};

// Admission control: a call arriving while `max_outstanding` calls of its connection (Server:
// per transport connection; Channel: the channel) or its method are still outstanding fails at
// once with ResourceExhausted naming the policy, the method and the limit; it never queues. A
// call counts from its OnRequest here until its OnComplete (Server: its response left).
class AdmissionPolicy : public Policy {
 public:
  // InvalidArgument for max_outstanding 0.
  static absl::StatusOr<std::shared_ptr<AdmissionPolicy>> Create(std::string name,
                                                                 AdmissionOptions options);
  std::string name() const override { return name_; }
  std::string kind() const override { return "admission"; }
  std::string DescribeJson() const override;
  uint32_t hooks() const override { return kHookRequest | kHookComplete; }
  absl::Status OnRequest(const CallInfo& call) override;
  void OnComplete(const CallInfo& call, const absl::Status& status) override;
  // {"max_outstanding": n}: a new limit (calls already admitted stay).
  absl::Status Configure(std::string_view json_config) override;
  // State: the calls admitted and not completed ("admitted_calls", keyed by their CallInfo),
  // "admitted", "refused".
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;
  uint64_t admitted() const;
  uint64_t refused() const;
  // Calls admitted and not completed under `key` (connection id or method key).
  uint64_t outstanding(uint64_t key) const;
  static uint64_t MethodKey(const CallInfo& call);

 private:
  AdmissionPolicy(std::string name, AdmissionOptions options)
      : name_(std::move(name)), options_(options) {}
  uint64_t Key(const CallInfo& call) const;

  std::string name_;
  mutable std::mutex mu_;
  AdmissionOptions options_;
  absl::flat_hash_map<uint64_t, uint64_t> counts_;
  // Each admitted call by the address of its CallInfo (one object per call, the same in
  // OnRequest and OnComplete on both sides), with its key.
  absl::flat_hash_map<const CallInfo*, uint64_t> calls_;
  uint64_t admitted_ = 0, refused_ = 0;
};

}  // namespace plexus::rpc
