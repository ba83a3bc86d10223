// Test hooks of a MultipathChannel, for Plexus's own tests (plexus_multipath_internal); no part
// of the public API.
#pragma once

#include <functional>

#include "absl/time/time.h"
#include "plexus/multipath/channel.hpp"

namespace plexus::multipath::internal {

class ChannelTestAccess {
 public:
  // Fails a path as if its connection broke (closes it).
  static void FailPath(MultipathChannel& channel, int path);
  // Makes a path silently swallow what is posted on it from now on (a blackhole: only the path
  // timeout detects it).
  static void StallPath(MultipathChannel& channel, int path);
  // Pins a path's RTT estimate.
  static void SetPathRtt(MultipathChannel& channel, int path, absl::Duration rtt);
};

// Called during MultipathDevice set-up (null: nothing): on the connector once the peer greeted
// every path, before the verdicts; on the listener once it accepted every path, before it waits
// for their greetings. They let a test change the paths at exactly those points.
struct DeviceTestHooks {
  std::function<void(MultipathChannel&)> connector_greeted;
  std::function<void(MultipathChannel&)> listener_accepted;
};
void SetDeviceTestHooks(DeviceTestHooks hooks);

}  // namespace plexus::multipath::internal
