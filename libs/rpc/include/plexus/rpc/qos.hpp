// Global QoS (mRPC's "small or latency-class calls first across the connections of a runtime"):
// the engine that classifies calls for a reorder point. On a Server, calls of every connection
// whose chain passed wait in one queue in front of the handlers; on a Channel, calls wait for a
// slot of their connection's window in one queue shared by the channels of the same transport
// Device. Latency-class calls go first, with a weighted share and aging so that bulk calls are
// never starved. See docs/rpc_engines.md, "Global QoS".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/rpc/policy.hpp"

namespace plexus::rpc {

struct QosOptions {
  // Per-call metadata: a value "latency" or "bulk" under this key decides first ("" ignores
  // metadata); any other value falls through to the rules below.
  std::string metadata_key = "plexus-qos";
  // "package.Service/Method" names whose calls are latency class.
  std::vector<std::string> latency_methods;
  // A request of at most this many bytes on the wire is latency class; 0: size does not decide.
  size_t small_bytes = 0;
  QosSchedule schedule;
};

// Kind "qos". Attach to a Server's chain (reorder point before the handlers) or a Channel's (before
// the connection's window, shared with the device's other channels). Configure (JSON):
// {"metadata_key", "latency_methods": [..], "small_bytes", "max_concurrent" (Server),
// "latency_burst", "max_wait_ms", "max_in_flight" (Channel)}; fields left out keep their value.
class QosPolicy : public Policy {
 public:
  // InvalidArgument for max_concurrent or latency_burst 0, or a method name without a '/'.
  static absl::StatusOr<std::shared_ptr<QosPolicy>> Create(std::string name, QosOptions options);
  std::string name() const override { return name_; }
  std::string kind() const override { return "qos"; }
  std::string DescribeJson() const override;
  uint32_t hooks() const override { return kHookClassify; }
  std::optional<QosVerdict> Classify(const CallInfo& call) override;
  absl::Status Configure(std::string_view json_config) override;
  // State: "latency", "bulk" (calls classified); Restore adds them to this version's counts.
  // Calls waiting in the queue belong to the server, not the engine: they stay queued.
  absl::StatusOr<EngineState> Decompose() const override;
  absl::Status Restore(const EngineState& state) override;

  QosOptions options() const;
  uint64_t latency_calls() const;
  uint64_t bulk_calls() const;

 private:
  QosPolicy(std::string name, QosOptions options)
      : name_(std::move(name)), options_(std::move(options)) {}
  static absl::Status Check(const std::string& name, const QosOptions& options);

  std::string name_;
  mutable std::mutex mu_;
  QosOptions options_;
  uint64_t latency_ = 0, bulk_ = 0;
};

}  // namespace plexus::rpc
