// Pieces the client and the server share: receive buffers, inbound messages, limits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "codec.hpp"
#include "frame.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/rpc/call.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpc::internal {

absl::StatusOr<size_t> ResolveWindow(size_t explicit_value);
absl::StatusOr<size_t> ResolveMaxMessageBytes(size_t explicit_value);

// Receive buffers of one size, 64-byte aligned, recycled (at most `keep` idle ones kept).
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  using Buffer = std::unique_ptr<uint8_t, Free>;
  BufferPool(size_t bytes, size_t keep) : bytes_(bytes), keep_(keep) {}
  Buffer Take();
  void Give(Buffer b);
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  size_t keep_;
  std::mutex mu_;
  std::vector<Buffer> free_;
};

// One filled receive buffer, shared by the frames of a batch parsed in place in it; back to the
// pool when the last of them is gone.
class RecvBuffer {
 public:
  RecvBuffer(std::shared_ptr<BufferPool> pool, BufferPool::Buffer buffer, size_t bytes)
      : pool_(std::move(pool)), buffer_(std::move(buffer)), bytes_(bytes) {}
  ~RecvBuffer() {
    if (buffer_) pool_->Give(std::move(buffer_));
  }
  absl::Span<const uint8_t> bytes() const { return {buffer_.get(), bytes_}; }

 private:
  std::shared_ptr<BufferPool> pool_;
  BufferPool::Buffer buffer_;
  size_t bytes_;
};

// A received frame whose message was rebuilt in place; shares the buffer, owns the arena.
class Inbound : public InboundMessage {
 public:
  // The frame at [offset, offset + bytes) of `buffer` (offset a multiple of 8).
  Inbound(std::shared_ptr<const RecvBuffer> buffer, size_t offset, size_t bytes)
      : buffer_(std::move(buffer)), offset_(offset), bytes_(bytes) {}
  Inbound(std::shared_ptr<BufferPool> pool, BufferPool::Buffer buffer, size_t bytes)
      : Inbound(std::make_shared<RecvBuffer>(std::move(pool), std::move(buffer), bytes), 0, bytes) {
  }
  absl::Span<const uint8_t> bytes() const { return buffer_->bytes().subspan(offset_, bytes_); }
  // Parses the frame (kept in frame()); metadata() then views it.
  absl::Status Parse(const FrameLimits& limits);
  // Decodes the message of type `desc` (the frame must carry one).
  absl::Status Decode(const MessageDesc& desc, const CodecLimits& limits);
  const FrameView& frame() const { return frame_; }

 private:
  friend absl::Status SplitFrames(std::shared_ptr<const RecvBuffer> buffer, bool batches,
                                  const FrameLimits& limits,
                                  std::vector<std::shared_ptr<Inbound>>* out);
  std::shared_ptr<const RecvBuffer> buffer_;
  size_t offset_;
  size_t bytes_;
  FrameView frame_;
  Arena arena_;
};

// Parses every frame of a received message into `out` (in order): one frame, or with `batches`
// (the handshake agreed on them) several back to back. An error names the malformed frame; the
// frames before it are in `out`.
absl::Status SplitFrames(std::shared_ptr<const RecvBuffer> buffer, bool batches,
                         const FrameLimits& limits, std::vector<std::shared_ptr<Inbound>>* out);

// Sends gathered several frames that queue for one connection: frames are added while their
// caller runs a round of completions on the connection's thread, and leave as one transport
// message (a batch, one gathered write) when the round ends. Limits come from the handshake.
struct BatchLimits {
  size_t frames = 1;  // 1: the peer takes one frame per message (no batches)
  size_t bytes = 0;   // the peer's receive buffer
};

// Pipelined rounds. A round's outbox does not wait for the round's end when it grows: it leaves
// in pieces, so that the peer handles the first piece while this side still builds the rest
// (with the round held back as one batch, the two sides took turns: a client and a server on
// two CPUs used one between them). A piece is a quarter of the round's calls, at least
// kMinPieceFrames frames and kMinPieceBytes bytes, or kPieceBytes bytes, whichever comes first.
// Every piece is one more message (a few microseconds of fixed cost on each side): a piece of
// small calls is about as much work for the peer as the message costs, so small calls (under
// 4 KiB at 8 per piece) keep whole rounds; 64 KiB as the cap made 16 pieces of a round of 128
// calls of 8 KiB, and was slower at 128 in flight than 256 KiB. docs/rpc.md, "Pipelined
// rounds"; the measurements are in docs/measurements/rpc.md, "Pipelined rounds".
inline constexpr size_t kPiecesPerRound = 4;
inline constexpr size_t kMinPieceFrames = 8;
inline constexpr size_t kMinPieceBytes = 32 << 10;
inline constexpr size_t kPieceBytes = 256 << 10;

