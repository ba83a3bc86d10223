// The driver's rpc service (plexus.serving.wire.Collector): the sinks' workers report each
// request done, and any worker each request it gave up. Tracks ids per sink, so a request
// completed twice is counted as a duplicate.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "serving.plexus.hpp"
#include "topology.hpp"

namespace plexus::serving::internal {

struct DropRecord {
  int op = -1;
  uint64_t sources = 0;
  uint64_t id = 0;
  std::string reason;
  bool retryable = false;  // lost by a failed send: re-sent after a re-plan
  uint64_t part = 0;       // the message given up (Topology's parts), at `op`
};

struct CompletionRecord {
  uint64_t sources = 0;
  uint64_t id = 0;
  int64_t injected_ns = 0;
  int64_t done_ns = 0;
  uint64_t part = 0;
};

// A request's message: (sources, id, part).
using MessageKey = std::tuple<uint64_t, uint64_t, uint64_t>;

class Collector final : public wire::Collector::Service {
 public:
  explicit Collector(const Topology& topology);
  absl::Status Complete(rpc::ServerContext& context, const wire::Completion& request,
                        wire::Ack* response) override;
  absl::Status Dropped(rpc::ServerContext& context, const wire::Drop& request,
                       wire::Ack* response) override;

  struct Sink {
    absl::flat_hash_set<MessageKey> done;
    // Per (sources, id): how many of the request's messages are done (Topology::Parts of them
    // make the request complete).
    absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> parts_done;
    std::vector<CompletionRecord> completions;  // first completions, in order
    int64_t duplicates = 0;
  };
  // A new deployment: reports of earlier ones are ignored from now on (their requests are
  // retried), and so are the retryable drops recorded so far.
  void BeginEpoch(uint32_t epoch);
  // Requests (source index, id) re-sent from their sources: a second completion of one at a sink
  // that had it already is a suppressed repeat, not a duplicate.
  void MarkRetried(const std::vector<std::pair<int, uint64_t>>& retried);
  int64_t RetriedRepeats() const;
  // Later reports are acknowledged and ignored: the run is over, what did not finish is counted
  // as unfinished (shutting workers down fails their calls in flight).
  void Freeze();
  // A drop the driver saw itself (a source's send that failed).
  void AddDrop(DropRecord drop);
  // Copies of what was collected so far.
  std::vector<Sink> Sinks() const;  // indexed by operator (non-sinks stay empty)
  std::vector<DropRecord> Drops() const;
  int64_t Completions() const;
  // End-to-end latencies (done - injected) of every first completion so far, in wall ns.
  std::vector<int64_t> LatenciesNs() const;

 private:
  const Topology& topology_;
  mutable std::mutex mu_;
  std::vector<Sink> sinks_;
  std::vector<DropRecord> drops_;
  int64_t completions_ = 0;
  bool frozen_ = false;
  uint32_t epoch_ = 0;
  std::vector<absl::flat_hash_set<uint64_t>> retried_;  // per source index: ids re-sent
  int64_t retried_repeats_ = 0;
};

}  // namespace plexus::serving::internal
