#include "tcp/send_state.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "make_completion.hpp"
#include "plexus/base/status.hpp"
#include "produce_consume.hpp"
#include "region_registry.hpp"

namespace plexus::transport::internal::tcp {

absl::StatusOr<PostedOp> PrepareSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id,
                                     uint64_t max_message_bytes) {
  size_t total = 0;
  for (const ConstBuffer& b : buffers) {
    if (b.data == nullptr && b.size > 0) return absl::InvalidArgumentError("PostSend: null buffer");
    total += b.size;
  }
  if (total > max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("PostSend: message of ", total,
                                                   " bytes exceeds max_message_bytes (",
                                                   max_message_bytes, ")"));
  }
  PostedOp posted;
  posted.op.opcode = Opcode::kSend;
  posted.op.wr_id = wr_id;
  posted.op.bytes = total;
  posted.header.type = FrameType::kMessage;
  posted.header.length = total;
  posted.payload.reserve(buffers.size());
  for (const ConstBuffer& b : buffers) {
    if (b.size > 0) posted.payload.push_back({const_cast<void*>(b.data), b.size});
  }
  return posted;
}

absl::StatusOr<PostedOp> PrepareProducedSend(size_t length, Producer producer, uint64_t wr_id,
                                             uint64_t max_message_bytes) {
  if (length > max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("PostSendProduced: message of ", length,
                                                   " bytes exceeds max_message_bytes (",
                                                   max_message_bytes, ")"));
  }
  PostedOp posted;
  posted.op.opcode = Opcode::kSend;
  posted.op.wr_id = wr_id;
  posted.op.bytes = length;
  posted.op.producer = std::move(producer);
  posted.header.type = FrameType::kMessage;
  posted.header.length = length;
  return posted;
}

absl::StatusOr<PostedOp> PrepareWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                                      const RegionHandle& remote, size_t remote_offset,
                                      std::optional<uint32_t> immediate, uint64_t wr_id) {
  PLEXUS_RETURN_IF_ERROR(CheckLocalRange(local, local_offset, length));
  if (remote.backend != Backend::kTcp) {
    return absl::InvalidArgumentError(absl::StrCat("PostWrite: remote handle is for backend ",
                                                   std::string(BackendName(remote.backend))));
  }
  if (remote_offset > remote.length || length > remote.length - remote_offset) {
    return absl::OutOfRangeError(absl::StrCat("PostWrite: ", length, " bytes at offset ",
                                              remote_offset, " exceed the remote region of ",
                                              remote.length, " bytes"));
  }
  PostedOp posted;
  OutOp& op = posted.op;
  op.opcode = Opcode::kWrite;
  op.wr_id = wr_id;
  op.bytes = length;
  const uint8_t* src = static_cast<const uint8_t*>(local.data()) + local_offset;
  if (local.kind() == MemoryKind::kCuda && length > 0) {
    op.staging.resize(length);
    PLEXUS_RETURN_IF_ERROR(CopyCudaToHost(op.staging.data(), src, length));
    src = op.staging.data();
  }
  FrameHeader& h = posted.header;
  h.type = FrameType::kWrite;
  h.length = length;
  h.a = remote.id;
  h.b = remote_offset;
  if (immediate.has_value()) {
    h.flags = kFlagImmediate;
    h.immediate = *immediate;
  }
  if (length > 0) posted.payload.push_back({const_cast<uint8_t*>(src), length});
  return posted;
}

std::shared_ptr<OutOp> SendState::NewOp(OutOp fields) {
  if (spare_.empty()) return std::make_shared<OutOp>(std::move(fields));
  std::shared_ptr<OutOp> op = std::move(spare_.back());
  spare_.pop_back();
  *op = std::move(fields);
  return op;
}

FramePlans SendState::Start(const std::shared_ptr<OutOp>& op, const FrameHeader& h) {
  ops_.push_back(op);
  if (op->opcode == Opcode::kWrite) awaiting_ack_.push_back(op);
  FramePlans frames;
  if (sockets_ == 1 || h.length < threshold_ || op->producer != nullptr) {
    op->frames_left = 1;
    frames.push_back({0, h, {0, h.length}});
    return frames;
  }
  const uint64_t stripe = stripes_sent_++;
  FrameHeader head = h;
  head.type = FrameType::kStripeHead;
  if (h.type == FrameType::kWrite) head.flags |= kFlagWrite;
  op->frames_left = sockets_;
  frames.reserve(sockets_);
  for (size_t k = 0; k < sockets_; ++k) {
    const StripeRange range = StripePart(h.length, sockets_, k);
    if (k == 0) {
      frames.push_back({0, head, range});
      continue;
    }
    FrameHeader part;
    part.type = FrameType::kStripePart;
    part.length = range.length;
    part.a = stripe;
    part.b = range.offset;
    frames.push_back({k, part, range});
  }
  return frames;
}

void SendState::FrameWritten(OutOp& op) {
  if (op.frames_left == 0 || --op.frames_left > 0) return;
  op.written = true;
  Release();
}

absl::Status SendState::Acked(uint64_t count) {
  if (count > awaiting_ack_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ack for ", count, " writes, but only ", awaiting_ack_.size(), " await one"));
  }
  for (uint64_t i = 0; i < count; ++i) {
    awaiting_ack_.front()->acked = true;
    awaiting_ack_.pop_front();
  }
  Release();
  return absl::OkStatus();
}

void SendState::Fail(const absl::Status& why) {
  std::deque<std::shared_ptr<OutOp>> failed = std::move(ops_);
  ops_.clear();
  awaiting_ack_.clear();
  for (auto& op : failed) {
    cq_->Push(MakeCompletion(connection_id_, op->opcode, op->wr_id, why, 0));
    op->producer = nullptr;
  }
}

