// Live reconfiguration's state inside a communicator (reconfig.cpp): the sequence-number barrier
// of MCCS without a daemon. Each rank runs a watcher thread that reads the change requests from
// the rendezvous store in the order the store numbered them; for each it stops new issues,
// publishes how many collectives this rank issued, reads every rank's count and lets the change
// land on the collective numbered by the largest (docs/collectives.md, "Live reconfiguration").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "plexus/collectives/reconfiguration.hpp"

namespace plexus::collectives::internal {

// A change every rank agreed on: epoch `epoch`, landing on collective `sequence`.
struct DecidedChange {
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int requester = -1;
  Reconfiguration change;
};

struct ReconfigState {
  mutable std::mutex mu;
  std::condition_variable cv;
  // Set by the watcher from the moment it reads this rank's count until every count is in: no
  // collective is issued meanwhile (so that none is issued past the count it published).
  bool frozen = false;
  // Collectives issued (IssueCollective): the sequence number the next one issued gets.
  uint64_t issued = 0;
  // Decided, not yet applied, in sequence order.
  std::deque<DecidedChange> pending;
  // Landing sequence of the last decision (decisions never go back) and its epoch.
  uint64_t last_sequence = 0;
  uint64_t decided_epoch = 0;
  // epoch -> landing sequence, the last kMaxHistory decisions (AwaitReconfiguration).
  std::map<uint64_t, uint64_t> history;
  static constexpr size_t kMaxHistory = 1024;
  ActiveConfiguration active;
  // Single-rank communicators number their own epochs.
  uint64_t local_epochs = 0;
  // Set when this rank's watcher lost the store while idle, or reconfiguration is off
  // (PLEXUS_COLL_RECONFIG=0): RequestReconfiguration returns it.
  absl::Status lost;
  std::atomic<bool> stop{false};
  std::thread watcher;
  // Store keys of this communicator's rounds: <prefix>count, <prefix>req/<k>,
  // <prefix>rep/<k>/<rank>.
  std::string prefix;
};

// The bytes a request travels as on the store: a base::Record ("close" is the watchers' stop
// signal that a destroyed communicator posts). Decoding is strict: a missing, unknown or bad
// field is an error naming it.
std::string EncodeReconfiguration(const Reconfiguration& change, int requester);
absl::StatusOr<DecidedChange> DecodeReconfiguration(std::string_view text);
inline constexpr std::string_view kCloseRequest = "close";

// Tests: the watchers call this (when set) at each step of each round, on their own thread; a
// hook that sleeps delays that rank's step (reordering when it learns of a change, when it
// publishes its count). Process-wide; set it before the communicators are created.
enum class ReconfigStep : uint8_t {
  kSeen = 0,     // read request `epoch` from the store; nothing frozen yet
  kFrozen = 1,   // froze issues and read this rank's count; publishes it next
  kDecided = 2,  // read every count; launches resume
};
using ReconfigHook = std::function<void(int rank, uint64_t epoch, ReconfigStep step)>;
void SetReconfigTestHook(ReconfigHook hook);
// Tests: breaks the barrier on purpose. When set, a watcher lets decision `epoch` land on the
// collective the hook returns instead of the agreed `sequence` (on its rank only), so that the
// ranks run one collective under different epochs and the epoch check in the message headers
// must catch it. Process-wide; nullptr removes it.
using ReconfigLandingHook = std::function<uint64_t(int rank, uint64_t epoch, uint64_t sequence)>;
void SetReconfigLandingTestHook(ReconfigLandingHook hook);

}  // namespace plexus::collectives::internal
