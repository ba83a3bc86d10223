// The plan executor: runs a plan's sends and receives over the connections, checks each call's
// first message per connection, reduces in plan order, and turns a stall or a failed connection
// into a Failure for Abort.
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "communicator_impl.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::collectives::internal {

using transport::Completion;
using transport::ConstBuffer;
using transport::MutableBuffer;

std::vector<int> CommunicatorImpl::WaitingFor(int channels) const {
  std::vector<int> blocked, pending;
  auto add = [](std::vector<int>& v, int peer) {
    if (std::find(v.begin(), v.end(), peer) == v.end()) v.push_back(peer);
  };
  for (size_t l = 0; l < links_.size(); ++l) {
    const Link& link = links_[l];
    const int peer = static_cast<int>(l / channels);
    if (link.sends_in_flight > 0) add(blocked, peer);
    for (size_t k = link.low_recv; k < link.next_recv; ++k) {
      if (recv_state_[link.recvs[k]] == kPosted) add(blocked, peer);
    }
    if (link.low_recv < link.recvs.size() || link.next_send < link.sends.size()) {
      add(pending, peer);
    }
  }
  return blocked.empty() ? pending : blocked;
}

absl::Status CommunicatorImpl::Execute(const Plan& plan, const CallHeader& header, DataType dtype,
                                       ReduceOp op) {
  const int n = layout_.n;
  const int channels = options_.channels;
  const int depth = options_.pipeline_depth;
  const size_t num_sends = plan.sends.size();
  const size_t num_recvs = plan.recvs.size();
  if (num_sends == 0 && num_recvs == 0) return absl::OkStatus();
  // QoS: a schedule that cannot admit a send within the timeout fails the call before this rank
  // touches a connection (so its own error, not a peer's reaction, is what it reports).
  if (qos_ != nullptr && num_sends > 0) {
    if (absl::Status s = qos_->CheckReachable(options_.timeout, [&] { return header.Describe(); });
        !s.ok()) {
      return Abort(header, Failure::Own(std::move(s)));
    }
  }
  if (trace_ != nullptr) trace_->NotePlan(plan);
  const uint64_t epoch = ++epoch_ & 0x7FFFFFFF;
  // A fused cast: the plan's byte counts are of `dtype` (f32); messages carry `wire` elements.
  const bool cast = plan.wire.has_value();
  const DataType wire = cast ? *plan.wire : dtype;
  const size_t data_size = DataTypeSize(dtype);
  const size_t wire_size = DataTypeSize(wire);
  auto on_wire = [&](size_t bytes) { return cast ? bytes / data_size * wire_size : bytes; };

  for (Link& link : links_) {
    link.sends.clear();
    link.recvs.clear();
    link.next_send = link.next_recv = link.low_recv = 0;
    link.sends_in_flight = 0;
    link.slots_taken = 0;
    link.slot_owner.assign(depth, -1);
    link.send_slots_taken = 0;
    if (cast) link.send_slot_owner.assign(depth, -1);
  }
  std::vector<size_t>& max_recv = max_recv_;
  max_recv.assign(links_.size(), 0);
  std::vector<size_t>& max_send = max_send_;
  max_send.assign(links_.size(), 0);
  for (size_t i = 0; i < num_sends; ++i) {
    const auto& op_ = plan.sends[i];
    const size_t l = op_.peer * channels + op_.channel;
    links_[l].sends.push_back(static_cast<int>(i));
    max_send[l] = std::max(max_send[l], on_wire(op_.bytes));
  }
  std::vector<int>& reduce_order = reduce_order_;
  reduce_order.clear();
  for (size_t i = 0; i < num_recvs; ++i) {
    const auto& op_ = plan.recvs[i];
    const size_t l = op_.peer * channels + op_.channel;
    links_[l].recvs.push_back(static_cast<int>(i));
    max_recv[l] = std::max(max_recv[l], on_wire(op_.bytes));
    if (op_.reduce) reduce_order.push_back(static_cast<int>(i));
  }
  for (size_t l = 0; l < links_.size(); ++l) {
    Link& link = links_[l];
    if (!link.sends.empty()) {
      CallHeader h = header;
      h.extra = plan.tx_extra.empty() ? 0 : plan.tx_extra[l / channels];
      h.Encode(link.tx_header);
      if (cast) {
        link.send_slot_stride = (max_send[l] + 63) & ~size_t{63};
        const size_t need = link.send_slot_stride * depth;
        if (link.send_slots.size() < need) link.send_slots.resize(need);
      }
    }
    if (!link.recvs.empty()) {
      // At least 4 KiB, so that a small oversized first message (a mismatched call) still fits
      // and its header can say which call the peer is in.
      link.slot_stride = (std::max(kHeaderBytes + max_recv[l], size_t{4096}) + 63) & ~size_t{63};
      const size_t need = link.slot_stride * depth;
      if (link.slots.size() < need) link.slots.resize(need);
    }
  }

  std::vector<uint8_t>& send_state = send_state_;
  std::vector<uint8_t>& recv_state = recv_state_;
  send_state.assign(num_sends, kIdle);
  recv_state.assign(num_recvs, kIdle);
  std::vector<uint8_t*>& recv_landing = recv_landing_;  // where the payload arrived
  recv_landing.assign(num_recvs, nullptr);
  size_t sends_done_prefix = 0, recvs_done_prefix = 0, sends_done = 0, recvs_done = 0;
  size_t reduce_cursor = 0;
  std::vector<int>& slot_copies = slot_copies_;  // arrived into a slot, to be copied out
  slot_copies.clear();

  auto describe = [&] { return header.Describe(); };
  auto advance_prefixes = [&] {
    while (sends_done_prefix < num_sends && send_state[sends_done_prefix] == kDone) {
      ++sends_done_prefix;
    }
    while (recvs_done_prefix < num_recvs && recv_state[recvs_done_prefix] == kDone) {
      ++recvs_done_prefix;
    }
  };
  auto finish_recv = [&](int i) {
    recv_state[i] = kDone;
    ++recvs_done;
    const auto& r = plan.recvs[i];
    Link& link = links_[r.peer * channels + r.channel];
    while (link.low_recv < link.recvs.size() && recv_state[link.recvs[link.low_recv]] == kDone) {
      ++link.low_recv;
    }
  };
  // Local work that became possible: copies out of slots, reductions in plan order.
  auto do_local = [&] {
    bool progress = true;
    while (progress) {
      progress = false;
      advance_prefixes();
      for (size_t j = 0; j < slot_copies.size();) {
        const int i = slot_copies[j];
        const auto& r = plan.recvs[i];
        if (sends_done_prefix >= static_cast<size_t>(r.war_prefix)) {
          if (cast) {
            plexus::kernels::UnpackWire(wire, reinterpret_cast<float*>(r.data), recv_landing[i],
                                 r.bytes / data_size);
          } else if (r.bytes > 0) {
            std::memcpy(r.data, recv_landing[i], r.bytes);
          }
          finish_recv(i);
          slot_copies[j] = slot_copies.back();
          slot_copies.pop_back();
          progress = true;
        } else {
          ++j;
        }
      }
      while (reduce_cursor < reduce_order.size()) {
        const int i = reduce_order[reduce_cursor];
        const auto& r = plan.recvs[i];
        if (recv_state[i] != kArrived || sends_done_prefix < static_cast<size_t>(r.war_prefix)) {
          break;
        }
        const size_t elems = r.bytes / data_size;
        if (cast) {
          // The incoming chunk is converted and folded into the f32 accumulator in one pass.
          auto* dst = reinterpret_cast<float*>(r.data);
          const auto* local = r.local == nullptr ? dst : reinterpret_cast<const float*>(r.local);
          plexus::kernels::ReduceWire(wire, op, dst, local, recv_landing[i], elems, r.src_first);
        } else if (r.local == nullptr) {
          plexus::kernels::ReduceInto(dtype, op, r.data, recv_landing[i], elems, r.src_first);
        } else if (recv_landing[i] == r.data) {
          // data holds the incoming operand: the same operation with the roles swapped.
          plexus::kernels::ReduceInto(dtype, op, r.data, r.local, elems, !r.src_first);
        } else {  // landed in a slot: one pass, no copy of the operand first
          plexus::kernels::ReduceOutOf(dtype, op, r.data, r.local, recv_landing[i], elems, r.src_first);
        }
        finish_recv(i);
        ++reduce_cursor;
        progress = true;
      }
    }
    advance_prefixes();
  };

  Failure failure;
  auto post_all = [&]() -> bool {
    for (size_t l = 0; l < links_.size(); ++l) {
      Link& link = links_[l];
      const int peer = static_cast<int>(l / channels);
      transport::Connection* conn =
          link.sends.empty() && link.recvs.empty() ? nullptr : conns_[l % channels][peer].get();
      // Receives, in order. Those that land in a slot (a call's first message, with its header;
      // in-place reductions) wait for a free one of the link's `depth` slots; the others go
      // straight to their destination and are posted as early as their order allows, so that
      // a peer running ahead finds them posted rather than having its messages held.
      while (link.next_recv < link.recvs.size()) {
        const int i = link.recvs[link.next_recv];
        const auto& r = plan.recvs[i];
        MutableBuffer target;
        // With a cast every receive lands in a slot: its bytes are not yet of the output's type.
        if (link.next_recv == 0 || (r.reduce && r.local == nullptr) || cast) {
          int& owner = link.slot_owner[link.slots_taken % depth];
          if (owner >= 0 && recv_state[owner] != kDone) break;
          uint8_t* slot = link.slots.data() + (link.slots_taken % depth) * link.slot_stride;
          owner = i;
          ++link.slots_taken;
          // The first: header + payload, with room to see an oversized (mismatched) message.
          target = {slot, link.next_recv == 0 ? link.slot_stride : on_wire(r.bytes)};
        } else {  // placed, or reduced out of place: straight into the destination
          if (sends_done_prefix < static_cast<size_t>(r.war_prefix)) break;
          target = {r.data, r.bytes};
        }
        const uint64_t wr = (epoch << 32) | static_cast<uint64_t>(i);
        if (absl::Status s = conn->PostRecv(target, wr); !s.ok()) {
          failure = Failure::Peer(peer, s);
          return false;
        }
        recv_state[i] = kPosted;
        recv_landing[i] = static_cast<uint8_t*>(target.data);
        ++link.next_recv;
      }
      // Sends, in order, once their inputs are final.
      while (link.next_send < link.sends.size() && link.sends_in_flight < depth) {
        const int i = link.sends[link.next_send];
        const auto& s = plan.sends[i];
        if (s.dep >= 0 && recv_state[s.dep] != kDone) break;
        if (recvs_done_prefix < static_cast<size_t>(s.dep_prefix)) break;
        ConstBuffer parts[2];
        size_t nparts = 0;
        if (link.next_send == 0) parts[nparts++] = {link.tx_header, kHeaderBytes};
        if (cast && s.bytes > 0) {
          // Pack the chunk into a free send slot, converting as it is copied; a final result's
          // sender keeps the rounded values (SendOp::final: data is in the call's output).
          int& owner = link.send_slot_owner[link.send_slots_taken % depth];
          if (owner >= 0 && send_state[owner] != kDone) break;
          uint8_t* slot =
              link.send_slots.data() + (link.send_slots_taken % depth) * link.send_slot_stride;
          owner = i;
          ++link.send_slots_taken;
          const auto* from = reinterpret_cast<const float*>(s.data);
          plexus::kernels::PackWire(wire, slot, from, s.bytes / data_size,
                             s.final ? const_cast<float*>(from) : nullptr);
          parts[nparts++] = {slot, on_wire(s.bytes)};
        } else if (s.bytes > 0) {
          parts[nparts++] = {s.data, s.bytes};
        }
        if (qos_ != nullptr) {  // QoS time windows: wait for the schedule to allow the send
          if (absl::Status st = AdmitSend(header); !st.ok()) {
            failure = Failure::Own(std::move(st));
            return false;
          }
        }
        const uint64_t wr = (uint64_t{1} << 63) | (epoch << 32) | static_cast<uint64_t>(i);
        if (absl::Status st = conn->PostSend(absl::MakeConstSpan(parts, nparts), wr); !st.ok()) {
          failure = Failure::Peer(peer, st);
          return false;
        }
        if (qos_ != nullptr) qos_->Posted();
        send_state[i] = kPosted;
        if (trace_ != nullptr) trace_->NoteSend(peer);
        ++link.sends_in_flight;
        ++link.next_send;
      }
    }
    return true;
  };

  auto on_completion = [&](const Completion& c) -> bool {
    const bool is_send = (c.wr_id >> 63) != 0;
    if (((c.wr_id >> 32) & 0x7FFFFFFF) != epoch) return true;  // a leftover of an older call
    const size_t i = c.wr_id & 0xFFFFFFFF;
    auto it = peer_of_connection_.find(c.connection_id);
    const int peer = it == peer_of_connection_.end() ? -1 : it->second;
    if (!c.status.ok() && !is_send && c.status.code() == absl::StatusCode::kResourceExhausted &&
        i < num_recvs) {
      failure = Failure::Own(absl::FailedPreconditionError(
          absl::StrCat("mismatched collective calls: rank ", peer, " sent rank ", layout_.rank,
                       " a message larger than its ", describe(), " expects (",
                       std::string(c.status.message()), "): the ranks' calls do not match")));
      return false;
    }
    if (!c.status.ok()) {
      failure = Failure::Peer(peer, c.status);
      return false;
    }
    if (is_send) {
      if (i >= num_sends) return true;
      const auto& s = plan.sends[i];
      send_state[i] = kDone;
      ++sends_done;
      --links_[s.peer * channels + s.channel].sends_in_flight;
      return true;
    }
    if (i >= num_recvs) return true;
    const auto& r = plan.recvs[i];
    Link& link = links_[r.peer * channels + r.channel];
    const bool first = !link.recvs.empty() && link.recvs[0] == static_cast<int>(i);
    size_t payload = c.bytes;
    if (first) {
      auto theirs = CallHeader::Decode(absl::MakeConstSpan(recv_landing[i], c.bytes));
      if (!theirs.ok()) {
        failure = Failure::Own(absl::FailedPreconditionError(
            absl::StrCat(describe(), " on rank ", layout_.rank, ": the message from rank ", r.peer,
                         " is not the start of a call (", std::string(theirs.status().message()),
                         "): the ranks issued different sequences of calls")));
        return false;
      }
      // Collectives run under the same epoch on every rank (the sequence-number barrier);
      // Send/Recv number their messages per pair and may straddle a change.
      if (theirs->epoch != header.epoch && header.kind != CollectiveKind::kSendRecv) {
        failure = Failure::Own(EpochMismatch(layout_.rank, describe(), header.epoch, r.peer,
                                             theirs->Describe(), absl::StrCat(theirs->epoch)));
        return false;
      }
      const uint64_t expected_extra = plan.rx_extra.empty() ? 0 : plan.rx_extra[r.peer];
      if (!theirs->SameCall(header) || theirs->sender != r.peer ||
          theirs->extra != expected_extra) {
        CallHeader mine = header;
        mine.extra = expected_extra;
        const bool algo_only = theirs->algorithm != header.algorithm &&
                               theirs->kind == header.kind && theirs->count == header.count &&
                               theirs->dtype == header.dtype;
        failure = Failure::Own(MismatchedCalls(
            layout_.rank, mine.Describe(), theirs->sender, theirs->Describe(),
            algo_only ? " (the ranks chose different algorithms: set the same "
                        "PLEXUS_COLL_ALGO, table and per-call algorithm on every rank)"
                      : ""));
        return false;
      }
      recv_landing[i] += kHeaderBytes;
      payload = c.bytes - kHeaderBytes;
    }
    if (payload != on_wire(r.bytes)) {
      failure = Failure::Own(absl::FailedPreconditionError(absl::StrCat(
          describe(), " on rank ", layout_.rank, ": rank ", r.peer, " sent a message of ", payload,
          " bytes where ", on_wire(r.bytes),
          " were expected: the ranks' calls do not match (count, type or algorithm)")));
      return false;
    }
    recv_state[i] = kArrived;
    if (trace_ != nullptr) trace_->NoteRecv(r.peer);
    if (r.reduce) return true;  // reduced in plan order by do_local
    if (recv_landing[i] != r.data) {
      slot_copies.push_back(static_cast<int>(i));
    } else {
      finish_recv(static_cast<int>(i));
    }
    return true;
  };

  // The clock is read only when a poll finds nothing, and then only on every 16th such poll
  // (reading it is a visible share of a small call) while spinning, but on every one once past
  // the yield window, where each pass sleeps anyway: last_progress is the first such moment after
  // the latest completion. (Reading it rarely there too let a timed-out Wait repeat 16 times
  // with a stale `left`; docs/measurements/collectives.md, "Figures first recorded in code
  // comments".)
  absl::Time last_progress = absl::Now();
  absl::Duration idle = absl::ZeroDuration();
  bool progressed = false;
  uint32_t idle_polls = 0;
  bool contended = false;  // a yield found the CPU contended: sleep until the next progress
  const base::WaitPolicy wait = WaitingPolicy();
  absl::Duration next_wait_record = wait_record_after_;  // idle time of the next wait record
  Completion batch[32];
  for (;;) {
    do_local();
    if (!post_all()) break;
    if (sends_done == num_sends && recvs_done == num_recvs) {
      if (board_->posted()) board_->Retract();
      // A peer's mailbox message of an earlier call that this rank never received (a broadcast
      // root that differed) is found here too when the call never had to wait (a rank that
      // starts late finds everything arrived): mismatches do not depend on timing.
      if (mailboxes_ready_ && header.kind != CollectiveKind::kSendRecv) {
        if (absl::Status s = CheckMailboxes(header); !s.ok()) {
          failure = Failure::Own(s);
          break;
        }
      }
      return absl::OkStatus();
    }
    size_t got = cq_->Poll(absl::MakeSpan(batch));  // moves bytes too, in caller mode
    if (got == 0) {
      if (progressed || ++idle_polls % 16 == 0 || contended ||
          wait.At(idle) == base::WaitPolicy::Phase::kSleep) {
        const absl::Time now = absl::Now();
        if (progressed) {
          last_progress = now;
          progressed = false;
          contended = false;
          idle_polls = 0;
          next_wait_record = wait_record_after_;
          if (board_->posted()) board_->Retract();
        }
        idle = now - last_progress;
        // Long without progress: publish whom this rank waits for (off the fast path), so that
        // whichever rank times out first finds the wait-for graph on the store.
        if (idle >= next_wait_record && idle < options_.timeout) {
          board_->PostWaiting(WaitingFor(channels), absl::StatusCode::kDeadlineExceeded,
                              absl::StrCat("waiting for ", absl::FormatDuration(idle)));
          next_wait_record = idle + wait_record_every_;
        }
      }
      const absl::Duration left = options_.timeout - idle;
      if (left <= absl::ZeroDuration()) {
        failure = Failure::Stall(WaitingFor(channels));
        break;
      }
      // Send/Recv numbers its messages per pair, not per call: nothing to compare with.
      if (mailboxes_ready_ && header.kind != CollectiveKind::kSendRecv) {
        if (absl::Status s = CheckMailboxes(header); !s.ok()) {
          failure = Failure::Own(s);
          break;
        }
      }
      // Waiting: spin (lowest latency, unless the host is oversubscribed), then poll and yield
      // the CPU to whoever needs it (a peer rank, or anything else this host runs), and only
      // after kYieldWindow without progress sleep in the transport.
      // A contended CPU (a yield came back late) sleeps at once until the next progress.
      const base::WaitPolicy::Phase phase = !contended ? wait.At(idle)
                                            : idle < base::WaitPolicy::kContendedPoll
                                                ? base::WaitPolicy::Phase::kSpin
                                                : base::WaitPolicy::Phase::kSleep;
      if (phase == base::WaitPolicy::Phase::kSpin) continue;
      if (phase == base::WaitPolicy::Phase::kYield) {
        // Not when this host runs more ranks than CPUs: there every yield is late because the
        // peer ranks run, and yielding to them is what moves the collective (sleeping instead
        // made small allreduces many times slower; docs/measurements/collectives.md, "Waiting").
        contended = base::WaitPolicy::Yield(/*can_sleep=*/!yield_when_idle_) && !yield_when_idle_;
        continue;
      }
      // Wake for the next wait record too.
      absl::StatusOr<Completion> c =
          cq_->Wait(std::min(left, std::max(next_wait_record - idle, absl::Milliseconds(1))),
                    absl::ZeroDuration());
      if (!c.ok()) continue;  // timed out: the checks above report it or post the record
      batch[0] = *std::move(c);
      got = 1;
    }
    progressed = true;
    bool ok = true;
    for (size_t k = 0; k < got && ok; ++k) ok = on_completion(batch[k]);
    if (!ok) break;
  }
  (void)n;
  return Abort(header, std::move(failure));
}

}  // namespace plexus::collectives::internal
