// Path schedulers: which path carries the next chunk. One interface, switchable at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace plexus::multipath {

enum class SchedulerKind : uint8_t {
  kRoundRobin = 0,  // each path in turn
  kWeighted = 1,    // smooth weighted round robin, weights = measured bandwidth x rate factor
  kMinRtt = 2,      // every chunk on the lowest-RTT path with a free slot
  kCongestion = 3,  // weighted, with weights cut by RTT inflation (srtt / min_rtt)
  kPowerOfTwo = 4,  // two random paths, the less loaded one (load snapshots may be stale)
};
std::string_view SchedulerName(SchedulerKind kind);
// "round_robin", "weighted", "min_rtt", "congestion", "power_of_two".
absl::StatusOr<SchedulerKind> ParseScheduler(std::string_view name);

// What a scheduler sees of one path.
struct PathView {
  int index = 0;
  bool has_slot = false;   // up, and fewer chunks in flight than its cap
  double bandwidth = 0;    // bytes/s, EWMA of completions; 0 = not measured yet
  double rate_factor = 1;  // (0, 1]: the path's share after congestion/overload cuts
  absl::Duration srtt = absl::ZeroDuration();     // smoothed RTT; zero = not measured yet
  absl::Duration min_rtt = absl::ZeroDuration();  // lowest RTT seen
  double load = 0;  // seconds of queued work (in-flight bytes / bandwidth), maybe stale
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual SchedulerKind kind() const = 0;
  // The index (PathView::index) of the path for the next chunk among those with has_slot; -1
  // when none has.
  virtual int Pick(absl::Span<const PathView> paths) = 0;
};

std::unique_ptr<Scheduler> MakeScheduler(SchedulerKind kind, uint64_t seed = 0x9e3779b97f4a7c15);

// The path with a free slot and the lowest RTT (unmeasured RTTs count as highest; ties go to the
// lower index); -1 when no path has a slot. Small messages (mice) take this path.
int MinRttPath(absl::Span<const PathView> paths);

}  // namespace plexus::multipath
