// The engine chain of a connection: frontend -> policies -> marshal -> transport on send, the
// mirror on receive. Policies run on typed calls before marshalling (client) and after
// unmarshalling (server); they can be attached between two named engines and detached while calls
// flow: each call sees one consistent chain, and none is lost or run twice.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/rpc/schema.hpp"

namespace plexus::rpc {

struct CallInfo {
  const ServiceDesc* service = nullptr;
  const MethodDesc* method = nullptr;
  uint64_t call_id = 0;
  bool server_side = false;
  size_t request_bytes = 0;   // on the wire
  size_t response_bytes = 0;  // on the wire; 0 until the response exists
  absl::Time start;
  absl::Time deadline = absl::InfiniteFuture();
  // The connection: the transport's connection id on the server (one chain serves them all); 0 on
  // a Channel (its chain is its connection's).
  uint64_t connection_id = 0;
  // The typed request (a `method->request()` message) while OnRequest runs; null in OnComplete.
  // Server: decoded in the server's own receive buffer, which no handler sees before the chain
  // passed. Client: the application's memory, unless a policy of the chain inspects_content():
  // then a private copy of the encoded bytes, and exactly those bytes are sent (see Channel).
  const void* request = nullptr;
};

class Policy {
 public:
  virtual ~Policy() = default;
  // Unique within a chain; the name Attach/Detach use.
  virtual std::string name() const = 0;
  // True when OnRequest reads `call.request`: the client then runs the chain on a private copy
  // of the request, so the application cannot change what was checked before it is sent.
  virtual bool inspects_content() const { return false; }
  // A request on its way (client: before marshalling; server: after unmarshalling). A non-OK
  // status fails the call with it and the later engines never see it.
  virtual absl::Status OnRequest(const CallInfo& call) {
    (void)call;
    return absl::OkStatus();
  }
  // The call finished with `status` (client: response received or failed; server: sent).
  virtual void OnComplete(const CallInfo& call, const absl::Status& status) {
    (void)call;
    (void)status;
  }
};

class EngineChain {
 public:
  using Snapshot = std::shared_ptr<const std::vector<std::shared_ptr<Policy>>>;
  EngineChain();

  // "frontend", the policies in order, "marshal", "transport".
  std::vector<std::string> Names() const;
  // Inserts `policy` right after the engine named `after` ("frontend" or a policy).
  // AlreadyExists for a taken name, NotFound for an unknown `after`, InvalidArgument after
  // "marshal" or "transport" (policies work on typed messages).
  absl::Status Attach(std::shared_ptr<Policy> policy, std::string_view after = "frontend");
  // Removes and returns the policy; calls already past it are not affected.
  absl::StatusOr<std::shared_ptr<Policy>> Detach(std::string_view name);
  std::shared_ptr<Policy> Find(std::string_view name) const;
  // The chain a call runs through, taken once when it starts.
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot policies_;
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
    std::array<uint64_t, kBuckets> latency_us{};
    // Upper bound of the bucket holding quantile q (0..1), in microseconds.
    double QuantileUpperUs(double q) const;
  };

  explicit MetricsPolicy(std::string name = "metrics") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void OnComplete(const CallInfo& call, const absl::Status& status) override;

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