IovList SliceIov(absl::Span<const iovec> iov, size_t offset, size_t length) {
  IovList out;
  for (const iovec& v : iov) {
    if (length == 0) break;
    if (offset >= v.iov_len) {
      offset -= v.iov_len;
      continue;
    }
    const size_t take = std::min(v.iov_len - offset, length);
    out.push_back({static_cast<uint8_t*>(v.iov_base) + offset, take});
    length -= take;
    offset = 0;
  }
  return out;
}

void FrameQueue::Push(const FrameHeader& h, IovList payload, std::shared_ptr<OutOp> op) {
  Frame& f = frames_.emplace_back();
  EncodeFrameHeader(h, f.header);
  f.total = kFrameHeaderSize;
  for (const iovec& v : payload) f.total += v.iov_len;
  f.payload = std::move(payload);
  if (op != nullptr && op->producer != nullptr) {
    f.produced = true;
    f.total += h.length;
    ++produced_frames_;
  }
  f.op = std::move(op);
}

namespace {

// Where payload byte `offset` of a produced send lies in its staging: chunk k in half k % 2.
size_t StagingOffset(size_t offset) {
  return offset / kMaxProduceConsumeBytes % 2 * kMaxProduceConsumeBytes +
         offset % kMaxProduceConsumeBytes;
}

}  // namespace

absl::Status FrameQueue::Produce() {
  if (produced_frames_ == 0) return absl::OkStatus();
  // Gather reaches a frame only when every frame before it is there whole; it stops at one
  // whose bytes are not all produced, and it fills at most kMaxIov entries.
  constexpr size_t kLookahead = 64;
  size_t looked = 0;
  for (Frame& f : frames_) {
    if (++looked > kLookahead) break;
    if (!f.produced) continue;
    const size_t payload = f.total - kFrameHeaderSize;
    const size_t at = f.sent > kFrameHeaderSize ? f.sent - kFrameHeaderSize : 0;
    // Chunk k of the payload lives in half k % 2 of the staging; the next chunk goes into the
    // half whose previous chunk the socket took whole.
    while (f.chunk_end < payload && at + kMaxProduceConsumeBytes >= f.chunk_end) {
      OutOp& op = *f.op;
      const size_t n = std::min(payload - f.chunk_end, kMaxProduceConsumeBytes);
      if (op.staging.size() < StagingOffset(f.chunk_end) + n) {
        op.staging.resize(std::min(payload, 2 * kMaxProduceConsumeBytes));
      }
      absl::Status s =
          ProduceRange(op.producer, f.chunk_end,
                       absl::MakeSpan(op.staging.data() + StagingOffset(f.chunk_end), n), payload);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("send (wr_id ", op.wr_id, "): ", s.message()));
      }
      f.chunk_end += n;
    }
    if (f.chunk_end < payload) break;
  }
  return absl::OkStatus();
}

int FrameQueue::Gather(iovec* iov, int max) const {
  int n = 0;
  for (auto it = frames_.begin(); it != frames_.end() && n < max - 1; ++it) {
    size_t skip = it->sent;
    if (skip < kFrameHeaderSize) {
      iov[n++] = {const_cast<uint8_t*>(it->header) + skip, kFrameHeaderSize - skip};
      skip = 0;
    } else {
      skip -= kFrameHeaderSize;
    }
    if (it->produced) {
      // Only the produced chunks (the rest of one half, then the other); the frames after this
      // one wait until it is all produced.
      while (skip < it->chunk_end && n < max) {
        const size_t half_end = (skip / kMaxProduceConsumeBytes + 1) * kMaxProduceConsumeBytes;
        const size_t take = std::min(it->chunk_end, half_end) - skip;
        iov[n++] = {it->op->staging.data() + StagingOffset(skip), take};
        skip += take;
      }
      if (it->chunk_end < it->total - kFrameHeaderSize) break;
      continue;
    }
    for (const iovec& v : it->payload) {
      if (n == max) break;
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      iov[n++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
  }
  return n;
}

void FrameQueue::Advance(size_t bytes, SendState& send) {
  while (bytes > 0 && !frames_.empty()) {
    Frame& f = frames_.front();
    const size_t take = std::min(bytes, f.total - f.sent);
    f.sent += take;
    bytes -= take;
    if (f.sent < f.total) return;
    std::shared_ptr<OutOp> op = std::move(f.op);
    if (f.produced) --produced_frames_;
    frames_.pop_front();
    if (op == nullptr) continue;
    if (op.use_count() == 1) {  // SendState does not hold it (a failed connection's): no recycling
      send.FrameWritten(*op);
      continue;
    }
    // SendState holds it until it completes, which FrameWritten may do: drop ours first.
    OutOp& written = *op;
    op.reset();
    send.FrameWritten(written);
  }
}

void SendState::Release() {
  while (!ops_.empty() && ops_.front()->done()) {
    std::shared_ptr<OutOp> op = std::move(ops_.front());
    ops_.pop_front();
    cq_->Push(MakeCompletion(connection_id_, op->opcode, op->wr_id, absl::OkStatus(), op->bytes));
    op->producer = nullptr;
    // Recycled only when nothing else refers to it (a caller of Start may keep its own copy).
    if (op.use_count() == 1 && spare_.size() < kSpareOps) {
      op->staging = {};  // a CUDA source's host copy is not kept
      spare_.push_back(std::move(op));
    }
  }
}

}  // namespace plexus::transport::internal::tcp
