// QoS time windows (MCCS's traffic scheduling, seed 000 §4.4.2 Example #4): a per-communicator
// schedule of Allow and Deny windows within a repeating epoch on the host's monotonic clock.
// Before it posts a send, the communicator's executor asks the schedule; while the schedule
// denies, the send waits (driving the transport's progress, so receives keep flowing) until the
// next allowed instant. Two jobs sharing links get complementary windows, and each sends only
// in its own. docs/collectives.md, "QoS windows".
//
//   QosTimetable qos;
//   qos.epoch = absl::Milliseconds(20);
//   qos.windows = {{QosWindow::kAllow, absl::ZeroDuration(), absl::Milliseconds(15)}};
//   options.qos = qos;   // CommunicatorOptions; or PLEXUS_COLL_QOS="epoch=20ms;allow=0ms-15ms"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::collectives {

// [begin, end) within the epoch, 0 <= begin < end <= epoch.
struct QosWindow {
  enum Kind : uint8_t { kAllow = 0, kDeny = 1 };
  Kind kind = kAllow;
  absl::Duration begin = absl::ZeroDuration();
  absl::Duration end = absl::ZeroDuration();
};

struct QosTimetable {
  // The period the windows repeat with; zero: no schedule (every send goes at once).
  absl::Duration epoch = absl::ZeroDuration();
  // An instant t of the epoch (t = (monotonic clock + phase) mod epoch) is allowed when no Deny
  // window contains it and either an Allow window contains it or there is no Allow window at
  // all (Deny wins where windows overlap; outside every window, a schedule with Allow windows
  // denies and one with only Deny windows allows).
  std::vector<QosWindow> windows;
  // Gate every k-th send: the communicator numbers the sends it posts (0, 1, 2, ... over all its
  // calls) and asks the schedule only for numbers divisible by k, so a window's decision covers
  // the k - 1 sends that follow it (k > 1 trades precision for fewer clock reads). >= 1.
  int gate_every = 1;
  // Shifts the epoch's start. The monotonic clock (CLOCK_MONOTONIC) is shared by every process
  // on one host, so communicators on one host agree on the windows without coordination; across
  // hosts it is not, and the phase (or a clock synchronised by other means) aligns them.
  absl::Duration phase = absl::ZeroDuration();

  bool enabled() const { return epoch > absl::ZeroDuration(); }
  // InvalidArgument naming the field: epoch < 0, a window outside [0, epoch) or empty,
  // gate_every < 1, windows without an epoch.
  absl::Status Validate() const;
  // Whether instant `t` of the epoch (0 <= t < epoch) is allowed; always true when disabled.
  bool AllowsAt(absl::Duration t) const;
  // Time from instant `t` of the epoch to the next allowed one (zero when t is allowed);
  // InfiniteDuration when no instant of the epoch is allowed.
  absl::Duration UntilAllowed(absl::Duration t) const;
  // Where the monotonic instant `now` falls in the epoch (zero when disabled).
  absl::Duration EpochPosition(absl::Duration now) const;
  // "epoch=20ms;allow=0-15ms;deny=...;every=1;phase=0": the text form ParseQosTimetable reads.
  std::string ToString() const;
};

// Parses the text form (PLEXUS_COLL_QOS): ';'-separated fields
//   epoch=<duration>            required unless the text is empty or "off" (no schedule)
//   allow=<begin>-<end>         any number; durations as absl::ParseDuration ("0", "5ms", "1.5s")
//   deny=<begin>-<end>
//   every=<k>                   gate_every
//   phase=<duration>
// InvalidArgument naming the field and the expected form. Validated.
absl::StatusOr<QosTimetable> ParseQosTimetable(std::string_view text);

// The host's monotonic clock (CLOCK_MONOTONIC) as a duration since its (boot-time) origin.
absl::Duration MonotonicNow();

}  // namespace plexus::collectives
