// Receive matching for transport::Device implementations, the one every Plexus backend uses:
// the FIFO of posted receives, the FIFO of messages that arrived before their receive was posted
// ("held"), the one "message too long" error, and the caps on the bytes held for a connection and
// for a whole device. A Device subclass written outside Plexus uses it to keep the transport
// contract (docs/architecture.md) the same way.
//
// A backend tells the matcher when a message's header arrives (Admit: where do its bytes go?),
// when its bytes are all in place (Placed), when the user posts a receive (PostRecv) and when
// the connection ends (Fail). The matcher reports receive completions through a callback. Not
// thread-safe: the backend serialises calls (its connection lock); only HoldBudget is shared.
// Messages are matched to receives in the order they are admitted; a backend whose messages
// can arrive out of order admits them in the sender's order (PostedRecv tells where a later
// message will go).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

// The caps' defaults (DeviceOptions::max_held_bytes_per_{connection,device}).
inline constexpr size_t kDefaultHeldBytesPerConnection = size_t{256} << 20;
inline constexpr size_t kDefaultHeldBytesPerDevice = size_t{1} << 30;
// What one held message costs the budget besides its bytes: a flood of empty messages is
// bounded too.
inline constexpr size_t kHeldMessageOverhead = 64;

// Bytes held by all connections of one device. Thread-safe (shm connections have a lock each).
class HoldBudget {
 public:
  explicit HoldBudget(size_t cap) : cap_(cap) {}
  size_t cap() const { return cap_; }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  bool TryReserve(size_t bytes);
  void Release(size_t bytes);

 private:
  const size_t cap_;
  std::atomic<size_t> used_{0};
};

// Memory of one held message. Large blocks are mapped privately, so that freeing them returns
// the memory to the system at once (malloc may keep freed blocks of a few MiB in its heap).
class HeldBytes {
 public:
  HeldBytes() = default;
  HeldBytes(HeldBytes&& other) noexcept { *this = std::move(other); }
  HeldBytes& operator=(HeldBytes&& other) noexcept;
  ~HeldBytes() { Reset(); }
  // Uninitialised memory (every byte is received); false when the system refuses it.
  bool Allocate(size_t bytes);
  void Reset();
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  bool mapped_ = false;
};

struct MatcherConfig {
  std::string backend;  // "tcp", "shm", ... (error messages)
  std::string peer;     // the peer as the user knows it (error messages)
  size_t connection_cap = kDefaultHeldBytesPerConnection;
  std::shared_ptr<HoldBudget> device;  // null: no device-wide cap
  // Buffers of delivered messages kept for reuse (counted in connection_cap, not in the
  // device's cap): a fresh allocation per large message costs page faults and zeroing each
  // time. 0 = none.
  size_t max_spare_bytes = 0;
  // Held messages are delivered as soon as they are whole and have a receive. false: only by
  // DeliverOldest (tcp orders them with one-sided writes); after Fail they always are.
  bool deliver_eagerly = true;
  // The end of the too-long error: what the backend does next.
  std::string after_too_long = "the connection is closed";
  // A message admitted into a consumed receive (PostRecvConsumed): true, the backend streams it
  // to Slot::consumer itself; false, it is placed into held memory like an early message and
  // consumed once whole (counted against the caps meanwhile).
  bool stream_consumers = true;
};

class Matcher {
 public:
  // Reports a receive's completion (always Opcode::kRecv).
  using CompleteFn = std::function<void(uint64_t wr_id, absl::Status status, size_t bytes)>;

  Matcher(MatcherConfig config, CompleteFn complete);
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // Where an admitted message's bytes go.
  struct Slot {
    uint8_t* dest = nullptr;  // length bytes (null when length is 0)
    size_t length = 0;
    bool held = false;
    uint64_t ticket = 0;  // held: names the message for Placed
    uint64_t wr_id = 0;   // direct: the matched receive
    // Direct into a consumed receive (dest is null): the backend hands every byte to it, in
    // order, then calls Placed. Shared so that the slot can be copied.
    std::shared_ptr<Consumer> consumer;
  };
  enum class Admission { kAdmitted, kWait };

  // A message of `length` bytes announced itself. It goes straight into the oldest posted
  // receive when one is posted, else into held memory. kWait: holding it now would exceed a
  // cap; stop reading from the connection and call again after PostRecv or once held messages
  // were delivered. Errors (the backend fails the connection with them): the matched receive is
  // too short (it completes with the error), or no receive is posted and the message alone is
  // larger than a cap. Nothing of `length` is allocated before it is checked.
  absl::StatusOr<Admission> Admit(size_t length, Slot* slot);

