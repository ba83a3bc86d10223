// MultipathChannel's data path: operations cut into chunks, scheduled on paths, posted,
// acknowledged and reassembled; one completion per user operation.
#include "channel_impl.hpp"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::multipath {

void MultipathChannel::Impl::Enqueue(std::unique_ptr<Op> op) {
  op->seq = next_seq_++;
  op->mice = op->total < options_.mice_bytes;
  Op* raw = op.get();
  ops_[raw->seq] = std::move(op);
  if (raw->total == 0) {
    QueueNotify(*raw);
  } else {
    to_cut_.push_back(raw);
  }
  if (!have_no_path_since_ && LivePaths() == 0) have_no_path_since_ = absl::Now();
  Schedule();
  FlushUser();
}

uint32_t MultipathChannel::Impl::AllocDesc() {
  if (free_descs_.empty()) {
    descs_.emplace_back();
    return static_cast<uint32_t>(descs_.size() - 1);
  }
  const uint32_t slot = free_descs_.back();
  free_descs_.pop_back();
  return slot;
}

std::vector<PathView> MultipathChannel::Impl::Views() const {
  std::vector<PathView> views;
  views.reserve(paths_.size());
  for (const auto& path : paths_) {
    const Path& p = *path;
    if (p.state != PathState::kUp) continue;
    PathView v;
    v.index = p.index;
    v.has_slot = p.in_flight_chunks < Cap(p);
    v.bandwidth = p.monitor.bandwidth();
    v.rate_factor = p.rate.factor();
    v.srtt = Rtt(p);
    v.min_rtt = p.monitor.min_rtt();
    v.load = p.load_snapshot;
    views.push_back(v);
  }
  return views;
}

int MultipathChannel::Impl::PickPath(absl::Span<const PathView> views) {
  const int p = scheduler_->Pick(views);
  if (p < 0) return -1;
  for (const PathView& v : views) {
    if (v.index == p && v.has_slot) return p;
  }
  return MinRttPath(views);
}

uint64_t MultipathChannel::Impl::SendChunkLimit() const {
  uint64_t limit = chunk_bytes_;
  for (const auto& p : paths_) {
    if (p->state == PathState::kUp && p->peer_max_chunk > 0) {
      limit = std::min(limit, p->peer_max_chunk);
    }
  }
  return std::max<uint64_t>(1, limit);
}

void MultipathChannel::Impl::Schedule() {
  if (scheduling_) return;
  scheduling_ = true;
  for (;;) {
    if (paths_.empty()) break;
    std::vector<PathView> views = Views();
    if (views.empty()) break;
    if (!repost_.empty()) {
      const uint32_t slot = repost_.front();
      Desc& d = descs_[slot];
      if (d.op->mice) {
        for (PathView& v : views) v.has_slot = true;
      }
      const int p = d.op->mice ? MinRttPath(views) : PickPath(views);
      if (p < 0) break;
      repost_.pop_front();
      PostDesc(slot, *paths_[p]);
      continue;
    }
    if (!notify_.empty() && fences_.empty()) {
      Op* op = notify_.front();
      // Notifications go on the lowest-RTT live path, ignoring the chunk cap.
      for (PathView& v : views) v.has_slot = true;
      const int p = MinRttPath(views);
      if (p < 0) break;
      notify_.pop_front();
      const uint32_t slot = AllocDesc();
      Desc& d = descs_[slot];
      d.used = true;
      d.notify = true;
      d.op = op;
      d.chunk = op->chunks;
      ++op->outstanding;
      PostDesc(slot, *paths_[p]);
      continue;
    }
    if (!to_cut_.empty()) {
      Op* op = to_cut_.front();
      if (op->mice && op->kind == OpKind::kSend && op->total > SendChunkLimit()) {
        op->mice = false;  // the peer's receive buffers are smaller than this "mouse"
      }
      // Mice go whole on the lowest-RTT path, past the chunk cap: latency-critical messages
      // should not wait for a slot, and one message cannot use more than one path anyway.
      if (op->mice) {
        for (PathView& v : views) v.has_slot = true;
      }
      const int p = op->mice ? MinRttPath(views) : PickPath(views);
      if (p < 0) break;
      uint64_t limit = op->kind == OpKind::kSend ? SendChunkLimit() : chunk_bytes_;
      if (op->mice && op->kind == OpKind::kSend) limit = std::max(limit, op->total);
      const uint64_t length = std::min<uint64_t>(limit, op->total - op->cut);
      const uint32_t slot = AllocDesc();
      Desc& d = descs_[slot];
      d.used = true;
      d.notify = false;
      d.op = op;
      d.chunk = op->chunks++;
      d.offset = op->cut;
      d.length = static_cast<uint32_t>(length);
      op->cut += length;
      ++op->outstanding;
      if (op->cut == op->total) to_cut_.pop_front();
      PostDesc(slot, *paths_[p]);
      continue;
    }
    break;
  }
  scheduling_ = false;
}

