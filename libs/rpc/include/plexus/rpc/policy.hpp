// The engine chain of a connection: frontend -> policies -> marshal -> transport on send, the
// mirror on receive. Policies run on typed calls before marshalling (client) and after
// unmarshalling (server); they can be attached between two named engines, detached, reconfigured
// and upgraded to a new version (state carried by Decompose/Restore) while calls flow: each call
// sees one consistent chain, and none is lost, run twice or reordered.
#pragma once

#include <any>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/base/gate.hpp"
#include "plexus/rpc/call.hpp"
#include "plexus/rpc/schema.hpp"

namespace plexus::rpc {
namespace internal {
class ContentPlans;
class PrivateRequest;
}  // namespace internal

struct CallInfo {
  const ServiceDesc* service = nullptr;
  const MethodDesc* method = nullptr;
  uint64_t call_id = 0;
  bool server_side = false;
  size_t request_bytes = 0;   // on the wire
  size_t response_bytes = 0;  // on the wire; 0 until the response exists
  // When the call started. A Channel reads the clock (a cost per call) only for calls with a
  // deadline or an engine that declares kReadsStart, so only those engines are sure to see it
  // set; a Server sets it for every call.
  absl::Time start;
  absl::Time deadline = absl::InfiniteFuture();
  // The connection: the transport's connection id on the server (one chain serves them all); 0 on
  // a Channel (its chain is its connection's).
  uint64_t connection_id = 0;
  // The typed request (a `method->request()` message) while OnRequest runs; null in OnComplete.
  // Server: decoded in the server's own receive buffer, which no handler sees before the chain
  // passed. Client: the application's memory until a policy that inspects_content() is reached;
  // from then on a private copy holding (at least) the fields that policy reads, and the request
  // is marshalled from that copy once the chain passed, so exactly the checked bytes are sent
  // (docs/rpc_engines.md, "Content ACL").
  const void* request = nullptr;
  // Server: the request's metadata while OnRequest and Classify run; null otherwise and on a
  // Channel.
  const MetadataView* metadata = nullptr;
  // A Channel over several replicas (Channel::ConnectReplicas): the replica the call went to (its
  // index in the address list) and the engine that chose it ("" when the channel's default round
  // robin did), set after every OnRequest passed; in OnComplete also the replica's load (its
  // server's calls being handled) piggybacked on the response, when it carried one.
  uint32_t replica = 0;
  std::string route_engine;
  std::optional<uint32_t> replica_load;
};

// A field of a request, reached from the request message through singular message fields: the
// fields in order, the last one the field itself (for example {&auth, &tenant}).
using FieldPath = absl::Span<const FieldDesc* const>;

// Global QoS: the class of a call at a server's reorder point before its handlers.
enum class QosClass : uint8_t { kLatency = 0, kBulk = 1 };
// How the reorder point serves its two classes (the scheduling engine's configuration, applied
// from the next call it classifies on).
struct QosSchedule {
  // Calls handed to handlers and not finished yet; further calls wait in the queue, latency
  // class first. 1 serializes the handlers.
  uint32_t max_concurrent = 1;
  // Weighted share: after this many latency calls in a row while bulk calls wait, one bulk call.
  uint32_t latency_burst = 8;
  // Aging of the bulk class: when bulk calls have waited this long without one of them being
  // dispatched (since the last bulk dispatch, or since the bulk queue filled), the oldest goes
  // before any latency call. Bulk calls waiting behind other bulk calls do not trigger it.
  absl::Duration max_wait = absl::Milliseconds(50);
  // A Channel (the runtime's reorder point, shared by the channels of one transport Device):
  // calls sent through it and not completed, across those channels; 0: no shared limit, each
  // channel's own window only. A Server ignores it (max_concurrent bounds its handlers).
  uint32_t max_in_flight = 0;
};
// A QoS reorder point's counters (Server::qos(), Channel::qos()).
struct QosStats {
  uint64_t latency = 0, bulk = 0;  // calls dispatched from each class
  uint64_t aged = 0, shared = 0;   // bulk calls dispatched ahead by aging / the weighted share
  size_t queued = 0, max_queued = 0;
};
struct QosVerdict {
  QosClass cls = QosClass::kBulk;
  QosSchedule schedule;
};

// What an engine's Decompose hands to its next version's Restore (mRPC's live upgrade): named
// values of any type, plus the kind and version of the engine that produced them.
class EngineState {
 public:
  EngineState() = default;
  EngineState(std::string kind, int version) : kind_(std::move(kind)), version_(version) {}
  const std::string& kind() const { return kind_; }
  int version() const { return version_; }
  template <typename T>
  void Put(std::string key, T value) {
    values_[std::move(key)] = std::any(std::move(value));
  }
  // NotFound for a missing key, InvalidArgument when it holds another type.
  template <typename T>
  absl::StatusOr<T> Get(std::string_view key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return Missing(key);
    if (const T* v = std::any_cast<T>(&it->second)) return *v;
    return WrongType(key);
  }
  bool Has(std::string_view key) const { return values_.find(key) != values_.end(); }

