#include "reassembler.hpp"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::multipath::internal {

Reassembler::Reassembler(size_t max_held_bytes)
    : max_held_(max_held_bytes),
      budget_(std::make_shared<transport::HoldBudget>(max_held_bytes)),
      matcher_(transport::MatcherConfig{.backend = "multipath",
                                        .peer = "the peer",
                                        .connection_cap = max_held_bytes,
                                        .device = budget_,
                                        .after_too_long = "the message is dropped"},
               [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                 OnMatcherCompletion(wr_id, std::move(status), bytes);
               }) {}

bool Reassembler::Finished(uint64_t seq) const {
  return seq < finished_below_ || finished_.contains(seq);
}

void Reassembler::MarkFinished(uint64_t seq) {
  finished_.insert(seq);
  while (finished_.erase(finished_below_) > 0) ++finished_below_;
}

namespace {

absl::Status HeldCapError(uint64_t index, uint64_t total, size_t max_held, size_t held) {
  return absl::ResourceExhaustedError(
      absl::StrCat("multipath: message ", index, " of ", total, " bytes arrived before its Recv, ",
                   "and holding it would exceed max_held_bytes = ", max_held, " (", held,
                   " held); post Recvs earlier or raise ChannelOptions.max_held_bytes"));
}

}  // namespace

void Reassembler::DropEarly(Message& m) {
  early_bytes_ -= m.early.size();
  budget_->Release(m.early.size());
  std::vector<uint8_t>().swap(m.early);
}

absl::Status Reassembler::PlaceEarly(uint64_t index, Message& m) {
  const transport::MutableBuffer* recv = matcher_.PostedRecv(index - next_match_);
  if (recv != nullptr) {
    // The Recv it will get is posted: its bytes go there (the matcher hands out the same buffer
    // when the message is admitted), or nowhere when they do not fit.
    if (m.total > recv->size) {
      m.too_long = true;
      m.dest = nullptr;
    } else {
      m.dest = static_cast<uint8_t*>(recv->data);
      if (!m.early.empty()) std::memcpy(m.dest, m.early.data(), m.early.size());
    }
    DropEarly(m);
    return absl::OkStatus();
  }
  if (m.total == 0 || !m.early.empty()) return absl::OkStatus();
  if (!budget_->TryReserve(m.total)) return HeldCapError(index, m.total, max_held_, held_bytes());
  m.early.resize(m.total);
  early_bytes_ += m.total;
  m.dest = m.early.data();
  return absl::OkStatus();
}

absl::Status Reassembler::MatchReady() {
  for (;;) {
    auto it = messages_.find(next_match_);
    if (it == messages_.end()) return absl::OkStatus();
    Message& m = it->second;
    const bool has_recv = matcher_.has_posted_recv();
    context_ = Context{true, next_match_};
    absl::StatusOr<transport::Matcher::Admission> admitted = matcher_.Admit(m.total, &m.slot);
    context_.active = false;
    if (!admitted.ok() && has_recv) {
      // Longer than its Recv, which completed with the error: the bytes are dropped.
      m.too_long = true;
      m.dest = nullptr;
      DropEarly(m);
    } else if (!admitted.ok() || *admitted == transport::Matcher::Admission::kWait) {
      return HeldCapError(next_match_, m.total, max_held_, held_bytes());
    } else {
      if (!m.early.empty()) std::memcpy(m.slot.dest, m.early.data(), m.early.size());
      DropEarly(m);
      m.dest = m.slot.dest;
    }
    m.matched = true;
    ++next_match_;
  }
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
  if (f.send_index == next_match_) {
    PLEXUS_RETURN_IF_ERROR(MatchReady());
  } else if (absl::Status st = PlaceEarly(f.send_index, m); !st.ok()) {
    messages_.erase(f.send_index);
    return st;
  }
  return &m;
}

absl::Status Reassembler::OnChunk(const Frame& f, absl::Span<const uint8_t> payload,
                                  bool* duplicate) {
  *duplicate = false;
  if (failed_) return absl::OkStatus();  // the channel is gone: nothing is matched any more
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
  if (failed_) return absl::OkStatus();
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
  if (failed_) {
    OnMatcherCompletion(wr_id, failure_, 0);
    return;
  }
  context_ = Context{true, recvs_posted_++};
  // A too-long error (the Recv completes with it) is all PostRecv can return: the channel
  // carries on without the message.
  (void)matcher_.PostRecv(buffer, wr_id);
  context_.active = false;
  // Messages not matched yet whose Recv is now posted: their early bytes move there.
  for (auto it = messages_.lower_bound(next_match_); it != messages_.end(); ++it) {
    if (!it->second.early.empty()) (void)PlaceEarly(it->first, it->second);
  }
  Deliver();
}

void Reassembler::OnMatcherCompletion(uint64_t wr_id, absl::Status status, size_t bytes) {
  transport::Completion c;
  c.opcode = transport::Opcode::kRecv;
  c.wr_id = wr_id;
  c.bytes = bytes;
  c.status = std::move(status);
  // A too-long error is reported when the message is matched; its Recv completes in Send order.
  if (!c.status.ok() && context_.active && context_.index > next_deliver_) {
    deferred_.emplace(context_.index, std::move(c));
    return;
  }
  ready_.push_back(std::move(c));
}

void Reassembler::Deliver() {
  for (;;) {
    auto m = messages_.find(next_deliver_);
    if (m == messages_.end() || !m->second.matched) return;
    Message& msg = m->second;
    // Complete once notified and every byte is in place (the notification is posted after
    // every chunk was acknowledged, so the two agree unless the peer is broken).
    if (!msg.notified || msg.bytes_seen != msg.total || msg.chunks_seen != msg.chunk_count) {
      return;
    }
    // A held message completes when its Recv is posted (the matcher copies it there).
    // No consumed receives are posted here, so no consumer can fail.
    if (!msg.too_long) matcher_.Placed(msg.slot).IgnoreError();
    if (auto d = deferred_.find(next_deliver_); d != deferred_.end()) {
      ready_.push_back(std::move(d->second));
      deferred_.erase(d);
    }
    MarkFinished(msg.seq);
    messages_.erase(m);
    ++next_deliver_;
  }
}

void Reassembler::CancelRecvs(const absl::Status& why) {
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  // Recvs the matcher handed out for messages in progress are the reassembler's to complete;
  // the matcher completes the rest (posted ones, and those of held messages).
  for (auto& [index, m] : messages_) {
    if (m.matched && !m.too_long && !m.slot.held) {
      transport::Completion c;
      c.opcode = transport::Opcode::kRecv;
      c.wr_id = m.slot.wr_id;
      c.status = why;
      ready_.push_back(std::move(c));
    }
    if (auto d = deferred_.find(index); d != deferred_.end()) {
      ready_.push_back(std::move(d->second));
      deferred_.erase(d);
    }
  }
  matcher_.Fail(why, /*keep_whole=*/false);
  for (auto& [index, c] : deferred_) ready_.push_back(std::move(c));
  deferred_.clear();
  for (auto& [index, m] : messages_) DropEarly(m);
  messages_.clear();
}

std::vector<transport::Completion> Reassembler::TakeCompletions() {
  std::vector<transport::Completion> out(ready_.begin(), ready_.end());
  ready_.clear();
  return out;
}

}  // namespace plexus::multipath::internal