void MultipathChannel::Impl::PostDesc(uint32_t slot, Path& p) {
  Desc& d = descs_[slot];
  Op& op = *d.op;
  d.path = p.index;
  d.posted = absl::Now();
  if (p.in_flight.empty()) p.last_progress = d.posted;
  p.in_flight.push_back(slot);
  if (!d.notify) {
    ++p.in_flight_chunks;
    p.in_flight_bytes += d.length;
  }
  const uint64_t wr_id = WrId(slot, d.gen);
  if (p.stalled) return;  // test blackhole: the post vanishes
  absl::Status st;
  if (d.notify) {
    Frame f;
    f.type = FrameType::kNotify;
    f.seq = op.seq;
    f.offset = slot;
    f.total = op.total;
    f.send_index = op.kind == OpKind::kSend ? op.send_index : 0;
    f.chunk = op.chunks;
    if (op.kind == OpKind::kWrite) {
      f.flags |= internal::kFlagWrite;
      if (op.immediate) {
        f.flags |= internal::kFlagImmediate;
        f.immediate = *op.immediate;
      }
    }
    internal::EncodeHeader(f, d.header.data());
    st = p.conn->PostSend(pt::ConstBuffer{d.header.data(), kHeaderSize}, wr_id);
  } else if (op.kind == OpKind::kSend) {
    Frame f;
    f.type = FrameType::kChunk;
    f.seq = op.seq;
    f.offset = d.offset;
    f.total = op.total;
    f.send_index = op.send_index;
    f.chunk = d.chunk;
    f.length = d.length;
    f.immediate = slot;
    if (op.mice && d.chunk == 0 && d.length == op.total) f.flags |= internal::kFlagLast;
    internal::EncodeHeader(f, d.header.data());
    if (op.parts.size() == 1) {
      const pt::ConstBuffer parts[2] = {
          {d.header.data(), kHeaderSize},
          {static_cast<const uint8_t*>(op.parts[0].data) + d.offset, d.length}};
      st = p.conn->PostSend(absl::MakeConstSpan(parts, 2), wr_id);
    } else {
      std::vector<pt::ConstBuffer> parts;
      parts.reserve(4);
      parts.push_back({d.header.data(), kHeaderSize});
      SliceParts(op, d.offset, d.length, parts);
      st = p.conn->PostSend(absl::MakeConstSpan(parts), wr_id);
    }
  } else {
    st = p.conn->PostWrite(*op.local, op.local_offset + d.offset, d.length, op.remote,
                           op.remote_offset + d.offset, std::nullopt, wr_id);
  }
  if (!st.ok()) PathFailed(p, base::Annotate(st, "posting a chunk"));
}

void MultipathChannel::Impl::SliceParts(const Op& op, uint64_t offset, uint64_t length,
                                        std::vector<pt::ConstBuffer>& out) {
  // The first part ending past `offset`; parts are non-empty, so their ends strictly increase.
  size_t i = static_cast<size_t>(std::upper_bound(op.part_end.begin(), op.part_end.end(), offset) -
                                 op.part_end.begin());
  while (length > 0 && i < op.parts.size()) {
    const uint64_t start = op.part_end[i] - op.parts[i].size;
    const uint64_t skip = offset - start;
    const uint64_t take = std::min<uint64_t>(length, op.parts[i].size - skip);
    out.push_back({static_cast<const uint8_t*>(op.parts[i].data) + skip, take});
    offset += take;
    length -= take;
    ++i;
  }
}

void MultipathChannel::Impl::SendControl(Path& p, const Frame& f) {
  if (p.state == PathState::kDead || p.stalled) return;
  const uint64_t id = kControlBit | next_control_++;
  auto header = std::make_unique<std::array<uint8_t, kHeaderSize>>(internal::EncodeHeader(f));
  const uint8_t* bytes = header->data();
  control_[id] = std::move(header);
  if (absl::Status st = p.conn->PostSend(pt::ConstBuffer{bytes, kHeaderSize}, id); !st.ok()) {
    control_.erase(id);
    PathFailed(p, base::Annotate(st, "sending a control frame"));
  }
}

