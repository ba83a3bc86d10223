// The figures of a run (ServeReport) from what the driver polled and collected.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collector.hpp"
#include "plexus/serving/serve.hpp"
#include "topology.hpp"

namespace plexus::serving::internal {

// Polled from the workers: bytes sent per (sender, destination worker), where senders are the
// workers and then the operators (a source's own sends at index workers + op); queues.
struct Counters {
  int64_t at_ns = 0;  // when the poll began
  std::vector<std::vector<uint64_t>> sent;
  std::vector<int64_t> queue;      // queued or in service, per worker
  std::vector<int64_t> processed;  // per worker
};

struct RunFigures {
  int64_t start_ns = 0, warm_ns = 0, stop_ns = 0, end_ns = 0;
  std::vector<int64_t> injected;  // per source
  Counters at_warm, at_stop, at_end;
};

// Messages the injections owe sink `op`: per mask of sources that reaches it, the parts
// (Topology::Parts) of the ids that every source of the mask injected.
int64_t Expected(const Topology& topology, int op, const std::vector<int64_t>& injected);
// The drops of requests: without those of join inputs whose partners were never injected
// (injection stopped first).
std::vector<DropRecord> RequestDrops(const Topology& topology, std::vector<DropRecord> drops,
                                     const std::vector<int64_t>& injected);
// Per request (sink mask, id): the parts of it that `sink` lost, dropped at it or above it and
// not completed there (each once however many operators reported it).
using LostParts = absl::flat_hash_map<std::pair<uint64_t, uint64_t>, absl::flat_hash_set<uint64_t>>;
LostParts LostFor(const Topology& topology, int sink, const Collector::Sink& got,
                  const std::vector<DropRecord>& drops);
// The messages `sink` lost: LostFor's parts, counted.
int64_t DroppedFor(const Topology& topology, int sink, const Collector::Sink& got,
                   const std::vector<DropRecord>& drops);
// The q-quantile of sorted wall nanoseconds, in plan milliseconds.
double PercentileMs(const std::vector<int64_t>& sorted_ns, double q, double compression);

// The report's timeline (completions and latency per bucket of whole plan seconds, >= 20
// expected completions each) and each failure's recovery time: from the kill to the end of the
// first bucket after it that completes at >= 98% of the target rate.
void AddTimeline(const Topology& topology, const ServeOptions& options, const Collector& collector,
                 int64_t start_ns, ServeReport& report);

// A run while it serves, for the admin command "serving".
struct RunStatus {
  std::shared_ptr<const Topology> topology;  // the deployment serving now
  uint32_t epoch = 0;
  bool halted = false;
  std::vector<FailureReport> failures;
  int64_t injected = 0;
  double plan_s = 0;
  Counters before, now;  // the last two health checks (rates between them)
};
// {"scenario", "plan_s", "epoch", "halted", "plan" (PlanToJson), "injected", "completed",
//  "latency_ms": {"p50", "p99"}, "workers": [{"name", "operators", "queued", "processed",
//  "rate"}], "failures": [...]}.
std::string RunStatusJson(const RunStatus& status, const ServeOptions& options,
                          const Collector& collector);

ServeReport BuildReport(const Topology& topology, const ServeOptions& options,
                        const Collector& collector, const RunFigures& run);

}  // namespace plexus::serving::internal
