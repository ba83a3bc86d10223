// Tracing of a communicator's calls: for every collective, Send/Recv and Barrier, when it was
// issued, started and ended, what it moved and how (algorithm, path, channels), and how it ended.
// Off by default; when off a call pays one branch. When on, a call costs three clock reads and a
// short lock, and the records live in a ring of fixed capacity (the oldest are dropped and
// counted). docs/collectives_operations.md, "Tracing", describes the file format and the timeline
// picture.
//
//   CommunicatorOptions options;
//   options.trace.enabled = true;
//   ... calls ...
//   std::string json = comm->TraceJson();  // Chrome trace-event format, any time, any thread
//
// PLEXUS_COLL_TRACE=<prefix> turns tracing on for every communicator of the process and writes
// each one's trace when it is destroyed (TraceOptions::path_prefix).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/types.hpp"

namespace plexus::collectives {

// Default ring capacity (records) when neither the option nor the environment sets one.
inline constexpr size_t kDefaultTraceCapacity = 4096;

// How a traced call moved its data.
enum class TracePath : uint8_t {
  kLocal = 0,    // nothing crossed a connection (count 0, one rank, or refused)
  kMailbox = 1,  // the connections' mailboxes (small calls over shm/inproc)
  kPlan = 2,     // the plan executor over the connections' channels
};
// "local", "mailbox", "plan".
const char* TracePathName(TracePath path);

// TraceOptions::peer_steps: one peer's share of a call (times as TraceEvent's; 0 = none).
struct TracePeerStep {
  int peer = -1;
  int64_t first_send_ns = 0;  // the first message to the peer was posted
  int64_t last_recv_ns = 0;   // the last message from the peer arrived
  uint32_t sends = 0;
  uint32_t recvs = 0;
};

// One call. Times are nanoseconds of CLOCK_MONOTONIC (std::chrono::steady_clock), which every
// process on a host shares; CollectiveTrace's anchors map them to wall-clock time.
struct TraceEvent {
  // Collectives: the call's number in this communicator (the header's, equal on every rank);
  // Send/Recv: the message number of that direction of the pair.
  uint64_t sequence = 0;
  // nullopt: the call was refused before it started because the communicator was broken.
  std::optional<CollectiveKind> kind;
  bool is_send = false;  // kSendRecv: a Send (else a Recv)
  int peer = -1;         // kSendRecv: the other rank
  int root = -1;         // Reduce, Broadcast
  uint64_t count = 0;    // elements, as passed
  // What the selector sees: count x element size, times the ranks for AllGather, ReduceScatter
  // and AllToAll; AllToAllV: the extent of the send buffer.
  uint64_t bytes = 0;
  DataType dtype = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  std::optional<DataType> wire;  // a fused cast's wire type
  TracePath path = TracePath::kLocal;
  int channels = 0;                  // channels the plan used (0 off the plan path)
  uint32_t messages = 0;             // sends + receives the plan posted
  int64_t issue_ns = 0;              // the caller issued it (Blocking, Async or inline call)
  int64_t start_ns = 0;              // it started running (after the calls queued before it)
  int64_t end_ns = 0;                // it returned
  absl::Status status;               // how it ended
  std::vector<TracePeerStep> peers;  // TraceOptions::peer_steps: the peers it exchanged with
};

// A communicator's trace at one moment.
struct CollectiveTrace {
  bool enabled = false;
  int rank = 0;
  int size = 0;
  uint64_t communicator = 0;  // the id every rank of the communicator shares
  std::string tag;            // "coll", or the Split path
  std::string host;           // the host identity the communicator uses
  int64_t pid = 0;
  // The same instant on both clocks, taken when the communicator was created: wall-clock time
  // of a record = anchor_wall_ns + (t - anchor_monotonic_ns). Lines up traces of other hosts
  // (to the accuracy of their clocks' synchronisation).
  int64_t anchor_monotonic_ns = 0;
  int64_t anchor_wall_ns = 0;  // Unix time
  size_t capacity = 0;
  uint64_t recorded = 0;           // calls recorded since creation
  uint64_t dropped = 0;            // of those, overwritten by newer ones (recorded - events.size())
  std::vector<TraceEvent> events;  // oldest first
};

// `trace` in Chrome's trace-event format (chrome://tracing, ui.perfetto.dev, plexus-plot
// timeline): {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}; one complete
// ("X") event per call on pid = rank, ts/dur in microseconds of the monotonic clock, the record's
// fields (nanosecond times included) in its args, and the trace's header in otherData.
std::string ToChromeTraceJson(const CollectiveTrace& trace);

}  // namespace plexus::collectives
