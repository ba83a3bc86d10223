// The plan executor: runs a plan's sends and receives over the connection set, checks each
// call's first message per connection, reduces in plan order (never arrival order), and turns a
// stall or a failed connection into a Failure for CallEnv::abort. It keeps every buffer of a
// call for the next one: a call allocates nothing once the sizes have been seen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "call_env.hpp"
#include "plan.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"

namespace plexus::collectives::internal {

class MailboxPath;

class PlanExecutor {
 public:
  // `mailboxes`: checked for a peer that took the mailbox path where this rank runs a plan.
  PlanExecutor(const CallEnv& env, const MailboxPath& mailboxes)
      : env_(env), mailboxes_(mailboxes) {}
  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;

  // The connections per peer the plans' channels map to, and the receive slots per connection.
  // A later call with another channel count keeps the state (warm slots) of the channels below
  // both counts.
  void SetChannels(int channels);
  void SetDepth(int depth) { depth_ = depth; }

  // Runs `plan` to completion; the first message of the call on each connection carries
  // `header`. A failure goes through env.abort, whose error this returns.
  absl::Status Execute(const Plan& plan, const CallHeader& header, DataType dtype, ReduceOp op);

 private:
  enum : uint8_t { kIdle = 0, kPosted = 1, kArrived = 2, kDone = 3 };  // per send / receive
  // One (peer, channel): its sends and receives in plan order and its receive (and, with a
  // cast, send) slots.
  struct Link {
    std::vector<int> sends, recvs;  // op indices in order
    size_t next_send = 0, next_recv = 0, low_recv = 0;
    int sends_in_flight = 0;
    size_t slot_stride = 0;
    std::vector<uint8_t> slots;
    size_t slots_taken = 0;       // receives posted into slots (slot = slots_taken % depth)
    std::vector<int> slot_owner;  // per slot: the receive using it, -1 if none yet
    // Wire casts: sends are packed into one of `depth` send slots (reused once that send
    // completed), so that the staging memory is bounded by the pipeline, not the vector.
    size_t send_slot_stride = 0;
    std::vector<uint8_t> send_slots;
    size_t send_slots_taken = 0;
    std::vector<int> send_slot_owner;  // per send slot: the send using it, -1 if none yet
    uint8_t tx_header[kHeaderBytes];
    // How the first message's header and payload reach their places (HeaderPath): through a
    // slot and a copy (neither flag), as a message of its own (split), or taken apart by a
    // consumed receive as they leave the transport (scatter, receive side only: the sender sends
    // header and payload as one message, as unsplit).
    bool split_tx = false, split_rx = false, scatter_rx = false;
    bool header_sent = false, header_posted = false;
    // The header receive's buffer (split: room for a mismatched first message; scatter: the
    // header's bytes).
    std::vector<uint8_t> rx_header;
  };
  // The running call.
  struct Call {
    const Plan* plan = nullptr;
    const CallHeader* header = nullptr;
    DataType dtype = DataType::kF32;
    ReduceOp op = ReduceOp::kSum;
    // A fused cast: the plan's byte counts are of `dtype` (f32); messages carry `wire` elements.
    bool cast = false;
    DataType wire = DataType::kF32;
    size_t data_size = 4, wire_size = 4;
    uint64_t epoch = 0;  // tags the work requests, so that leftovers of older calls are ignored
    size_t num_sends = 0, num_recvs = 0;
    size_t sends_done_prefix = 0, recvs_done_prefix = 0, sends_done = 0, recvs_done = 0;
    size_t reduce_cursor = 0;               // next entry of reduce_order_
    size_t headers_tx = 0, headers_rx = 0;  // header messages of their own (split links)
    size_t headers_tx_done = 0, headers_rx_done = 0;
    size_t OnWire(size_t bytes) const { return cast ? bytes / data_size * wire_size : bytes; }
  };
  // The waiting loop's clock: when it last saw progress and how it waits now.
  struct Idle {
    absl::Time last_progress;
    absl::Duration idle = absl::ZeroDuration();
    bool progressed = false;
    uint32_t polls = 0;
    bool contended = false;  // a yield found the CPU contended: sleep until the next progress
    absl::Duration next_wait_record;
  };
  enum class Polled { kGot, kAgain, kFailed };

  Link& LinkOf(int peer, int channel) {
    return links_[static_cast<size_t>(peer) * channels_ + channel];
  }
  // Sorts the plan's operations into links_ and sizes their slots; resets the per-call state.
  void Prepare(const Plan& plan, const CallHeader& header, DataType dtype, ReduceOp op);
  // Local work that became possible: copies out of slots, reductions in plan order.
  void DoLocal();
  bool CopyOutOfSlots();
  bool ReduceInOrder();
  void AdvancePrefixes();
  void FinishRecv(int i);
  // Posts what each link's order and dependencies allow; false with *failure on an error.
  bool PostAll(Failure* failure);
  bool PostRecvs(Link& link, int peer, transport::Connection* conn, Failure* failure);
  bool PostSends(Link& link, int peer, transport::Connection* conn, Failure* failure);
  // Books one completion; false with *failure when it ends the call.
  bool OnCompletion(const transport::Completion& c, Failure* failure);
  // The first message of the call on a link: the peer's header (in `data`, `bytes` long with
  // what follows it) must name the same call.
  bool CheckHeader(int peer, const uint8_t* data, size_t bytes, Failure* failure);
  // How a link's call header travels with a first payload of `first_bytes` on the wire to or
  // from `peer`: both ends of the link decide alike, from the call (kind, cast, sizes) and the
  // pair's backend.
  enum class HeaderPath { kSlot, kSplit, kScatter };
  HeaderPath HeaderPathOf(int peer, size_t first_bytes) const;
  // Polls the completion queue into `batch` (*got completions), waiting as env.wait says when
  // nothing is there: kAgain to loop (nothing yet), kFailed with *failure on a stall or a
  // mismatch found meanwhile.
  Polled Poll(Idle& idle, absl::Span<transport::Completion> batch, size_t* got, Failure* failure);
  // The ranks a stalled plan waits for: those with a receive posted but not arrived or a send
  // in flight (what is not posted yet waits for these); failing that, any with work left.
  std::vector<int> WaitingFor() const;

  const CallEnv& env_;
  const MailboxPath& mailboxes_;
  int channels_ = 1;
  int depth_ = 4;
  // links_[peer * channels_ + channel]
  std::vector<Link> links_;
  uint64_t epoch_ = 0;
  Call call_;
  // Per-call state, kept to reuse its storage.
  std::vector<size_t> max_recv_, max_send_;
  std::vector<int> reduce_order_;
  std::vector<uint8_t> send_state_, recv_state_;
  std::vector<uint8_t*> recv_landing_;  // where each receive's payload arrived
  std::vector<int> slot_copies_;        // arrived into a slot, to be copied out
};

}  // namespace plexus::collectives::internal
