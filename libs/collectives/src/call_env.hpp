// What the parts that move a call's bytes (the plan executor, the mailbox path) share: how long
// a call may wait and how it waits, where it posts whom it waits for, the QoS gate and the
// tracer, the connections, and how a failure ends the call. The communicator owns one and fills
// it at creation; the parts read it through a reference.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/types.hpp"
#include "wire.hpp"

namespace plexus::collectives::internal {

class BlameBoard;
class QosGate;
class Tracer;
struct ConnectionSet;
struct Layout;

constexpr size_t kHeaderBytes = CallHeader::kEncodedSize;

// From this size a communicator's shm connections pull a lone one-way message by cross-memory
// attach (ShmOptions::lone_cma_threshold, set when every rank can have a CPU); below it a first
// message is taken apart by a consumed receive, which would stage a pulled one.
constexpr size_t kShmLonePullBytes = size_t{128} << 10;

// How long a waiting call polls the transport (yielding the CPU between polls after the spin)
// before it sleeps.
constexpr absl::Duration kYieldWindow = absl::Milliseconds(2);

// Why a call failed, before the communicator works out whom to blame (see blame.hpp).
struct Failure {
  enum class Kind {
    kOwn,    // this rank's own finding (mismatched calls): `own` is the error
    kPeer,   // the connection to `peer` failed with `why`
    kStall,  // no progress for the timeout while waiting for `waiting`
  };
  Kind kind = Kind::kOwn;
  absl::Status own;
  int peer = -1;
  absl::Status why;
  std::vector<int> waiting;

  static Failure Own(absl::Status status) {
    Failure f;
    f.own = std::move(status);
    return f;
  }
  static Failure Peer(int peer, absl::Status why) {
    Failure f;
    f.kind = Kind::kPeer;
    f.peer = peer;
    f.why = std::move(why);
    return f;
  }
  static Failure Stall(std::vector<int> waiting) {
    Failure f;
    f.kind = Kind::kStall;
    f.waiting = std::move(waiting);
    return f;
  }
};

// The error of a rank that finds `peer` in another call than its own (`call`).
inline absl::Status MismatchedCalls(int rank, const std::string& call, int peer,
                                    const std::string& theirs, const std::string& why = "") {
  return absl::FailedPreconditionError(absl::StrCat("mismatched collective calls: rank ", rank,
                                                    " is in ", call, " but rank ", peer, " sent ",
                                                    theirs, why));
}

// The error of a rank whose peer ran the same collective under another live-reconfiguration
// epoch (the header's `epoch`): the ranks applied a change at different collectives, so their
// plans may differ (ring order, channels, algorithm, transport) and the result would be wrong.
inline absl::Status EpochMismatch(int rank, const std::string& call, uint64_t epoch, int peer,
                                  const std::string& theirs, const std::string& their_epoch) {
  return absl::FailedPreconditionError(
      absl::StrCat("configuration epoch mismatch: rank ", rank, " runs ", call, " under epoch ",
                   epoch, " but rank ", peer, " sent ", theirs, " under epoch ", their_epoch,
                   ": the ranks applied a live reconfiguration at different collectives"));
}

struct CallEnv {
  int rank = 0;
  int n = 1;
  // A call without progress for this long fails (CommunicatorOptions::timeout).
  absl::Duration timeout = absl::Seconds(60);
  // Spin for CommunicatorOptions::spin (none when yield_when_idle), yield until kYieldWindow,
  // then sleep in the transport.
  base::WaitPolicy wait{absl::ZeroDuration(), kYieldWindow};
  // Oversubscribed host (or PLEXUS_COLL_YIELD=1): waiting ranks yield at once instead of
  // spinning first.
  bool yield_when_idle = false;
  // A call without progress for record_after posts whom it waits for, and re-posts it every
  // record_every while it still waits.
  absl::Duration record_after = absl::Seconds(30);
  absl::Duration record_every = absl::Seconds(15);
  BlameBoard* board = nullptr;
  QosGate* qos = nullptr;          // null without a QoS schedule
  Tracer* trace = nullptr;         // null unless tracing
  ConnectionSet* conns = nullptr;  // the set in use (a live change swaps its contents)
  // [rank]: the backend of the connections to that rank (swapped with `conns`); the same on both
  // ranks of a pair.
  const std::vector<transport::Backend>* peer_backend = nullptr;
  const Layout* layout = nullptr;  // the communicator's ranks in ring order
  // Ends a failed call: works out whom to blame, breaks the communicator, returns the error.
  std::function<absl::Status(const CallHeader& header, Failure failure)> abort;

  // QoS time windows: waits until the schedule allows the next send, driving the transport
  // meanwhile (qos.cpp). Only with a gate.
  absl::Status AdmitSend(const CallHeader& header) const;
};

}  // namespace plexus::collectives::internal