void MultipathChannel::Impl::Complete(Op& op, absl::Status status) {
  if (op.done) return;
  op.done = true;
  pt::Completion c;
  c.wr_id = op.wr_id;
  c.opcode = op.kind == OpKind::kSend ? pt::Opcode::kSend : pt::Opcode::kWrite;
  c.status = std::move(status);
  c.bytes = op.total;
  c.connection_id = completion_id_;
  user_ready_.push_back(std::move(c));
}

void MultipathChannel::Impl::DescDone(uint32_t slot, absl::Time now) {
  Desc& d = descs_[slot];
  Path& p = *paths_[d.path];
  auto it = std::find(p.in_flight.begin(), p.in_flight.end(), slot);
  if (it != p.in_flight.end()) p.in_flight.erase(it);
  p.last_progress = now;
  if (!d.notify) {
    --p.in_flight_chunks;
    p.in_flight_bytes -= d.length;
    p.monitor.OnChunk(d.length, d.posted, now);
    p.bytes_acked += d.length;
    ++p.chunks_acked;
    if (d.length < 4096) p.monitor.OnRtt(now - d.posted);
  } else {
    p.monitor.OnRtt(now - d.posted);
  }
  if (p.in_flight.empty()) p.monitor.OnIdle();
  Op& op = *d.op;
  const bool was_notify = d.notify;
  const bool last_flag =
      !d.notify && op.kind == OpKind::kSend && op.mice && d.chunk == 0 && d.length == op.total;
  FreeDesc(slot);
  --op.outstanding;
  if (was_notify || last_flag) {
    Complete(op, absl::OkStatus());
    ops_.erase(op.seq);
    return;
  }
  if (op.cut == op.total && op.outstanding == 0) QueueNotify(op);
}

void MultipathChannel::Impl::OnFrame(Path& p, const Frame& f, absl::Span<const uint8_t> payload) {
  p.last_progress = p.last_heard = absl::Now();
  switch (f.type) {
    case FrameType::kHello:
      if (p.state == PathState::kGreeting) {
        p.state = PathState::kUp;
        p.greeted = true;
        p.peer_index = f.seq;
        p.peer_max_chunk = f.total;
        have_no_path_since_.reset();
        SendPathDowns();
      }
      break;
    case FrameType::kChunk: {
      bool duplicate = false;
      if (absl::Status st = reassembler_.OnChunk(f, payload, &duplicate); !st.ok()) {
        Fail(st);
        return;
      }
      Frame ack;
      ack.type = FrameType::kAck;
      ack.seq = f.seq;
      ack.chunk = f.chunk;
      ack.offset = f.immediate;
      SendControl(p, ack);
      SendAckAhead(p, ack);
      MaybeSignalOverload(p);
      break;
    }
    case FrameType::kNotify: {
      bool duplicate = false;
      if (absl::Status st = reassembler_.OnNotify(f, &duplicate); !st.ok()) {
        Fail(st);
        return;
      }
      Frame ack;
      ack.type = FrameType::kAck;
      ack.flags = internal::kFlagNotify;
      ack.seq = f.seq;
      ack.chunk = f.chunk;
      ack.offset = f.offset;
      SendControl(p, ack);
      break;
    }
    case FrameType::kAck: {
      if (f.offset >= descs_.size()) break;
      const uint32_t slot = static_cast<uint32_t>(f.offset);
      Desc& d = descs_[slot];
      const bool notify = (f.flags & internal::kFlagNotify) != 0;
      // The path the chunk crossed: this one, or the one a copy sent ahead names.
      const uint64_t crossed = f.total == 0 ? static_cast<uint64_t>(p.index) : f.total - 1;
      if (!d.used || d.op == nullptr || d.op->seq != f.seq || d.notify != notify ||
          (!notify && d.chunk != f.chunk) || static_cast<uint64_t>(d.path) != crossed) {
        break;  // stale: the descriptor was reposted or finished (or its other ack came first)
      }
      const absl::Time now = absl::Now();
      paths_[d.path]->last_progress = now;  // the chunk made it across its own path
      DescDone(slot, now);
      break;
    }
    case FrameType::kProbe: {
      Frame reply = f;
      reply.type = FrameType::kProbeReply;
      SendControl(p, reply);
      break;
    }
    case FrameType::kProbeReply:
      if (p.probe_outstanding && f.seq == p.probe_id) {
        p.probe_outstanding = false;
        const absl::Time now = absl::Now();
        p.monitor.OnRtt(now - p.probe_sent);
        const absl::Duration own_queue =
            p.monitor.bandwidth() > 0
                ? absl::Seconds(static_cast<double>(p.in_flight_bytes) / p.monitor.bandwidth())
                : absl::ZeroDuration();
        if (p.monitor.Inflated(options_.congestion_rtt_factor, options_.congestion_rtt_slack,
                               own_queue) &&
            now - p.last_signal > std::max(Rtt(p), options_.probe_interval)) {
          p.rate.OnCongestion();
          ++p.congestion_signals;
          p.last_signal = now;
        }
      }
      break;
    case FrameType::kPathDown: {
      if (f.seq < paths_.size()) {
        PathFailed(*paths_[f.seq], absl::UnavailableError("the peer declared this path dead"));
      }
      Frame ack;
      ack.type = FrameType::kPathDownAck;
      ack.seq = f.offset;
      SendControl(p, ack);
      break;
    }
    case FrameType::kPathDownAck:
      fences_.erase(static_cast<int>(f.seq));
      break;
    case FrameType::kOverload: {
      const absl::Time now = absl::Now();
      if (now - last_overload_ > options_.probe_interval) {
        last_overload_ = now;
        for (auto& q : paths_) q->rate.OnOverload();
        for (auto& q : paths_) q->last_signal = now;
      }
      break;
    }
  }
}

