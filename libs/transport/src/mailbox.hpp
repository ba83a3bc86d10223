// The memory layout and the code of Mailbox, shared by the backends that offer one. An inbox is
// written by one sender and read by one receiver, possibly in another process (shm maps it from
// the connection file), so nothing read from it is trusted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "plexus/transport/connection.hpp"

namespace plexus::transport::internal {

inline constexpr size_t kMailboxSlotBytes = 2048;
static_assert(Mailbox::kMaxMessageBytes + 8 == kMailboxSlotBytes);

// One message. `state` holds the message's sequence number (31 bits, from 1) once the bytes are
// in place, plus kSleeperBit while the receiver sleeps on it (a futex word). The header shares
// the cache line with the first 56 bytes of data: a small message costs the receiver one miss.
struct alignas(64) MailboxSlot {
  uint32_t state;
  uint32_t length;
  uint8_t data[Mailbox::kMaxMessageBytes];
};
static_assert(sizeof(MailboxSlot) == kMailboxSlotBytes);

struct alignas(64) MailboxInbox {
  MailboxSlot slots[Mailbox::kSlots];
  alignas(64) uint64_t taken;  // messages the receiver consumed (written by the receiver only)
};
static_assert(sizeof(MailboxInbox) == Mailbox::kSlots * kMailboxSlotBytes + 64);

// A connection's mailbox: sends into `tx` (the peer's inbox), receives from `rx`. `down` turns
// true once the connection is over; `why` says why.
class MailboxEndpoint final : public Mailbox {
 public:
  MailboxEndpoint(MailboxInbox* tx, MailboxInbox* rx, const std::atomic<bool>* down,
                  std::function<absl::Status()> why)
      : tx_(tx), rx_(rx), down_(down), why_(std::move(why)) {}

  using Mailbox::TrySend;
  absl::StatusOr<bool> TrySend(absl::Span<const ConstBuffer> parts) override;
  absl::StatusOr<std::optional<absl::Span<const uint8_t>>> Peek() override;
  void Release() override;
  void Wait(absl::Duration max) override;

 private:
  absl::Status DownStatus() const;

  MailboxInbox* tx_;
  MailboxInbox* rx_;
  const std::atomic<bool>* down_;
  std::function<absl::Status()> why_;
  uint64_t sent_ = 0;        // messages this side put into tx_
  uint64_t taken_seen_ = 0;  // the peer's latest `taken` of tx_ read here
  uint64_t received_ = 0;    // messages this side took from rx_
};

}  // namespace plexus::transport::internal
