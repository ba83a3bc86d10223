// Live reconfiguration's state inside a communicator (reconfig.cpp): the sequence-number barrier
// of MCCS without a daemon. Each rank runs a watcher thread that reads the change requests from
// the rendezvous store in the order the store numbered them; for each it stops new issues,
// publishes how many collectives this rank issued, reads every rank's count and lets the change
// land on the collective numbered by the largest (docs/collectives_operations.md, "Live
// reconfiguration").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/collectives/reconfiguration.hpp"
#include "plexus/transport/store.hpp"

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

// A communicator's live reconfiguration: requests, the watcher thread's rounds, and the
// decisions the communicator applies when the collective they land on starts. It knows nothing
// of the communicator but the two callbacks of its Setup.
class Reconfigurer {
 public:
  struct Setup {
    int rank = 0;
    int n = 1;
    uint64_t uid = 0;  // the communicator's id: names its keys on the store
    std::shared_ptr<transport::Store> store;
    absl::Duration timeout = absl::Seconds(60);  // a round's wait for the ranks' counts
    // Created on the caller's device: a transport change is refused.
    bool caller_device = false;
    ActiveConfiguration active;  // as created
    // The communicator's health: a broken one takes no requests.
    std::function<absl::Status()> health;
    // Breaks the communicator (a round that failed).
    std::function<void(absl::Status)> on_error;
  };

  Reconfigurer() = default;
  Reconfigurer(const Reconfigurer&) = delete;
  Reconfigurer& operator=(const Reconfigurer&) = delete;
  ~Reconfigurer() { Stop(); }

  // The active configuration, and the watcher thread (several ranks, unless
  // PLEXUS_COLL_RECONFIG=0). The environment variable's error.
  absl::Status Start(Setup setup);
  // Posts the watchers' stop request (call it on healthy communicators after the destructor's
  // barrier) and joins this rank's watcher.
  void Stop();

  // Communicator::RequestReconfiguration, AwaitReconfiguration, configuration(),
  // collective_sequence().
  absl::StatusOr<uint64_t> Request(const Reconfiguration& change);
  absl::StatusOr<uint64_t> Await(uint64_t epoch, absl::Duration timeout);
  ActiveConfiguration configuration() const;
  uint64_t issued() const;

  // Issuing a collective (creating its task, or running it inline): waits while a round freezes
  // issues, then counts the call (the broken status when the wait ended because the
  // communicator broke).
  absl::Status Issue();
  // The decisions landing on collective `sequence` (taken out of the pending ones, in order)
  // into *out, which is cleared first (empty: nothing lands; no allocation then).
  void TakeLanding(uint64_t sequence, std::vector<DecidedChange>* out);
  // Changes the reported active configuration.
  void UpdateActive(absl::FunctionRef<void(ActiveConfiguration&)> update);

 private:
  std::string ReconfigKey(std::string_view what, uint64_t epoch, int rank = -1) const;
  void WatchReconfigurations();
  // One round of the barrier for request `epoch`; an error breaks the communicator.
  absl::Status RunReconfigRound(uint64_t epoch, const std::string& payload);
  void BreakFromWatcher(absl::Status status);

  Setup setup_;
  ReconfigState reconf_;
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
