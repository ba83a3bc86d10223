#include "reassembler.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus::multipath::internal {

bool Reassembler::Finished(uint64_t seq) const {
  return seq < finished_below_ || finished_.contains(seq);
}

void Reassembler::MarkFinished(uint64_t seq) {
  finished_.insert(seq);
  while (finished_.erase(finished_below_) > 0) ++finished_below_;
}

void Reassembler::Bind(Message& m, PostedRecv& recv) {
  if (m.total > recv.buffer.size) {
    m.too_long = true;
    if (!m.held.empty()) {
      held_bytes_ -= m.held.size();
      m.held = {};
    }
    m.dest = nullptr;
    return;
  }
  auto* user = static_cast<uint8_t*>(recv.buffer.data);
  if (!m.held.empty()) {
    std::memcpy(user, m.held.data(), m.held.size());
    held_bytes_ -= m.held.size();
    m.held = {};
  }
  m.dest = user;
}

absl::StatusOr<Reassembler::Message*> Reassembler::FindOrStart(const Frame& f) {
  auto it = messages_.find(f.send_index);
  if (it != messages_.end()) {
    Message& m = it->second;
    if (m.seq != f.seq || m.total != f.total) {
      return absl::DataLossError(
          absl::StrCat("multipath: message ", f.send_index, " announced as op ", m.seq, " of ",
                       m.total, " bytes, now as op ", f.seq, " of ", f.total, " bytes"));
    }
    return &m;
  }
  if (f.send_index < next_deliver_) {
    return absl::DataLossError(absl::StrCat("multipath: op ", f.seq, " names message ",
                                            f.send_index, ", which was already delivered"));
  }
  if (f.send_index > next_deliver_ + (uint64_t{1} << 20)) {
    return absl::DataLossError(absl::StrCat("multipath: message index ", f.send_index,
                                            " is far beyond the next expected ", next_deliver_));
  }
  if (messages_.size() >= kMaxMessagesInProgress) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "multipath: peer has more than ", kMaxMessagesInProgress, " messages in progress"));
  }
  Message& m = messages_[f.send_index];
  m.seq = f.seq;
  m.total = f.total;
  auto r = recvs_.find(f.send_index);
  if (r != recvs_.end()) {
    Bind(m, r->second);
  } else if (f.total > 0) {
    if (held_bytes_ + f.total > max_held_) {
      messages_.erase(f.send_index);
      return absl::ResourceExhaustedError(absl::StrCat(
          "multipath: message ", f.send_index, " of ", f.total, " bytes arrived before its Recv, ",
          "and holding it would exceed max_held_bytes = ", max_held_, " (", held_bytes_,
          " held); post Recvs earlier or raise ChannelOptions.max_held_bytes"));
    }
    m.held.resize(f.total);
    held_bytes_ += f.total;
    m.dest = m.held.data();
  }
  return &m;
}

absl::Status Reassembler::OnChunk(const Frame& f, absl::Span<const uint8_t> payload,
                                  bool* duplicate) {
  *duplicate = false;
  if (payload.size() != f.length || f.offset + f.length > f.total) {
    return absl::DataLossError("multipath: chunk payload does not match its header");
  }
  if (Finished(f.seq)) {
    *duplicate = true;
    ++duplicates_;
    return absl::OkStatus();
  }
  auto found = FindOrStart(f);
  if (!found.ok()) return found.status();
  Message& m = **found;
  if (!m.seen.insert(f.chunk).second) {
    *duplicate = true;
    ++duplicates_;
    return absl::OkStatus();
  }
  if (m.bytes_seen + f.length > m.total) {
    m.seen.erase(f.chunk);
    return absl::DataLossError(absl::StrCat("multipath: chunks of message ", f.send_index,
                                            " add up to more than its ", m.total, " bytes"));
  }
  ++m.chunks_seen;
  m.bytes_seen += f.length;
  if (m.dest != nullptr && f.length > 0) std::memcpy(m.dest + f.offset, payload.data(), f.length);
  if ((f.flags & kFlagLast) != 0) {
    m.notified = true;
    m.chunk_count = 1;
  }
  Deliver();
  return absl::OkStatus();
}

absl::Status Reassembler::OnNotify(const Frame& f, bool* duplicate) {
  *duplicate = false;
  if (Finished(f.seq)) {
    *duplicate = true;
    ++duplicates_;
    return absl::OkStatus();
  }
  if ((f.flags & kFlagWrite) != 0) {
    MarkFinished(f.seq);
    if ((f.flags & kFlagImmediate) != 0) {
      transport::Completion c;
      c.opcode = transport::Opcode::kRemoteWrite;
      c.bytes = f.total;
      c.has_immediate = true;
      c.immediate = f.immediate;
      ready_.push_back(c);
    }
    return absl::OkStatus();
  }
  auto found = FindOrStart(f);
  if (!found.ok()) return found.status();
  Message& m = **found;
  if (m.notified) {
    *duplicate = true;
    ++duplicates_;
    return absl::OkStatus();
  }
  m.notified = true;
  m.chunk_count = f.chunk;
  Deliver();
  return absl::OkStatus();
}

void Reassembler::PostRecv(transport::MutableBuffer buffer, uint64_t wr_id) {
  const uint64_t index = next_recv_index_++;
  PostedRecv& recv = recvs_[index];
  recv.buffer = buffer;
  recv.wr_id = wr_id;
  auto it = messages_.find(index);
  if (it != messages_.end()) Bind(it->second, recv);
  Deliver();
}

void Reassembler::Deliver() {
  for (;;) {
    auto m = messages_.find(next_deliver_);
    auto r = recvs_.find(next_deliver_);
    if (m == messages_.end() || r == recvs_.end()) return;
    Message& msg = m->second;
    // Complete once notified and every byte is in place (the notification is posted after
    // every chunk was acknowledged, so the two agree unless the peer is broken).
    if (!msg.notified || msg.bytes_seen != msg.total || msg.chunks_seen != msg.chunk_count) {
      return;
    }
    transport::Completion c;
    c.opcode = transport::Opcode::kRecv;
    c.wr_id = r->second.wr_id;
    c.bytes = msg.total;
    if (msg.too_long) {
      c.status = absl::ResourceExhaustedError(
          absl::StrCat("multipath: message of ", msg.total,
                       " bytes is longer than its Recv buffer of ", r->second.buffer.size));
    }
    MarkFinished(msg.seq);
    ready_.push_back(std::move(c));
    messages_.erase(m);
    recvs_.erase(r);
    ++next_deliver_;
  }
}

void Reassembler::CancelRecvs(const absl::Status& why) {
  for (auto& [index, recv] : recvs_) {
    transport::Completion c;
    c.opcode = transport::Opcode::kRecv;
    c.wr_id = recv.wr_id;
    c.status = why;
    ready_.push_back(std::move(c));
  }
  recvs_.clear();
  messages_.clear();
  held_bytes_ = 0;
}

std::vector<transport::Completion> Reassembler::TakeCompletions() {
  std::vector<transport::Completion> out(ready_.begin(), ready_.end());
  ready_.clear();
  return out;
}

}  // namespace plexus::multipath::internal