 private:
  absl::Status Missing(std::string_view key) const;
  absl::Status WrongType(std::string_view key) const;
  std::string kind_;
  int version_ = 0;
  std::map<std::string, std::any, std::less<>> values_;
};

// What an engine takes part in (Policy::hooks()), one bit each: the hooks it implements, and
// whether it reads the call's start.
enum PolicyHook : uint32_t {
  kHookRequest = 1u << 0,     // OnRequest
  kHookComplete = 1u << 1,    // OnComplete
  kHookRoute = 1u << 2,       // Route
  kHookLoadReport = 1u << 3,  // OnLoadReport
  kHookClassify = 1u << 4,    // Classify
  // Not a hook: the engine reads CallInfo::start. A Channel reads the clock for a call only
  // when it has a deadline or one of its engines sets this bit (one read, shared by them all).
  kReadsStart = 1u << 5,
  kAllHooks = (1u << 6) - 1,
};

class Policy {
 public:
  virtual ~Policy() = default;
  // The hooks this engine implements (PolicyHook bits). The chain calls no other, nor passes the
  // engine's gate for it: an engine that only checks requests costs one gate per call, not one
  // per hook. Read when the engine is attached and at each upgrade. The default, every bit, is
  // always right; an engine that leaves out a hook it overrides is not called there, and one
  // that leaves out kReadsStart may see CallInfo::start unset (absl::Time()) on a Channel.
  virtual uint32_t hooks() const { return kAllHooks; }
  // Unique within a chain; the name Attach/Detach use.
  virtual std::string name() const = 0;
  // The engine's kind ("metrics", "rate_limit", "acl") and version: what an upgrade replaces and
  // what an operator sees listed.
  virtual std::string kind() const { return "custom"; }
  virtual int version() const { return 1; }
  // One JSON object: configuration and live counters, for listings (the admin endpoint).
  virtual std::string DescribeJson() const { return "{}"; }
  // True when OnRequest reads `call.request`: the client then runs the chain on a private copy
  // of the request, so the application cannot change what was checked before it is sent. Read
  // when the engine is attached, upgraded or configured.
  virtual bool inspects_content() const { return false; }
  // With inspects_content(): names every field of a `method` request that OnRequest reads, each
  // by one call of `read` (a path through singular message fields to a singular or optional
  // scalar, enum, string or bytes field), and returns true. A Channel then copies only those
  // fields (a string's or bytes' bytes, the message structs on the way) into memory the call
  // owns, instead of the whole request. A promise: any other field OnRequest reads is the
  // application's memory. false (the default): OnRequest may read any field; the whole request
  // is copied. A Channel asks once per method and keeps the answer until the engine is upgraded
  // or configured, so it may depend on the method and the configuration only. A path that does
  // not end in such a field fails every call of the method with InvalidArgument naming it.
  virtual bool ContentFields(const MethodDesc& method,
                             absl::FunctionRef<void(FieldPath)> read) const {
    (void)method;
    (void)read;
    return false;
  }
  // A request on its way (client: before marshalling; server: after unmarshalling). A non-OK
  // status fails the call with it and the later engines never see it.
  virtual absl::Status OnRequest(const CallInfo& call) {
    (void)call;
    return absl::OkStatus();
  }
  // The call finished with `status` (client: response received or failed; server: its response
  // sent, or dropped because the connection died).
  virtual void OnComplete(const CallInfo& call, const absl::Status& status) {
    (void)call;
    (void)status;
  }
  // A Channel over several replicas, after every OnRequest passed: the replica the call goes to,
  // or nullopt to leave the choice to a later engine (the channel's default: round robin over the
  // usable replicas). `usable[r]` is false while replica r is disconnected; a replica returned
  // that is not usable fails the call with Unavailable.
  virtual std::optional<uint32_t> Route(const CallInfo& call, const std::vector<bool>& usable) {
    (void)call;
    (void)usable;
    return std::nullopt;
  }
  // A Channel over several replicas: replica `replica`'s server reported `load` calls being
  // handled (its logarithmic gossip; piggybacked loads come with OnComplete instead).
  virtual void OnLoadReport(uint32_t replica, uint32_t load) {
    (void)replica;
    (void)load;
  }
  // After every OnRequest passed: the call's class at the global QoS reorder point (a Server's,
  // before its handlers; a Channel's, before the connection's window), or nullopt (not a
  // scheduling engine). The first engine that answers decides; with none, the call goes straight
  // on (once the calls queued before it have left).
  virtual std::optional<QosVerdict> Classify(const CallInfo& call) {
    (void)call;
    return std::nullopt;
  }
  // An operator's new configuration, a JSON object (each kind documents its fields). Runs with no
  // call inside the engine. Unimplemented unless the kind supports it; an error changes nothing.
  virtual absl::Status Configure(std::string_view json_config);
  // Live upgrade, step 1: the engine's state (counters, tokens, queued work). Runs with no call
  // inside the engine (the chain holds new calls at its gate). Must leave the engine unchanged:
  // if the new version's Restore fails, this one stays in the chain and goes on.
  virtual absl::StatusOr<EngineState> Decompose() const { return EngineState(kind(), version()); }
  // Live upgrade, step 2, on the new version before it sees any call: adopt the old version's
  // state, transforming it if the layout changed. An error refuses the upgrade (the old version
  // stays).
  virtual absl::Status Restore(const EngineState& state);
};

// How long an operation held the engine's calls back.
struct EngineSwapReport {
  absl::Duration drain;  // waiting for the calls inside the old engine to leave it
  absl::Duration pause;  // the gate closed in all: new calls waited this long at most
};

// One engine's place in the chain: the policy behind a gate. Calls pass the gate without a lock
// or an atomic read-modify-write (base::Gate); a swap closes it, waits until no call is inside,
// swaps, and reopens it.
class EngineSlot {
 public:
  explicit EngineSlot(std::shared_ptr<Policy> policy);
  ~EngineSlot();
  EngineSlot(const EngineSlot&) = delete;
  EngineSlot& operator=(const EngineSlot&) = delete;
  absl::Status OnRequest(const CallInfo& call);
  // A Channel's OnRequest: when the policy inspects_content(), the fields it reads are first made
  // private in `copy` and `call.request` points at the copy, behind the same gate (so the policy
  // cannot be swapped between naming its fields and reading them). An error making the copy
  // fails the call without OnRequest.
  absl::Status OnRequest(CallInfo& call, internal::PrivateRequest& copy);
  void OnComplete(const CallInfo& call, const absl::Status& status);
  std::optional<uint32_t> Route(const CallInfo& call, const std::vector<bool>& usable);
  void OnLoadReport(uint32_t replica, uint32_t load);
  std::optional<QosVerdict> Classify(const CallInfo& call);
  std::string name() const { return name_; }
  // The current policy's hooks() (PolicyHook bits).
  uint32_t hooks() const { return hooks_.load(std::memory_order_relaxed); }
  std::shared_ptr<Policy> policy() const;

