#include "conn.hpp"

#include <sys/resource.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"

namespace plexus::rpc::internal {
namespace {

const base::Param<int64_t> kWindowParam(
    "PLEXUS_RPC_WINDOW", 64, "rpc calls in flight per connection (client and server side)");
const base::Param<base::Bytes> kMaxMessageParam(
    "PLEXUS_RPC_MAX_MESSAGE_BYTES", base::Bytes{4 << 20},
    "largest rpc request/response frame accepted (each posted receive is this big)");

}  // namespace

long InvoluntarySwitches() {
  rusage u{};
  return getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_nivcsw : 0;
}

size_t PiecesGate::PieceFor(size_t calls) {
  bool split;
  if (calls > kMinPieceFrames) {
    if (!decided_) {
      decided_ = true;
      split_ = toggle_.Next();
    }
    split = split_;
  } else {
    split = toggle_.on();
  }
  return split ? PieceFrames(calls) : 0;
}

void PiecesGate::PieceLeft() {
  if (piece_left_) return;
  piece_left_ = true;
  switches_ = switches_fn_();
}

void PiecesGate::Learn(bool answered) { toggle_.Record(answered && switches_fn_() == switches_); }

absl::StatusOr<size_t> ResolveWindow(size_t explicit_value) {
  if (explicit_value > 0) return explicit_value;
  PLEXUS_ASSIGN_OR_RETURN(int64_t w, kWindowParam.Get());
  if (w < 1 || w > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("PLEXUS_RPC_WINDOW must be between 1 and 65536 (got ", w, ")"));
  }
  return static_cast<size_t>(w);
}

absl::StatusOr<size_t> ResolveMaxMessageBytes(size_t explicit_value) {
  size_t v = explicit_value;
  if (v == 0) {
    PLEXUS_ASSIGN_OR_RETURN(base::Bytes b, kMaxMessageParam.Get());
    v = b.value;
  }
  if (v < 4096 || v > (size_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc max message bytes (PLEXUS_RPC_MAX_MESSAGE_BYTES) must be between 4 KiB and 4 GiB "
        "(got ",
        v, ")"));
  }
  return v;
}

BufferPool::Buffer BufferPool::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      Buffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  const size_t rounded = (bytes_ + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
}

void BufferPool::Give(Buffer b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < keep_) free_.push_back(std::move(b));
}

absl::Status Inbound::Parse(const FrameLimits& limits) {
  PLEXUS_ASSIGN_OR_RETURN(frame_, ParseFrame(bytes(), limits));
  metadata_.assign(frame_.metadata.begin(), frame_.metadata.end());
  return absl::OkStatus();
}

absl::Status SplitFrames(std::shared_ptr<const RecvBuffer> buffer, bool batches,
                         const FrameLimits& limits, std::vector<std::shared_ptr<Inbound>>* out) {
  const absl::Span<const uint8_t> all = buffer->bytes();
  if (!batches) {
    auto in = std::make_shared<Inbound>(buffer, 0, all.size());
    PLEXUS_RETURN_IF_ERROR(in->Parse(limits));
    out->push_back(std::move(in));
    return absl::OkStatus();
  }
  size_t at = 0;
  for (size_t index = 0;; ++index) {
    size_t length = 0;
    auto frame = ParseFramePrefix(all.subspan(at), &length, limits);
    if (!frame.ok()) {
      return base::Annotate(frame.status(),
                            absl::StrCat("frame ", index, " of a batch (at byte ", at, ")"));
    }
    auto in = std::make_shared<Inbound>(buffer, at, length);
    in->frame_ = *std::move(frame);
    in->metadata_.assign(in->frame_.metadata.begin(), in->frame_.metadata.end());
    out->push_back(std::move(in));
    PLEXUS_ASSIGN_OR_RETURN(std::optional<size_t> next, NextFrameOffset(at + length, all.size()));
    if (!next) return absl::OkStatus();
    at = *next;
  }
}

absl::Status Inbound::Decode(const MessageDesc& desc, const CodecLimits& limits) {
  if (frame_.structure.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: the frame carries no ", desc.full_name));
  }
  PLEXUS_ASSIGN_OR_RETURN(message_,
                          DecodeMessage(desc, frame_.structure, frame_.segments, arena_, limits));
  return absl::OkStatus();
}

}  // namespace plexus::rpc::internal
