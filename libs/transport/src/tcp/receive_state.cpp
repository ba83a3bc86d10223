#include "tcp/receive_state.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "make_completion.hpp"
#include "plexus/base/status.hpp"
#include "produce_consume.hpp"
#include "tcp/protocol.hpp"

namespace plexus::transport::internal::tcp {

namespace {

absl::Status Allocate(std::vector<uint8_t>& buffer, size_t bytes) {
  try {
    buffer.resize(bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes to hold an incoming message"));
  }
  return absl::OkStatus();
}

}  // namespace

ReceiveState::ReceiveState(ReceiveConfig config, CompletionQueue* cq, SendState* send)
    : config_(std::move(config)),
      cq_(cq),
      send_(send),
      matcher_(config_.matcher,
               [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                 cq_->Push(MakeCompletion(config_.connection_id, Opcode::kRecv, wr_id,
                                          std::move(status), bytes));
               }),
      streams_(std::max<size_t>(config_.sockets, 1)) {}

ReceiveState::~ReceiveState() = default;

absl::StatusOr<ReceiveState::Consumed> ReceiveState::Consume(size_t socket,
                                                             absl::Span<const uint8_t> bytes) {
  PLEXUS_RETURN_IF_ERROR(broken_);
  Stream& s = streams_[socket];
  size_t used = 0;
  while (used < bytes.size()) {
    const size_t left = bytes.size() - used;
    switch (s.phase) {
      case Phase::kParked:
      case Phase::kAwaitRoom:
        return Consumed{used, Event::kNone};
      case Phase::kHeader: {
        const uint8_t* header;
        if (s.header_got == 0 && left >= kFrameHeaderSize) {
          header = bytes.data() + used;  // the common case: no copy
          used += kFrameHeaderSize;
        } else {
          const size_t take = std::min(kFrameHeaderSize - s.header_got, left);
          std::memcpy(s.header_bytes + s.header_got, bytes.data() + used, take);
          s.header_got += take;
          used += take;
          if (s.header_got < kFrameHeaderSize) return Consumed{used, Event::kNone};
          s.header_got = 0;
          header = s.header_bytes;
        }
        absl::StatusOr<Event> event = OnHeaderBytes(socket, header);
        if (!event.ok()) {
          broken_ = event.status();
          return broken_;
        }
        if (*event != Event::kNone) return Consumed{used, *event};
        break;
      }
      case Phase::kPayload: {
        const absl::Span<uint8_t> window = Window(s);
        const size_t take = std::min(left, window.size());
        std::memcpy(window.data(), bytes.data() + used, take);
        used += take;
        if (absl::Status placed = Advance(socket, take); !placed.ok()) {
          broken_ = placed;
          return placed;
        }
        break;
      }
    }
  }
  return Consumed{used, Event::kNone};
}

absl::Span<uint8_t> ReceiveState::PayloadWindow(size_t socket) {
  const Stream& s = streams_[socket];
  if (s.phase != Phase::kPayload || !broken_.ok()) return {};
  return Window(s);
}

absl::Span<uint8_t> ReceiveState::Window(const Stream& s) const {
  const InOp& op = *s.op;
  if (!op.streams()) return absl::MakeSpan(op.base + s.offset, s.remaining);
  const size_t used = s.offset - op.chunk_begin;
  return absl::MakeSpan(op.base + used, std::min(s.remaining, op.staging.size() - used));
}

absl::Status ReceiveState::ConsumeChunk(InOp& op, size_t end) {
  absl::Status s =
      ConsumeRange(*op.slot.consumer, op.chunk_begin,
                   absl::MakeConstSpan(op.staging.data(), end - op.chunk_begin), op.length);
  op.chunk_begin = end;
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("tcp receive (wr_id ", op.slot.wr_id, ") from ",
                                             config_.peer, ": ", s.message()));
}

absl::Status ReceiveState::Placed(size_t socket, size_t bytes) {
  PLEXUS_RETURN_IF_ERROR(broken_);
  const Stream& s = streams_[socket];
  if (s.phase != Phase::kPayload || bytes > Window(s).size()) {
    return absl::InternalError(absl::StrCat("tcp: ", bytes, " bytes placed on socket ", socket,
                                            " beyond its payload window"));
  }
  absl::Status advanced = Advance(socket, bytes);
  if (!advanced.ok()) broken_ = advanced;
  return advanced;
}

absl::Status ReceiveState::Advance(size_t socket, size_t bytes) {
  Stream& s = streams_[socket];
  s.offset += bytes;
  s.remaining -= bytes;
  s.op->remaining -= bytes;
  InOp& op = *s.op;
  if (op.streams() && (s.remaining == 0 || s.offset - op.chunk_begin == op.staging.size())) {
    PLEXUS_RETURN_IF_ERROR(ConsumeChunk(op, s.offset));
  }
  return s.remaining > 0 ? absl::OkStatus() : PayloadDone(socket);
}

absl::StatusOr<ReceiveState::Event> ReceiveState::OnHeaderBytes(size_t socket,
                                                                const uint8_t* bytes) {
  absl::StatusOr<FrameHeader> h =
      DecodeFrameHeader(absl::MakeConstSpan(bytes, kFrameHeaderSize), config_.max_message_bytes);
  if (!h.ok()) {
    return absl::DataLossError(
        absl::StrCat("tcp peer ", config_.peer, " sent a ", std::string(h.status().message())));
  }
  streams_[socket].header = *h;
  ++headers_read_;
  return OnHeader(socket);
}

absl::StatusOr<ReceiveState::Event> ReceiveState::OnHeader(size_t socket) {
  Stream& s = streams_[socket];
  const FrameHeader& h = s.header;
  const size_t nsock = streams_.size();
  absl::StatusOr<HeaderPlan> plan =
      PlanHeader(h, socket, nsock, send_->writes_awaiting_ack(), s.next_stripe);
  if (!plan.ok()) return Malformed(plan.status().message());
  switch (plan->action) {
    case HeaderAction::kClose:
      return absl::AbortedError(absl::StrCat("tcp peer ", config_.peer, " closed the connection"));
    case HeaderAction::kAck:
      PLEXUS_RETURN_IF_ERROR(send_->Acked(plan->acked));
      return Event::kNone;
    case HeaderAction::kOperation: {
      PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<InOp> op, NewInOp(h, plan->is_write, plan->striped));
      if (op == nullptr) {  // no room to hold it yet
        s.phase = Phase::kAwaitRoom;
        paused_ = true;
        return Event::kPaused;
      }
      InOp* raw = op.get();
      in_ops_.push_back(std::move(op));
      if (plan->striped) {
        raw->parts_left = nsock;
        stripes_[stripe_heads_received_++] = raw;
      }
      PLEXUS_RETURN_IF_ERROR(StartPayload(socket, raw, 0, plan->first_bytes));
      if (!plan->striped) return Event::kNone;
      resumed_.clear();
      for (size_t k = 1; k < nsock; ++k) {  // parts that waited for this head
        if (streams_[k].phase != Phase::kParked) continue;
        PLEXUS_RETURN_IF_ERROR(Resume(k));
        if (streams_[k].phase != Phase::kParked) resumed_.push_back(k);
      }
      return resumed_.empty() ? Event::kNone : Event::kPartsResumed;
    }
    case HeaderAction::kStripePart:
      s.phase = Phase::kParked;
      PLEXUS_RETURN_IF_ERROR(Resume(socket));
      return paused_ && s.phase == Phase::kParked ? Event::kStalled : Event::kNone;
  }
  return Malformed("frame of unknown type");
}

