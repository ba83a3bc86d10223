// Path schedulers: which path carries the next chunk. An interface: the five built-ins
// (MakeScheduler, by name) implement it, and so can an application's own; a channel's scheduler
// is chosen when it is created (ChannelOptions) and switchable at run time
// (MultipathChannel::SetScheduler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace plexus::multipath {

// What a scheduler sees of one live path.
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
  // The built-ins answer their MakeScheduler name; an application's own names itself (it is
  // what MultipathChannel::scheduler() reports).
  virtual std::string name() const = 0;
  // The index (PathView::index) of the path for the next chunk among those with has_slot; -1
  // when none has. Called for every chunk that is not a mouse (ChannelOptions::mice_bytes),
  // under the channel's lock: it must not call into the channel. An index that is not one of
  // `paths` with has_slot is not followed: the chunk goes on MinRttPath's choice instead.
  virtual int Pick(absl::Span<const PathView> paths) = 0;
};

// The built-ins, by name:
//   "round_robin"   each path in turn
//   "weighted"      smooth weighted round robin, weights = measured bandwidth x rate factor
//   "min_rtt"       every chunk on the lowest-RTT path with a free slot
//   "congestion"    weighted, with weights cut by RTT inflation (srtt / min_rtt)
//   "power_of_two"  two random paths (from `seed`), the less loaded one (loads may be stale)
// InvalidArgument naming the known ones for any other name.
absl::StatusOr<std::unique_ptr<Scheduler>> MakeScheduler(std::string_view name,
                                                         uint64_t seed = 0x9e3779b97f4a7c15);
// The built-ins' names, in the order above.
const std::vector<std::string_view>& BuiltinSchedulers();

// The path with a free slot and the lowest RTT (unmeasured RTTs count as highest; ties go to the
// lower index); -1 when no path has a slot. Small messages (mice) take this path.
int MinRttPath(absl::Span<const PathView> paths);

}  // namespace plexus::multipath
