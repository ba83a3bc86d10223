// Waiting for transport completions in tests.
#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "plexus/transport/completion.hpp"

namespace plexus::testing {

// The next completion of `cq`; when none comes within `timeout`, a completion carrying the
// wait's error and wr_id ~0, so that the test's checks fail instead of the test hanging.
inline transport::Completion Next(transport::CompletionQueue& cq,
                                  absl::Duration timeout = absl::Seconds(20)) {
  auto c = cq.Wait(timeout);
  if (!c.ok()) {
    transport::Completion failed;
    failed.status = c.status();
    failed.wr_id = ~uint64_t{0};
    return failed;
  }
  return *c;
}

}  // namespace plexus::testing