absl::Status ReceiveState::Resume(size_t socket) {
  Stream& s = streams_[socket];
  auto it = stripes_.find(s.header.a);
  if (it == stripes_.end()) {
    if (s.header.a < stripe_heads_received_) {
      return absl::DataLossError(
          absl::StrCat("tcp peer ", config_.peer, " sent a stripe part for a finished op"));
    }
    return absl::OkStatus();  // stays parked
  }
  InOp* op = it->second;
  if (!PartMatches(s.header, socket, streams_.size(), op->length)) {
    return absl::DataLossError(
        absl::StrCat("tcp peer ", config_.peer, " sent a stripe part with a bad range"));
  }
  ++s.next_stripe;
  return StartPayload(socket, op, s.header.b, s.header.length);
}

absl::Status ReceiveState::StartPayload(size_t socket, InOp* op, size_t offset, size_t length) {
  Stream& s = streams_[socket];
  s.phase = Phase::kPayload;
  s.op = op;
  s.offset = offset;
  s.remaining = length;
  // Never rest in kPayload with nothing to read: an empty payload is done now.
  return length == 0 ? PayloadDone(socket) : absl::OkStatus();
}

absl::Status ReceiveState::PayloadDone(size_t socket) {
  Stream& s = streams_[socket];
  InOp* op = s.op;
  s.phase = Phase::kHeader;
  s.op = nullptr;
  --op->parts_left;
  if (!op->placed()) return absl::OkStatus();
  for (auto it = stripes_.begin(); it != stripes_.end(); ++it) {
    if (it->second == op) {
      stripes_.erase(it);
      break;
    }
  }
  return ReleaseInbound();
}