void MultipathChannel::Impl::SendAckAhead(Path& arrived, Frame ack) {
  // Only while this side has chunks of its own in flight on the arrival path: then the ack
  // queues behind them; on a path idle this way it goes straight back, and a copy is only cost.
  if (!options_.ack_ahead || arrived.in_flight_chunks == 0) return;
  Path* fast = ControlPath();
  if (fast == nullptr || fast == &arrived || Rtt(*fast) >= Rtt(arrived)) return;
  ack.total = arrived.peer_index + 1;
  SendControl(*fast, ack);
  ++acks_sent_ahead_;
}

void MultipathChannel::Impl::MaybeSignalOverload(Path& p) {
  if (reassembler_.held_bytes() <= options_.max_held_bytes / 2) return;
  const absl::Time now = absl::Now();
  if (now - last_overload_sent_ < options_.probe_interval) return;
  last_overload_sent_ = now;
  ++overload_signals_;
  Frame f;
  f.type = FrameType::kOverload;
  SendControl(p, f);
}

void MultipathChannel::Impl::HandleCompletion(const pt::Completion& c) {
  auto pit = by_connection_.find(c.connection_id);
  if (pit == by_connection_.end()) return;  // a wake-up
  Path& p = *paths_[pit->second];
  if ((c.wr_id & kControlBit) != 0) {
    control_.erase(c.wr_id);
    if (!c.status.ok()) PathFailed(p, c.status);
    return;
  }
  if ((c.wr_id & kRecvBit) != 0) {
    if (p.state == PathState::kDead) return;
    if (p.stalled && c.status.ok()) {  // test blackhole: inbound frames vanish too
      if (absl::Status st = PostRecvBuffer(p, static_cast<int>(c.wr_id & 0xffff)); !st.ok()) {
        PathFailed(p, st);
      }
      return;
    }
    if (!c.status.ok()) {
      PathFailed(p, c.status);
      return;
    }
    const int slot = static_cast<int>(c.wr_id & 0xffff);
    const auto& buf = p.recv_buffers[slot];
    auto frame = internal::DecodeFrame(absl::MakeConstSpan(buf.data(), c.bytes), uint64_t{1} << 40);
    if (!frame.ok()) {
      PathFailed(p, base::Annotate(frame.status(), absl::StrCat("from ", p.peer)));
      return;
    }
    OnFrame(p, *frame, absl::MakeConstSpan(buf.data() + kHeaderSize, c.bytes - kHeaderSize));
    if (p.state != PathState::kDead) {
      if (absl::Status st = PostRecvBuffer(p, slot); !st.ok()) PathFailed(p, st);
    }
    return;
  }
  const uint32_t slot = static_cast<uint32_t>(c.wr_id & 0xffffffffu);
  const uint32_t gen = static_cast<uint32_t>(c.wr_id >> 32);
  if (slot >= descs_.size() || descs_[slot].gen != gen || !descs_[slot].used) return;  // stale
  if (!c.status.ok()) {
    PathFailed(p, c.status);
    return;
  }
  // A Write chunk is in place when the transport completes it; Send chunks and notifications
  // wait for the receiver's ack.
  if (c.opcode == pt::Opcode::kWrite) {
    p.last_heard = absl::Now();
    DescDone(slot, p.last_heard);
  }
}

}  // namespace plexus::multipath
