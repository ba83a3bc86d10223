// The executor's send-admission hook for QoS time windows (plexus/collectives/qos.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/base/wait_policy.hpp"
#include "plexus/collectives/qos.hpp"

namespace plexus::collectives::internal {

// options.qos, or PLEXUS_COLL_QOS when set (InvalidArgument naming the variable when it does
// not parse; the option's Validate() error otherwise).
absl::StatusOr<QosTimetable> ResolveQosTimetable(const QosTimetable& option);

class QosGate {
 public:
  QosGate(QosTimetable schedule, int rank);

  // Called before each send is posted. Every gate_every-th send asks the schedule; while it
  // denies, waits (spinning only as `wait` allows, then yielding, then calling
  // progress(max_block), which drives the transport and blocks at most max_block) until the
  // next allowed instant. DeadlineExceeded, naming `call`, the rank and the schedule, when the
  // schedule allows nothing within `timeout` (returned at once: the wait is known in advance).
  absl::Status Admit(absl::Duration timeout, const base::WaitPolicy& wait,
                     absl::FunctionRef<void(absl::Duration)> progress,
                     absl::FunctionRef<std::string()> call);
  // The DeadlineExceeded Admit would return now if it were asked (without counting a send):
  // OK when the schedule allows an instant within `timeout`.
  absl::Status CheckReachable(absl::Duration timeout, absl::FunctionRef<std::string()> call) const;
  // Called after a send was posted: records its monotonic time when recording (tests).
  void Posted();
  // Keeps the monotonic times of the next `limit` posted sends and of the next `limit` checks
  // that admitted a send (the clock reading the schedule allowed) (0: none; the default).
  void Record(size_t limit);
  std::vector<absl::Duration> posts() const;
  std::vector<absl::Duration> admissions() const;

  struct Stats {
    uint64_t sends = 0;   // sends that passed the gate
    uint64_t checks = 0;  // of them, those that asked the schedule (every gate_every-th)
    uint64_t waits = 0;   // checks that found the schedule denying
    absl::Duration waited = absl::ZeroDuration();
  };
  Stats stats() const;
  const QosTimetable& schedule() const { return schedule_; }

 private:
  // DeadlineExceeded when the next allowed instant (`until` after `now`) is beyond `timeout`.
  absl::Status Unreachable(absl::Duration now, absl::Duration until, absl::Duration timeout,
                           absl::FunctionRef<std::string()> call) const;

  void RecordAdmission(absl::Duration now);

  QosTimetable schedule_;
  int rank_;
  std::atomic<uint64_t> sends_{0}, checks_{0}, waits_{0};
  std::atomic<int64_t> waited_ns_{0};
  mutable std::mutex mu_;
  std::atomic<size_t> record_limit_{0};
  std::vector<absl::Duration> posts_;
  std::vector<absl::Duration> admissions_;
};

}  // namespace plexus::collectives::internal