std::unique_ptr<ReceiveState::InOp> ReceiveState::TakeInOp() {
  if (spare_in_ops_.empty()) return std::make_unique<InOp>();
  std::unique_ptr<InOp> op = std::move(spare_in_ops_.back());
  spare_in_ops_.pop_back();
  return op;
}

void ReceiveState::RecycleInOp(std::unique_ptr<InOp> op) {
  if (spare_in_ops_.size() >= kSpareInOps) return;  // `op` is destroyed
  *op = InOp{};
  spare_in_ops_.push_back(std::move(op));
}

absl::StatusOr<std::unique_ptr<ReceiveState::InOp>> ReceiveState::NewInOp(const FrameHeader& h,
                                                                          bool is_write,
                                                                          bool striped) {
  std::unique_ptr<InOp> op = TakeInOp();
  op->is_message = !is_write;
  op->length = op->remaining = h.length;
  op->has_immediate = (h.flags & kFlagImmediate) != 0;
  op->immediate = h.immediate;
  if (is_write) {
    absl::StatusOr<WriteTarget> t = config_.resolve_write
                                        ? config_.resolve_write(h.a, h.b, h.length)
                                        : absl::NotFoundError("no region is registered");
    if (!t.ok()) {
      return absl::DataLossError(
          absl::StrCat("tcp peer ", config_.peer, ": ", std::string(t.status().message())));
    }
    op->target = t->data;
    op->target_kind = t->kind;
    op->base = t->data;
    if (t->kind == MemoryKind::kCuda) {
      PLEXUS_RETURN_IF_ERROR(Allocate(op->staging, h.length));
      op->base = op->staging.data();
    }
    return op;
  }
  // A message: null when it cannot be held yet (the caller pauses the connection).
  PLEXUS_ASSIGN_OR_RETURN(Matcher::Admission admitted, matcher_.Admit(h.length, &op->slot));
  if (admitted == Matcher::Admission::kWait) {
    RecycleInOp(std::move(op));
    return nullptr;
  }
  op->base = op->slot.dest;
  if (op->slot.consumer != nullptr && h.length > 0) {
    // Parts of a striped message arrive in any order: it is staged whole.
    op->consume_whole = striped;
    absl::Status allocated = Allocate(
        op->staging, striped ? h.length : std::min<size_t>(h.length, kMaxProduceConsumeBytes));
    if (!allocated.ok()) {  // the receive left the matcher: it completes here
      cq_->Push(MakeCompletion(config_.connection_id, Opcode::kRecv, op->slot.wr_id, allocated, 0));
      return allocated;
    }
    op->base = op->staging.data();
  }
  return op;
}

absl::StatusOr<ReceiveState::Event> ReceiveState::Readmit() {
  PLEXUS_RETURN_IF_ERROR(broken_);
  if (!paused_) return Event::kNone;
  paused_ = false;
  streams_[0].phase = Phase::kHeader;
  absl::StatusOr<Event> event = OnHeader(0);  // the header read before the pause, again
  if (!event.ok()) broken_ = event.status();
  return event;
}