 private:
  friend class EngineChain;
  bool Has(PolicyHook hook) const { return (hooks_.load(std::memory_order_relaxed) & hook) != 0; }
  Policy* Enter();
  void Leave();
  // Closes the gate, waits for the calls inside, runs `fn` on the policy, reopens the gate.
  template <typename Fn>
  absl::StatusOr<EngineSwapReport> Exclusive(Fn&& fn);

  const std::string name_;
  // The current policy's hooks(): a call skips the others without entering the gate. Written with
  // the gate closed (a swap); a call that read the old value acts as if its step had run on the
  // old version.
  std::atomic<uint32_t> hooks_{kAllHooks};
  // The policy's inspects_content() and the fields it names per method, read by calls inside the
  // gate and reset with it closed.
  bool content_ = false;
  std::unique_ptr<internal::ContentPlans> plans_;
  base::Gate gate_;
  mutable std::mutex mu_;           // policy() against a swap
  std::shared_ptr<Policy> policy_;  // written only with the gate closed and no call inside
};

class EngineChain {
 public:
  using Snapshot = std::shared_ptr<const std::vector<std::shared_ptr<EngineSlot>>>;
  EngineChain();
  ~EngineChain();

  // "frontend", the policies in order, "marshal", "transport".
  std::vector<std::string> Names() const;
  // Inserts `policy` right after the engine named `after` ("frontend" or a policy).
  // AlreadyExists for a taken name, NotFound for an unknown `after`, InvalidArgument after
  // "marshal" or "transport" (policies work on typed messages).
  absl::Status Attach(std::shared_ptr<Policy> policy, std::string_view after = "frontend");
  // Removes and returns the policy; calls that started before still run through it.
  absl::StatusOr<std::shared_ptr<Policy>> Detach(std::string_view name);
  // Live upgrade: replaces the engine `name` by `next` (same name; any kind whose Restore accepts
  // the old state) at the same place, under load. Calls that already passed the old version keep
  // their result; every later step of every call (OnRequest and OnComplete, also of calls started
  // before) runs on `next`, so no call is lost, run twice or reordered, and counters continue.
  // NotFound for an unknown name, InvalidArgument for a different name, or Decompose's/Restore's
  // error (the old version then stays).
  absl::StatusOr<EngineSwapReport> Upgrade(std::string_view name, std::shared_ptr<Policy> next);
  // Policy::Configure of engine `name` with no call inside it.
  absl::StatusOr<EngineSwapReport> Configure(std::string_view name, std::string_view json_config);
  std::shared_ptr<Policy> Find(std::string_view name) const;
  // The chain a call runs through, taken once when it starts.
  Snapshot snapshot() const;

