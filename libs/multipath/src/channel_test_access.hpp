// Test hooks of a MultipathChannel, for Plexus's own tests (plexus_multipath_internal); no part
// of the public API.
#pragma once

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

}  // namespace plexus::multipath::internal