  // Every byte of the message in `slot` is in place. Direct: completes its receive. Held: marks
  // it whole (and delivers, when eager). Error: a consumer the delivery called failed (its
  // receive completed with the error); the backend fails the connection with it.
  absl::Status Placed(const Slot& slot);

  // Delivers the oldest held message if it is whole and has a receive; true when it did (or
  // when that receive had already failed as too short). A consumer that fails on the way is
  // reported by TakeConsumerError.
  bool DeliverOldest();
  // The first consumer error since the last call (OK when none): the receive completed with it,
  // and the backend fails the connection with it.
  absl::Status TakeConsumerError() { return std::exchange(consumer_error_, absl::OkStatus()); }

  // The user posted a receive: it takes the oldest held message without one (delivered when
  // whole, when eager), or waits in the FIFO. Error: the message it took is longer; the receive
  // completed with that error and the backend should fail the connection. After Fail, with no
  // whole message left: Fail's reason (nothing is queued).
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id);
  // The same for a consumed receive of at most `max_length` bytes (Connection::PostRecvConsumed).
  // A held message it takes is handed to `consumer` when whole; an error from the consumer is
  // returned here (and its receive completed with it): fail the connection.
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id);

  // The connection ended with `why`: posted receives, and receives of messages not yet whole,
  // complete with it; messages not yet whole are dropped. With `keep_whole`, whole messages stay
  // deliverable to later PostRecv calls (and count against the caps until then); without, they
  // are freed.
  void Fail(const absl::Status& why, bool keep_whole);

  // Without changing anything: when no receive is posted and the oldest message without one is
  // held whole, copies its first min(head.size, length) bytes into `head` and returns its length
  // (the next PostRecv takes that message); otherwise nullopt. Connection::PeekNext.
  std::optional<size_t> PeekNext(MutableBuffer head) const;

  // Whether PostRecv would find a held message without a receive.
  bool has_unclaimed() const { return claimed_ < held_.size(); }
  bool has_posted_recv() const { return !recvs_.empty(); }
  size_t posted_recvs() const { return recvs_.size(); }
  // The i-th posted receive still waiting for a message (0: the one the next admitted message
  // takes); null when fewer are posted.
  const MutableBuffer* PostedRecv(size_t i) const {
    return i < recvs_.size() ? &recvs_[i].buffer : nullptr;
  }
  size_t held_messages() const { return held_.size(); }
  size_t held_bytes() const { return used_; }  // held, spare buffers and overheads
  const std::string& peer() const { return config_.peer; }

  // "message too long", in one wording.
  absl::Status TooLong(size_t message, size_t buffer, uint64_t wr_id) const;

 private:
  struct Held {
    HeldBytes bytes;
    size_t length = 0;
    bool whole = false;
    bool claimed = false;   // a receive took it
    bool rejected = false;  // ... and was too short (already completed with the error)
    MutableBuffer recv;
    uint64_t wr_id = 0;
    std::shared_ptr<Consumer> consumer;  // the claiming receive is a consumed one
  };
  struct Recv {
    MutableBuffer buffer;  // data is null for a consumed receive
    uint64_t wr_id = 0;
    std::shared_ptr<Consumer> consumer;
  };

  absl::Status TooLargeToHold(size_t length, size_t cap, bool device) const;
  // Reserves `bytes` in both caps, dropping spare buffers when that makes room in the
  // connection's.
  bool Reserve(size_t bytes);
  void Unreserve(size_t bytes);
  // A buffer of at least `length` bytes: a spare one, or a fresh one; false: no room (or memory).
  bool TakeBuffer(size_t length, HeldBytes* out);
  void GiveBack(HeldBytes bytes);
  void DropSpares();
  void Deliver(Held& h);
  absl::Status Claim(MutableBuffer buffer, uint64_t wr_id, std::shared_ptr<Consumer> consumer);
  void DeliverReady();

  const MatcherConfig config_;
  const CompleteFn complete_;
  std::deque<Recv> recvs_;  // non-empty only while every held message is claimed
  std::deque<Held> held_;
  size_t claimed_ = 0;         // held_[0, claimed_) have a receive
  uint64_t front_ticket_ = 0;  // ticket of held_.front()
  size_t used_ = 0;            // held, overheads and spares: against connection_cap
  size_t device_used_ = 0;     // held and overheads: this connection's share of the device's
  std::vector<HeldBytes> spares_;
  size_t spare_bytes_ = 0;
  bool eager_;
  bool failed_ = false;
  absl::Status failure_;  // Fail's reason
  absl::Status consumer_error_;
};

}  // namespace plexus::transport
