// Completions of posted operations, and the queue they are delivered to.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace plexus::transport {

enum class Opcode : uint8_t {
  kSend = 0,         // a PostSend finished: the send buffers may be reused
  kRecv = 1,         // a PostRecv was filled: `bytes` is the message length
  kWrite = 2,        // a PostWrite finished at the initiator: the bytes are placed remotely
  kRemoteWrite = 3,  // target side of a write with an immediate: bytes placed, immediate set
};
std::string_view OpcodeName(Opcode opcode);

struct Completion {
  uint64_t wr_id = 0;  // the caller's id from the Post call; 0 for kRemoteWrite
  Opcode opcode = Opcode::kSend;
  absl::Status status;  // non-OK: the operation failed and its buffers hold undefined bytes
  size_t bytes = 0;
  bool has_immediate = false;
  uint32_t immediate = 0;
  uint64_t connection_id = 0;  // Connection::id() of the connection it belongs to
};

// Something that makes I/O progress when called: a device in caller-driven progress mode.
class ProgressDriver {
 public:
  virtual ~ProgressDriver() = default;
  // Moves bytes for every connection of the device, blocking at most `max_block` when there is
  // nothing to do. Safe to call from several threads (one makes progress at a time).
  virtual void Progress(absl::Duration max_block) = 0;
  // Interrupts a Progress() blocked in another thread (a completion was pushed from outside).
  virtual void Wake() {}
};

// A multi-producer, multi-consumer queue of completions. Backends push; callers Poll or Wait.
// With a ProgressDriver (caller-driven mode), Poll and Wait also make I/O progress, so that no
// thread hop separates the wire from the caller: the lowest latency, at the price of polling.
class CompletionQueue {
 public:
  explicit CompletionQueue(ProgressDriver* driver = nullptr) : driver_(driver) {}
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Moves up to out.size() completions into `out` without blocking; returns how many.
  size_t Poll(absl::Span<Completion> out);
  // Returns the next completion, waiting up to `timeout`; DeadlineExceeded when none came.
  // Spins for `spin` first, then sleeps (a 2-core machine must not be burnt by busy loops).
  absl::StatusOr<Completion> Wait(absl::Duration timeout = absl::InfiniteDuration(),
                                  absl::Duration spin = absl::Microseconds(20));
  size_t size() const;

  // Backend side.
  void Push(Completion completion);

 private:
  // Poll without making progress.
  size_t Take(absl::Span<Completion> out);

  ProgressDriver* driver_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Completion> items_;
  std::atomic<size_t> count_{0};
  std::atomic<int> blocked_in_driver_{0};
};

}  // namespace plexus::transport
