// The plan executor (executor.hpp). Execute prepares the links (Prepare), then loops: local work
// that became possible (DoLocal: copies out of slots, reductions in plan order), posting what the
// dependencies allow (PostAll), and booking completions (Poll, OnCompletion), until every send and
// receive is done or a Failure ends the call through CallEnv::abort.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "blame.hpp"
#include "connection_set.hpp"
#include "executor.hpp"
#include "mailbox_path.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/kernels/reduce.hpp"
#include "qos_gate.hpp"
#include "tracer.hpp"

namespace plexus::collectives::internal {

using transport::Completion;
using transport::ConstBuffer;
using transport::MutableBuffer;

namespace {

// The index bit of a header's own send or receive (a split link) in its work request id.
constexpr uint64_t kHeaderOp = uint64_t{1} << 30;
// Elsewhere a link's header travels alone ahead of a first payload this large: one more message
// against a copy of the payload out of a slot.
constexpr size_t kSplitHeaderBytes = 16 << 10;
// Over shm and inproc, a first message (header and payload) from kScatterHeaderFrom bytes of
// payload and below kShmLonePullBytes in all is taken apart by a consumed receive instead: no
// message more, no copy more. Below the lower bound the slot's copy costs no more than the
// consumer. Constants, so that both ends of a link choose alike.
constexpr size_t kScatterHeaderFrom = 4 << 10;
// Bytes beyond what a first receive expects, so that a longer (mismatched) message still
// arrives and its header says which call it is in.
constexpr size_t kMismatchRoom = 4096;
// The header receive's buffer: room for any unsplit first message (a mismatched peer's).
constexpr size_t kSplitHeaderRoom = kSplitHeaderBytes + kMismatchRoom;

// A consumer for a first message of header and payload: the header's bytes to `head`, the
// payload's to `to` (up to `payload` bytes; a mismatched longer message's excess is dropped).
transport::Consumer TakeApart(uint8_t* head, uint8_t* to, size_t payload) {
  return [head, to, payload](size_t offset, absl::Span<const uint8_t> in) {
    size_t used = 0;
    if (offset < kHeaderBytes) {
      used = std::min(in.size(), kHeaderBytes - offset);
      std::memcpy(head + offset, in.data(), used);
    }
    const size_t at = offset + used - kHeaderBytes;
    if (used < in.size() && at < payload) {
      std::memcpy(to + at, in.data() + used, std::min(in.size() - used, payload - at));
    }
    return absl::OkStatus();
  };
}

}  // namespace

void PlanExecutor::SetChannels(int channels) {
  const int n = env_.n;
  const int old_channels = links_.empty() ? 0 : channels_;
  // The kept channels keep their link state (their warm receive slots) under the new stride.
  std::vector<Link> links(static_cast<size_t>(n) * channels);
  for (int p = 0; p < n; ++p) {
    for (int c = 0; c < std::min(old_channels, channels); ++c) {
      links[static_cast<size_t>(p) * channels + c] =
          std::move(links_[static_cast<size_t>(p) * old_channels + c]);
    }
  }
  links_ = std::move(links);
  channels_ = channels;
}

std::vector<int> PlanExecutor::WaitingFor() const {
  std::vector<int> blocked, pending;
  auto add = [](std::vector<int>& v, int peer) {
    if (std::find(v.begin(), v.end(), peer) == v.end()) v.push_back(peer);
  };
  for (size_t l = 0; l < links_.size(); ++l) {
    const Link& link = links_[l];
    const int peer = static_cast<int>(l / channels_);
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

void PlanExecutor::Prepare(const Plan& plan, const CallHeader& header, DataType dtype,
                           ReduceOp op) {
  const int channels = channels_;
  const int depth = depth_;
  Call& c = call_;
  c = Call();
  c.plan = &plan;
  c.header = &header;
  c.dtype = dtype;
  c.op = op;
  c.num_sends = plan.sends.size();
  c.num_recvs = plan.recvs.size();
  c.epoch = ++epoch_ & 0x7FFFFFFF;
  c.cast = plan.wire.has_value();
  c.wire = c.cast ? *plan.wire : dtype;
  c.data_size = DataTypeSize(dtype);
  c.wire_size = DataTypeSize(c.wire);

  for (Link& link : links_) {
    link.sends.clear();
    link.recvs.clear();
    link.next_send = link.next_recv = link.low_recv = 0;
    link.sends_in_flight = 0;
    link.slots_taken = 0;
    link.slot_owner.assign(depth, -1);
    link.send_slots_taken = 0;
    if (c.cast) link.send_slot_owner.assign(depth, -1);
    link.split_tx = link.split_rx = link.scatter_rx = false;
    link.header_sent = link.header_posted = false;
  }
  std::vector<size_t>& max_recv = max_recv_;
  max_recv.assign(links_.size(), 0);
  std::vector<size_t>& max_send = max_send_;
  max_send.assign(links_.size(), 0);
  for (size_t i = 0; i < c.num_sends; ++i) {
    const auto& op_ = plan.sends[i];
    const size_t l = op_.peer * channels + op_.channel;
    links_[l].sends.push_back(static_cast<int>(i));
    max_send[l] = std::max(max_send[l], c.OnWire(op_.bytes));
  }
  std::vector<int>& reduce_order = reduce_order_;
  reduce_order.clear();
  for (size_t i = 0; i < c.num_recvs; ++i) {
    const auto& op_ = plan.recvs[i];
    const size_t l = op_.peer * channels + op_.channel;
    links_[l].recvs.push_back(static_cast<int>(i));
    max_recv[l] = std::max(max_recv[l], c.OnWire(op_.bytes));
    if (op_.reduce) reduce_order.push_back(static_cast<int>(i));
  }
  for (size_t l = 0; l < links_.size(); ++l) {
    Link& link = links_[l];
    const int peer = static_cast<int>(l / channels);
    if (!link.sends.empty()) {
      link.split_tx =
          HeaderPathOf(peer, c.OnWire(plan.sends[link.sends[0]].bytes)) == HeaderPath::kSplit;
      c.headers_tx += link.split_tx ? 1 : 0;
    }
    if (!link.recvs.empty()) {
      const HeaderPath path = HeaderPathOf(peer, c.OnWire(plan.recvs[link.recvs[0]].bytes));
      link.split_rx = path == HeaderPath::kSplit;
      link.scatter_rx = path == HeaderPath::kScatter;
      c.headers_rx += link.split_rx ? 1 : 0;
      if (link.split_rx && link.rx_header.size() < kSplitHeaderRoom) {
        link.rx_header.resize(kSplitHeaderRoom);
      }
      if (link.scatter_rx && link.rx_header.size() < kHeaderBytes)
        link.rx_header.resize(kHeaderBytes);
    }
    if (!link.sends.empty()) {
      CallHeader h = header;
      h.extra = plan.tx_extra.empty() ? 0 : plan.tx_extra[l / channels];
      h.Encode(link.tx_header);
      if (c.cast) {
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

  send_state_.assign(c.num_sends, kIdle);
  recv_state_.assign(c.num_recvs, kIdle);
  recv_landing_.assign(c.num_recvs, nullptr);
  slot_copies_.clear();
}

void PlanExecutor::AdvancePrefixes() {
  Call& c = call_;
  while (c.sends_done_prefix < c.num_sends && send_state_[c.sends_done_prefix] == kDone) {
    ++c.sends_done_prefix;
  }
  while (c.recvs_done_prefix < c.num_recvs && recv_state_[c.recvs_done_prefix] == kDone) {
    ++c.recvs_done_prefix;
  }
}

void PlanExecutor::FinishRecv(int i) {
  recv_state_[i] = kDone;
  ++call_.recvs_done;
  const auto& r = call_.plan->recvs[i];
  Link& link = LinkOf(r.peer, r.channel);
  while (link.low_recv < link.recvs.size() && recv_state_[link.recvs[link.low_recv]] == kDone) {
    ++link.low_recv;
  }
}

bool PlanExecutor::CopyOutOfSlots() {
  const Call& c = call_;
  bool progress = false;
  for (size_t j = 0; j < slot_copies_.size();) {
    const int i = slot_copies_[j];
    const auto& r = c.plan->recvs[i];
    if (c.sends_done_prefix >= static_cast<size_t>(r.war_prefix)) {
      if (c.cast) {
        plexus::kernels::UnpackWire(c.wire, reinterpret_cast<float*>(r.data), recv_landing_[i],
                                    r.bytes / c.data_size);
      } else if (r.bytes > 0) {
        std::memcpy(r.data, recv_landing_[i], r.bytes);
      }
      FinishRecv(i);
      slot_copies_[j] = slot_copies_.back();
      slot_copies_.pop_back();
      progress = true;
    } else {
      ++j;
    }
  }
  return progress;
}

bool PlanExecutor::ReduceInOrder() {
  Call& c = call_;
  bool progress = false;
  while (c.reduce_cursor < reduce_order_.size()) {
    const int i = reduce_order_[c.reduce_cursor];
    const auto& r = c.plan->recvs[i];
    if (recv_state_[i] != kArrived || c.sends_done_prefix < static_cast<size_t>(r.war_prefix)) {
      break;
    }
    const size_t elems = r.bytes / c.data_size;
    uint8_t* landing = recv_landing_[i];
    if (c.cast) {
      // The incoming chunk is converted and folded into the f32 accumulator in one pass.
      auto* dst = reinterpret_cast<float*>(r.data);
      const auto* local = r.local == nullptr ? dst : reinterpret_cast<const float*>(r.local);
      plexus::kernels::ReduceWire(c.wire, c.op, dst, local, landing, elems, r.src_first);
    } else if (r.local == nullptr) {
      plexus::kernels::ReduceInto(c.dtype, c.op, r.data, landing, elems, r.src_first);
    } else if (landing == r.data) {
      // data holds the incoming operand: the same operation with the roles swapped.
      plexus::kernels::ReduceInto(c.dtype, c.op, r.data, r.local, elems, !r.src_first);
    } else {  // landed in a slot: one pass, no copy of the operand first
      plexus::kernels::ReduceOutOf(c.dtype, c.op, r.data, r.local, landing, elems, r.src_first);
    }
    FinishRecv(i);
    ++c.reduce_cursor;
    progress = true;
  }
  return progress;
}

void PlanExecutor::DoLocal() {
  bool progress = true;
  while (progress) {
    AdvancePrefixes();
    progress = CopyOutOfSlots();
    progress = ReduceInOrder() || progress;
  }
  AdvancePrefixes();
}

bool PlanExecutor::PostRecvs(Link& link, int peer, transport::Connection* conn, Failure* failure) {
  const Call& c = call_;
  const int depth = depth_;
  // Receives, in order. Those that land in a slot (a call's first message, with its header;
  // in-place reductions) wait for a free one of the link's `depth` slots; the others go
  // straight to their destination and are posted as early as their order allows, so that a
  // peer running ahead finds them posted rather than having its messages held.
  if (link.split_rx && !link.header_posted) {
    const uint64_t wr = (c.epoch << 32) | kHeaderOp | static_cast<uint64_t>(&link - links_.data());
    if (absl::Status s = conn->PostRecv({link.rx_header.data(), link.rx_header.size()}, wr);
        !s.ok()) {
      *failure = Failure::Peer(peer, s);
      return false;
    }
    link.header_posted = true;
  }
  while (link.next_recv < link.recvs.size()) {
    const int i = link.recvs[link.next_recv];
    const auto& r = c.plan->recvs[i];
    const uint64_t wr = (c.epoch << 32) | static_cast<uint64_t>(i);
    absl::Status posted;
    uint8_t* landing = r.data;
    if (link.next_recv == 0 && link.scatter_rx) {
      // Header and payload in one message, taken apart on the way (TakeApart). Room beyond the
      // payload lets a longer (mismatched) message still be seen and reported by its header.
      if (c.sends_done_prefix < static_cast<size_t>(r.war_prefix)) break;
      posted = conn->PostRecvConsumed(kHeaderBytes + r.bytes + kMismatchRoom,
                                      TakeApart(link.rx_header.data(), r.data, r.bytes), wr);
    } else if ((link.next_recv == 0 && !link.split_rx) || (r.reduce && r.local == nullptr) ||
               c.cast) {
      // With a cast every receive lands in a slot: its bytes are not yet of the output's type.
      int& owner = link.slot_owner[link.slots_taken % depth];
      if (owner >= 0 && recv_state_[owner] != kDone) break;
      landing = link.slots.data() + (link.slots_taken % depth) * link.slot_stride;
      owner = i;
      ++link.slots_taken;
      // The first: header + payload, with room to see an oversized (mismatched) message.
      const bool first = link.next_recv == 0 && !link.split_rx;
      posted = conn->PostRecv({landing, first ? link.slot_stride : c.OnWire(r.bytes)}, wr);
    } else {  // placed, or reduced out of place: straight into the destination
      if (c.sends_done_prefix < static_cast<size_t>(r.war_prefix)) break;
      posted = conn->PostRecv({r.data, r.bytes}, wr);
    }
    if (!posted.ok()) {
      *failure = Failure::Peer(peer, posted);
      return false;
    }
    recv_state_[i] = kPosted;
    recv_landing_[i] = landing;
    ++link.next_recv;
  }
  return true;
}

bool PlanExecutor::PostSends(Link& link, int peer, transport::Connection* conn, Failure* failure) {
  const Call& c = call_;
  const int depth = depth_;
  if (link.split_tx && !link.header_sent) {
    const uint64_t wr = (uint64_t{1} << 63) | (c.epoch << 32) | kHeaderOp |
                        static_cast<uint64_t>(&link - links_.data());
    if (absl::Status st = conn->PostSend(ConstBuffer{link.tx_header, kHeaderBytes}, wr); !st.ok()) {
      *failure = Failure::Peer(peer, st);
      return false;
    }
    link.header_sent = true;
  }
  // Sends, in order, once their inputs are final.
  while (link.next_send < link.sends.size() && link.sends_in_flight < depth) {
    const int i = link.sends[link.next_send];
    const auto& s = c.plan->sends[i];
    if (s.dep >= 0 && recv_state_[s.dep] != kDone) break;
    if (c.recvs_done_prefix < static_cast<size_t>(s.dep_prefix)) break;
    ConstBuffer parts[2];
    size_t nparts = 0;
    if (link.next_send == 0 && !link.split_tx) parts[nparts++] = {link.tx_header, kHeaderBytes};
    if (c.cast && s.bytes > 0) {
      // Pack the chunk into a free send slot, converting as it is copied; a final result's
      // sender keeps the rounded values (SendOp::final: data is in the call's output).
      int& owner = link.send_slot_owner[link.send_slots_taken % depth];
      if (owner >= 0 && send_state_[owner] != kDone) break;
      uint8_t* slot =
          link.send_slots.data() + (link.send_slots_taken % depth) * link.send_slot_stride;
      owner = i;
      ++link.send_slots_taken;
      const auto* from = reinterpret_cast<const float*>(s.data);
      plexus::kernels::PackWire(c.wire, slot, from, s.bytes / c.data_size,
                                s.final ? const_cast<float*>(from) : nullptr);
      parts[nparts++] = {slot, c.OnWire(s.bytes)};
    } else if (s.bytes > 0) {
      parts[nparts++] = {s.data, s.bytes};
    }
    if (env_.qos != nullptr) {  // QoS time windows: wait for the schedule to allow the send
      if (absl::Status st = env_.AdmitSend(*c.header); !st.ok()) {
        *failure = Failure::Own(std::move(st));
        return false;
      }
    }
    const uint64_t wr = (uint64_t{1} << 63) | (c.epoch << 32) | static_cast<uint64_t>(i);
    if (absl::Status st = conn->PostSend(absl::MakeConstSpan(parts, nparts), wr); !st.ok()) {
      *failure = Failure::Peer(peer, st);
      return false;
    }
    if (env_.qos != nullptr) env_.qos->Posted();
    send_state_[i] = kPosted;
    if (env_.trace != nullptr) env_.trace->NoteSend(peer);
    ++link.sends_in_flight;
    ++link.next_send;
  }
  return true;
}

bool PlanExecutor::PostAll(Failure* failure) {
  const int channels = channels_;
  for (size_t l = 0; l < links_.size(); ++l) {
    Link& link = links_[l];
    if (link.sends.empty() && link.recvs.empty()) continue;
    const int peer = static_cast<int>(l / channels);
    transport::Connection* conn = env_.conns->conns[l % channels][peer].get();
    if (!PostRecvs(link, peer, conn, failure)) return false;
    if (!PostSends(link, peer, conn, failure)) return false;
  }
  return true;
}

PlanExecutor::HeaderPath PlanExecutor::HeaderPathOf(int peer, size_t first_bytes) const {
  const Call& c = call_;
  // Only where receives are placed, not reduced (a reduced one lands in a slot anyway), and
  // where the copy saved outweighs one more message.
  switch (c.header->kind) {
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kAllToAllV:
    case CollectiveKind::kSendRecv:
      break;
    default:
      return HeaderPath::kSlot;
  }
  if (c.cast) return HeaderPath::kSlot;
  const transport::Backend backend =
      env_.peer_backend != nullptr ? (*env_.peer_backend)[peer] : transport::Backend::kTcp;
  const bool consumes =
      backend == transport::Backend::kShm || backend == transport::Backend::kInproc;
  if (consumes && first_bytes >= kScatterHeaderFrom &&
      kHeaderBytes + first_bytes < kShmLonePullBytes) {
    return HeaderPath::kScatter;
  }
  return first_bytes >= kSplitHeaderBytes ? HeaderPath::kSplit : HeaderPath::kSlot;
}

bool PlanExecutor::CheckHeader(int peer, const uint8_t* data, size_t bytes, Failure* failure) {
  const Call& c = call_;
  const CallHeader& header = *c.header;
  const int rank = env_.rank;
  auto theirs = CallHeader::Decode(absl::MakeConstSpan(data, bytes));
  if (!theirs.ok()) {
    *failure = Failure::Own(absl::FailedPreconditionError(
        absl::StrCat(header.Describe(), " on rank ", rank, ": the message from rank ", peer,
                     " is not the start of a call (", std::string(theirs.status().message()),
                     "): the ranks issued different sequences of calls")));
    return false;
  }
  // Collectives run under the same epoch on every rank (the sequence-number barrier);
  // Send/Recv number their messages per pair and may straddle a change.
  if (theirs->epoch != header.epoch && header.kind != CollectiveKind::kSendRecv) {
    *failure = Failure::Own(EpochMismatch(rank, header.Describe(), header.epoch, peer,
                                          theirs->Describe(), absl::StrCat(theirs->epoch)));
    return false;
  }
  const uint64_t expected_extra = c.plan->rx_extra.empty() ? 0 : c.plan->rx_extra[peer];
  if (!theirs->SameCall(header) || theirs->sender != peer || theirs->extra != expected_extra) {
    CallHeader mine = header;
    mine.extra = expected_extra;
    const bool algo_only = theirs->algorithm != header.algorithm && theirs->kind == header.kind &&
                           theirs->count == header.count && theirs->dtype == header.dtype;
    *failure = Failure::Own(
        MismatchedCalls(rank, mine.Describe(), theirs->sender, theirs->Describe(),
                        algo_only ? " (the ranks chose different algorithms: set the same "
                                    "PLEXUS_COLL_ALGO, table and per-call algorithm on every rank)"
                                  : ""));
    return false;
  }
  return true;
}

bool PlanExecutor::OnCompletion(const Completion& cm, Failure* failure) {
  Call& c = call_;
  const bool is_send = (cm.wr_id >> 63) != 0;
  if (((cm.wr_id >> 32) & 0x7FFFFFFF) != c.epoch) return true;  // a leftover of an older call
  const size_t i = cm.wr_id & 0xFFFFFFFF;
  const auto& peer_of = env_.conns->peer_of_connection;
  auto it = peer_of.find(cm.connection_id);
  const int peer = it == peer_of.end() ? -1 : it->second;
  if (!cm.status.ok() && !is_send && cm.status.code() == absl::StatusCode::kResourceExhausted &&
      (i < c.num_recvs || (i & kHeaderOp) != 0)) {
    *failure = Failure::Own(absl::FailedPreconditionError(
        absl::StrCat("mismatched collective calls: rank ", peer, " sent rank ", env_.rank,
                     " a message larger than its ", c.header->Describe(), " expects (",
                     std::string(cm.status.message()), "): the ranks' calls do not match")));
    return false;
  }
  if (!cm.status.ok()) {
    *failure = Failure::Peer(peer, cm.status);
    return false;
  }
  if ((i & kHeaderOp) != 0) {  // a header of its own (a split link)
    const size_t l = i & ~kHeaderOp;
    if (l >= links_.size()) return true;
    if (is_send) {
      ++c.headers_tx_done;
      return true;
    }
    if (!CheckHeader(peer, links_[l].rx_header.data(), cm.bytes, failure)) return false;
    if (cm.bytes != kHeaderBytes) {
      *failure = Failure::Own(absl::FailedPreconditionError(absl::StrCat(
          c.header->Describe(), " on rank ", env_.rank, ": rank ", peer, " sent ", cm.bytes,
          " bytes where the call's header alone (", kHeaderBytes,
          " bytes) was expected: the ranks' calls do not match (count, type or algorithm)")));
      return false;
    }
    ++c.headers_rx_done;
    return true;
  }
  if (is_send) {
    if (i >= c.num_sends) return true;
    const auto& s = c.plan->sends[i];
    send_state_[i] = kDone;
    ++c.sends_done;
    --LinkOf(s.peer, s.channel).sends_in_flight;
    return true;
  }
  if (i >= c.num_recvs) return true;
  const auto& r = c.plan->recvs[i];
  Link& link = LinkOf(r.peer, r.channel);
  const bool first = !link.split_rx && !link.recvs.empty() && link.recvs[0] == static_cast<int>(i);
  size_t payload = cm.bytes;
  if (first && link.scatter_rx) {
    // The header's bytes are in rx_header, the payload's in place (what fitted there).
    if (!CheckHeader(r.peer, link.rx_header.data(), std::min(cm.bytes, kHeaderBytes), failure)) {
      return false;
    }
    payload = cm.bytes - kHeaderBytes;
  } else if (first) {
    if (!CheckHeader(r.peer, recv_landing_[i], cm.bytes, failure)) return false;
    recv_landing_[i] += kHeaderBytes;
    payload = cm.bytes - kHeaderBytes;
  }
  if (payload != c.OnWire(r.bytes)) {
    *failure = Failure::Own(absl::FailedPreconditionError(
        absl::StrCat(c.header->Describe(), " on rank ", env_.rank, ": rank ", r.peer,
                     " sent a message of ", payload, " bytes where ", c.OnWire(r.bytes),
                     " were expected: the ranks' calls do not match (count, type or algorithm)")));
    return false;
  }
  recv_state_[i] = kArrived;
  if (env_.trace != nullptr) env_.trace->NoteRecv(r.peer);
  if (r.reduce) return true;  // reduced in plan order by DoLocal
  if (recv_landing_[i] != r.data) {
    slot_copies_.push_back(static_cast<int>(i));
  } else {
    FinishRecv(static_cast<int>(i));
  }
  return true;
}

PlanExecutor::Polled PlanExecutor::Poll(Idle& w, absl::Span<Completion> batch, size_t* got,
                                        Failure* failure) {
  const CallHeader& header = *call_.header;
  *got = env_.conns->cq->Poll(batch);  // moves bytes too, in caller mode
  if (*got > 0) return Polled::kGot;
  // The clock is read only when a poll finds nothing, and then only on every 16th such poll
  // (reading it is a visible share of a small call) while spinning, but on every one once past
  // the yield window, where each pass sleeps anyway: last_progress is the first such moment after
  // the latest completion. (Reading it rarely there too let a timed-out Wait repeat 16 times
  // with a stale `left`; docs/measurements/collectives.md, "Figures first recorded in code
  // comments".)
  const base::WaitPolicy& wait = env_.wait;
  if (w.progressed || ++w.polls % 16 == 0 || w.contended ||
      wait.At(w.idle) == base::WaitPolicy::Phase::kSleep) {
    const absl::Time now = absl::Now();
    if (w.progressed) {
      w.last_progress = now;
      w.progressed = false;
      w.contended = false;
      w.polls = 0;
      w.next_wait_record = env_.record_after;
      if (env_.board->posted()) env_.board->Retract();
    }
    w.idle = now - w.last_progress;
    // Long without progress: publish whom this rank waits for (off the fast path), so that
    // whichever rank times out first finds the wait-for graph on the store.
    if (w.idle >= w.next_wait_record && w.idle < env_.timeout) {
      env_.board->PostWaiting(WaitingFor(), absl::StatusCode::kDeadlineExceeded,
                              absl::StrCat("waiting for ", absl::FormatDuration(w.idle)),
                              *call_.header);
      w.next_wait_record = w.idle + env_.record_every;
    }
  }
  const absl::Duration left = env_.timeout - w.idle;
  if (left <= absl::ZeroDuration()) {
    *failure = Failure::Stall(WaitingFor());
    return Polled::kFailed;
  }
  // Send/Recv numbers its messages per pair, not per call: nothing to compare with.
  if (header.kind != CollectiveKind::kSendRecv) {
    if (absl::Status s = mailboxes_.CheckMailboxes(header); !s.ok()) {
      *failure = Failure::Own(s);
      return Polled::kFailed;
    }
  }
  // Waiting: spin (lowest latency, unless the host is oversubscribed), then poll and yield the
  // CPU to whoever needs it (a peer rank, or anything else this host runs), and only after
  // kYieldWindow without progress sleep in the transport.
  // A contended CPU (a yield came back late) sleeps at once until the next progress.
  const base::WaitPolicy::Phase phase = !w.contended ? wait.At(w.idle)
                                        : w.idle < base::WaitPolicy::kContendedPoll
                                            ? base::WaitPolicy::Phase::kSpin
                                            : base::WaitPolicy::Phase::kSleep;
  if (phase == base::WaitPolicy::Phase::kSpin) return Polled::kAgain;
  if (phase == base::WaitPolicy::Phase::kYield) {
    // Not when this host runs more ranks than CPUs: there every yield is late because the peer
    // ranks run, and yielding to them is what moves the collective (sleeping instead made small
    // allreduces many times slower; docs/measurements/collectives.md, "Waiting").
    const bool yield_when_idle = env_.yield_when_idle;
    w.contended = base::WaitPolicy::Yield(/*can_sleep=*/!yield_when_idle) && !yield_when_idle;
    return Polled::kAgain;
  }
  // Wake for the next wait record too.
  absl::StatusOr<Completion> c = env_.conns->cq->Wait(
      std::min(left, std::max(w.next_wait_record - w.idle, absl::Milliseconds(1))),
      absl::ZeroDuration());
  if (!c.ok()) return Polled::kAgain;  // timed out: the checks above report it or post the record
  batch[0] = *std::move(c);
  *got = 1;
  return Polled::kGot;
}

absl::Status PlanExecutor::Execute(const Plan& plan, const CallHeader& header, DataType dtype,
                                   ReduceOp op) {
  if (plan.sends.empty() && plan.recvs.empty()) return absl::OkStatus();
  // QoS: a schedule that cannot admit a send within the timeout fails the call before this rank
  // touches a connection (so its own error, not a peer's reaction, is what it reports).
  if (env_.qos != nullptr && !plan.sends.empty()) {
    if (absl::Status s = env_.qos->CheckReachable(env_.timeout, [&] { return header.Describe(); });
        !s.ok()) {
      return env_.abort(header, Failure::Own(std::move(s)));
    }
  }
  if (env_.trace != nullptr) env_.trace->NotePlan(plan);
  Prepare(plan, header, dtype, op);
  const Call& c = call_;
  Failure failure;
  Idle w;
  w.last_progress = absl::Now();
  w.next_wait_record = env_.record_after;
  Completion batch[32];
  for (;;) {
    DoLocal();
    if (!PostAll(&failure)) break;
    if (c.sends_done == c.num_sends && c.recvs_done == c.num_recvs &&
        c.headers_tx_done == c.headers_tx && c.headers_rx_done == c.headers_rx) {
      if (env_.board->posted()) env_.board->Retract();
      // A peer's mailbox message of an earlier call that this rank never received (a broadcast
      // root that differed) is found here too when the call never had to wait (a rank that
      // starts late finds everything arrived): mismatches do not depend on timing.
      if (header.kind != CollectiveKind::kSendRecv) {
        if (absl::Status s = mailboxes_.CheckMailboxes(header); !s.ok()) {
          failure = Failure::Own(s);
          break;
        }
      }
      return absl::OkStatus();
    }
    size_t got = 0;
    const Polled polled = Poll(w, absl::MakeSpan(batch), &got, &failure);
    if (polled == Polled::kFailed) break;
    if (polled == Polled::kAgain) continue;
    w.progressed = true;
    bool ok = true;
    for (size_t k = 0; k < got && ok; ++k) ok = OnCompletion(batch[k], &failure);
    if (!ok) break;
  }
  return env_.abort(header, std::move(failure));
}

}  // namespace plexus::collectives::internal