 private:
  // A thread's own copy of the chain (one per base::ThisThreadLine()).
  struct Line;
  class ClosedLines;
  std::shared_ptr<EngineSlot> FindSlot(std::string_view name) const;
  // After slots_ changed (mu_ held, lines_gate_ closed): every line's copy is dropped, the lines
  // made with the first engine. The dropped copies go to `old`, released by the caller after
  // unlocking (a detached engine's destructor may run then).
  void ForgetLinesLocked(std::vector<Snapshot>* old);
  mutable std::mutex mu_;
  std::mutex admin_mu_;  // one swap or configuration at a time
  Snapshot slots_;
  // slots_ holds no engine: snapshot() then takes neither the lock nor a reference that every
  // thread's calls share (written under mu_ after slots_).
  std::atomic<bool> empty_{true};
  // With engines, a call takes its thread's line's copy inside lines_gate_ (no lock, and a
  // reference counted on a line of its own); Attach and Detach close the gate to drop the copies.
  std::unique_ptr<Line[]> owned_lines_;
  std::atomic<Line*> lines_{nullptr};
  mutable base::Gate lines_gate_;
};

// Per-method call count, errors, bytes and a latency histogram (powers of two of microseconds).
class MetricsPolicy : public Policy {
 public:
  static constexpr int kBuckets = 32;  // bucket b: latency in [2^(b-1), 2^b) us; 0: < 1 us
  struct MethodMetrics {
    uint64_t calls = 0;
    uint64_t errors = 0;
    uint64_t request_bytes = 0;
    uint64_t response_bytes = 0;
    // Calls that had no start (see CallInfo::start) are counted above but not here.
    std::array<uint64_t, kBuckets> latency_us{};
    // Upper bound of the bucket holding quantile q (0..1), in microseconds.
    double QuantileUpperUs(double q) const;
  };

  explicit MetricsPolicy(std::string name = "metrics") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string kind() const override { return "metrics"; }
  std::string DescribeJson() const override { return ToJson(); }
  uint32_t hooks() const override { return kHookComplete | kReadsStart; }
  void OnComplete(const CallInfo& call, const absl::Status& status) override;
  // State: "methods" (std::map<std::string, MethodMetrics>); Restore adds it to this one's.
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;

  // Keyed by "package.Service/Method".
  std::map<std::string, MethodMetrics> Get() const;
  // {"package.Service/Method": {"calls":..,"errors":..,"request_bytes":..,"response_bytes":..,
  //  "latency_us_p50":..,"latency_us_p99":..,"latency_us_buckets":[..]}, ...}
  std::string ToJson() const;

 private:
  std::string name_;
  mutable std::mutex mu_;
  std::map<std::string, MethodMetrics> methods_;
};

}  // namespace plexus::rpc
