// The recorder behind CommunicatorOptions::trace (trace.hpp). The communicator holds one only when
// tracing is on, so every hook is `if (trace_) trace_->...`. Calls of a communicator run one at a
// time: Begin, the notes and End bracket the running call from its own thread, while Snapshot may
// be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan.hpp"
#include "plexus/collectives/trace.hpp"
#include "wire.hpp"

namespace plexus::collectives::internal {

class Tracer {
 public:
  // The effective options: `options` completed from the environment (PLEXUS_COLL_TRACE,
  // PLEXUS_COLL_TRACE_CAPACITY, PLEXUS_COLL_TRACE_PEERS). InvalidArgument for a capacity out of
  // range or a malformed variable. Called before the ranks connect, so that a bad setting fails
  // creation before any peer waits for this rank.
  static absl::StatusOr<TraceOptions> Resolve(const TraceOptions& options, int rank);
  // nullptr when `resolved` (from Resolve) leaves tracing off.
  static std::unique_ptr<Tracer> Create(const TraceOptions& resolved, int rank, int size,
                                        uint64_t communicator, std::string tag, std::string host);

  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The running call: started now, issued at `issued_ns` (0: now).
  void Begin(int64_t issued_ns);
  // Its header (kind, sizes, algorithm, sequence); `peer` for Send/Recv.
  void Describe(const CallHeader& header, int peer = -1);
  void NoteBytes(uint64_t bytes) { current_.bytes = bytes; }
  void NotePlan(const Plan& plan);
  void NoteMailbox() { current_.path = TracePath::kMailbox; }
  // The executor posted a send to / received a message from `peer` (TraceOptions::peer_steps).
  void NoteSend(int peer) {
    if (!options_.peer_steps) return;
    TracePeerStep& p = peer_steps_[peer];
    if (p.sends++ == 0) p.first_send_ns = Now();
  }
  void NoteRecv(int peer) {
    if (!options_.peer_steps) return;
    TracePeerStep& p = peer_steps_[peer];
    ++p.recvs;
    p.last_recv_ns = Now();
  }
  // Records the running call.
  void End(const absl::Status& status);
  // A call refused at once (the communicator was broken): recorded without a kind.
  void Refused(int64_t issued_ns, const absl::Status& status);

  CollectiveTrace Snapshot() const;
  // Writes the trace to the file TraceOptions::path_prefix names, if any; errors are logged
  // (base::Log; called from the destructor).
  void WriteIfAsked() const;

 private:
  Tracer() = default;
  void Push(TraceEvent event);

  TraceOptions options_;
  CollectiveTrace header_;                 // everything but events, recorded and dropped
  std::string file_;                       // "" = write nothing
  TraceEvent current_;                     // the running call (its thread only)
  std::vector<TracePeerStep> peer_steps_;  // per rank, the running call's (peer_steps only)

  mutable std::mutex mu_;
  std::vector<TraceEvent> ring_;  // grows to capacity, then next_ wraps
  size_t next_ = 0;
  uint64_t recorded_ = 0;
};

}  // namespace plexus::collectives::internal