absl::Status ReceiveState::PostRecv(MutableBuffer buffer, uint64_t wr_id) {
  absl::Status s = matcher_.PostRecv(buffer, wr_id);
  if (s.ok()) s = ReleaseInbound();
  if (!s.ok()) {
    if (broken_.ok()) broken_ = s;
    return s;
  }
  if (paused_) room_freed_ = true;  // the waiting message may go into this receive
  return absl::OkStatus();
}

absl::Status ReceiveState::PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) {
  absl::Status s = matcher_.PostRecvConsumed(max_length, std::move(consumer), wr_id);
  if (s.ok()) s = ReleaseInbound();
  if (!s.ok()) {
    if (broken_.ok()) broken_ = s;
    return s;
  }
  if (paused_) room_freed_ = true;
  return absl::OkStatus();
}

absl::Status ReceiveState::ReleaseInbound() {
  while (!in_ops_.empty()) {
    InOp& op = *in_ops_.front();
    if (!op.placed()) return absl::OkStatus();
    if (op.is_message && op.consume_whole) {
      op.consume_whole = false;
      if (absl::Status s = ConsumeChunk(op, op.length); !s.ok()) {
        // Not whole for the receive: it fails here, and the op leaves (Fail would deliver it).
        cq_->Push(MakeCompletion(config_.connection_id, Opcode::kRecv, op.slot.wr_id, s, 0));
        std::unique_ptr<InOp> failed = std::move(in_ops_.front());
        in_ops_.pop_front();
        RecycleInOp(std::move(failed));
        return s;
      }
    }
    if (op.is_message) {
      // Direct: completes the receive. Held: whole now; delivered once a receive claims it.
      PLEXUS_RETURN_IF_ERROR(matcher_.Placed(op.slot));  // an error: a consumer failed
      if (op.slot.held) {
        const bool delivered = matcher_.DeliverOldest();
        PLEXUS_RETURN_IF_ERROR(matcher_.TakeConsumerError());
        if (!delivered) return absl::OkStatus();
        room_freed_ = true;
      }
    } else {
      if (op.target_kind == MemoryKind::kCuda && op.length > 0) {
        PLEXUS_RETURN_IF_ERROR(CopyHostToCuda(op.target, op.staging.data(), op.length));
      }
      ++acks_owed_;
      if (op.has_immediate) {
        cq_->Push(MakeCompletion(config_.connection_id, Opcode::kRemoteWrite, 0, absl::OkStatus(),
                                 op.length, op.immediate));
      }
    }
    std::unique_ptr<InOp> done = std::move(in_ops_.front());
    in_ops_.pop_front();
    RecycleInOp(std::move(done));
  }
  return absl::OkStatus();
}

void ReceiveState::Fail(const absl::Status& why) {
  if (broken_.ok()) broken_ = why;
  // Messages that arrived whole stay deliverable (in the matcher): what the peer sent before it
  // closed is not lost. Everything from the first incomplete operation on is.
  size_t whole = 0;
  // A striped message for a consumer that was not handed over yet counts as cut off.
  while (whole < in_ops_.size() && in_ops_[whole]->is_message && in_ops_[whole]->placed() &&
         !in_ops_[whole]->consume_whole) {
    matcher_.Placed(in_ops_[whole]->slot).IgnoreError();  // held: marks it whole
    ++whole;
  }
  for (size_t i = whole; i < in_ops_.size(); ++i) {
    const InOp& op = *in_ops_[i];
    if (op.is_message && !op.slot.held) {
      cq_->Push(MakeCompletion(config_.connection_id, Opcode::kRecv, op.slot.wr_id, why, 0));
    }
  }
  in_ops_.clear();
  stripes_.clear();
  for (Stream& s : streams_) {
    s.op = nullptr;
    s.phase = Phase::kHeader;
    s.remaining = 0;
  }
  matcher_.Fail(why, /*keep_whole=*/!absl::IsCancelled(why));
  paused_ = false;
  room_freed_ = true;
}

absl::Status ReceiveState::Malformed(absl::string_view what) const {
  return absl::DataLossError(
      absl::StrCat("tcp peer ", config_.peer, " sent a malformed ", std::string(what)));
}

}  // namespace plexus::transport::internal::tcp