// The frames per piece of a round that handles `round_calls` calls.
inline size_t PieceFrames(size_t round_calls) {
  return std::max(kMinPieceFrames, (round_calls + kPiecesPerRound - 1) / kPiecesPerRound);
}

// Whether an outbox of `frames` frames and `bytes` bytes is a piece that leaves now; never
// while `piece_frames` is 0 (the round is not sent in pieces).
inline bool PieceFull(size_t frames, size_t bytes, size_t piece_frames) {
  return piece_frames > 0 &&
         ((frames >= piece_frames && bytes >= kMinPieceBytes) || bytes >= kPieceBytes);
}

// This thread's involuntary context switches so far (0 where the kernel does not say).
long InvoluntarySwitches();

// Whether a poller's rounds go in pieces. Pieces pay only while the peer runs beside this thread:
// on a shared CPU the peer cannot start before this thread blocks (or it preempts it), and each
// piece is one more message to send and receive. A round that left in pieces paid when the
// peer's answer to an early piece is there by the time the round ended and this thread was not
// switched out involuntarily meanwhile (a peer on this CPU that answered by preempting it); the
// decision is learnt from that (base::AdaptiveToggle): off after kMissesToStop rounds in a row
// that did not pay (where the two sides run beside each other, hardly any round misses, so two
// in a row is a change of place, not noise), a probe every kProbeEvery rounds while off. One per
// poller thread (or role).
class PiecesGate {
 public:
  static constexpr uint32_t kMissesToStop = 2;
  static constexpr uint32_t kProbeEvery = 64;

  // `switches` counts this thread's involuntary context switches (tests pass their own).
  explicit PiecesGate(long (*switches)() = &InvoluntarySwitches) : switches_fn_(switches) {}
  // A round starts.
  void StartRound() {
    decided_ = false;
    piece_left_ = false;
  }
  // The frames per piece for a batch of `calls` calls of this round; 0: it leaves whole. A batch
  // too small to split takes no probe while pieces are off.
  size_t PieceFor(size_t calls);
  // A piece left (before the round's end).
  void PieceLeft();
  // A frame was queued in the round: after a piece left, the round goes in pieces.
  void Queued() { pieced_ = pieced_ || piece_left_; }
  // Whether the last round went in pieces (then Learn once the peer's answer was looked for).
  bool TakePieced() { return std::exchange(pieced_, false); }
  // After a round that went in pieces: whether the peer's answer was there (one pass of the
  // transport, without waiting).
  void Learn(bool answered);
  bool on() const { return toggle_.on(); }

 private:
  long (*switches_fn_)();
  base::AdaptiveToggle toggle_{kMissesToStop, kProbeEvery};
  bool decided_ = false;
  bool split_ = false;
  bool piece_left_ = false;
  bool pieced_ = false;
  long switches_ = 0;  // this thread's involuntary context switches when the first piece left
};

// How long a poller (a Channel's leader or Run thread, a Server's dispatcher) spins before it
// sleeps, while spinning pays (base::AdaptiveSpin turns it off where it does not, e.g. with the
// peer on the same CPU). Where the device moves the bytes in the polling thread
// (ProgressMode::kCaller), every pass of the spin reads the sockets itself, and a sleep costs the
// wake-up of an idle CPU: 50 us keeps both ends of a stream busy where a shorter spin made them
// take turns (docs/rpc.md, "Waiting"; the figures in docs/measurements/rpc.md, "Waiting"). Where
// a device thread moves them, a spinning poller only takes a CPU from that thread: 20 us.
inline constexpr absl::Duration kCallerModeSpin = absl::Microseconds(50);
inline constexpr absl::Duration kThreadModeSpin = absl::Microseconds(20);
inline absl::Duration PollerSpin(const transport::Device& device) {
  return device.options().progress == transport::ProgressMode::kCaller ? kCallerModeSpin
                                                                       : kThreadModeSpin;
}

inline uint32_t DeadlineBudgetUs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 0;
  int64_t us = absl::ToInt64Microseconds(deadline - absl::Now());
  if (us < 1) us = 1;
  if (us > UINT32_MAX) return 0;
  return static_cast<uint32_t>(us);
}

}  // namespace plexus::rpc::internal
