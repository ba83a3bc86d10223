#include "mailbox.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "futex.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport {

absl::StatusOr<std::optional<size_t>> Mailbox::TryReceive(absl::Span<uint8_t> out) {
  PLEXUS_ASSIGN_OR_RETURN(std::optional<absl::Span<const uint8_t>> message, Peek());
  if (!message.has_value()) return std::nullopt;
  const absl::Span<const uint8_t> bytes = *message;
  if (bytes.size() > out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Mailbox::TryReceive: message of ", bytes.size(),
                                                   " bytes does not fit the ", out.size(),
                                                   "-byte buffer"));
  }
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  Release();
  return bytes.size();
}

}  // namespace plexus::transport

namespace plexus::transport::internal {
namespace {

constexpr uint32_t kSleeperBit = 0x80000000u;
constexpr uint32_t kSequenceMask = 0x7FFFFFFFu;

uint32_t SequenceOf(uint64_t message_number) {
  return static_cast<uint32_t>(message_number) & kSequenceMask;
}

std::atomic_ref<uint32_t> State(MailboxSlot& slot) { return std::atomic_ref<uint32_t>(slot.state); }

}  // namespace

absl::Status MailboxEndpoint::DownStatus() const {
  absl::Status why = why_();
  if (why.ok()) why = absl::UnavailableError("connection is down");
  return why;
}

absl::StatusOr<bool> MailboxEndpoint::TrySend(absl::Span<const ConstBuffer> parts) {
  size_t total = 0;
  for (const ConstBuffer& part : parts) {
    if (part.data == nullptr && part.size > 0) {
      return absl::InvalidArgumentError("Mailbox::TrySend: null buffer");
    }
    total += part.size;
  }
  if (total > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mailbox::TrySend: message of ", total, " bytes exceeds the limit of ", kMaxMessageBytes));
  }
  if (down_->load(std::memory_order_acquire)) return DownStatus();
  if (sent_ - taken_seen_ >= static_cast<uint64_t>(kSlots)) {
    taken_seen_ = std::atomic_ref<uint64_t>(tx_->taken).load(std::memory_order_acquire);
    if (taken_seen_ > sent_) {
      return absl::DataLossError("Mailbox: the peer claims to have taken messages never sent");
    }
    if (sent_ - taken_seen_ >= static_cast<uint64_t>(kSlots)) return false;
  }
  MailboxSlot& slot = tx_->slots[sent_ % kSlots];
  slot.length = static_cast<uint32_t>(total);
  uint8_t* out = slot.data;
  for (const ConstBuffer& part : parts) {
    if (part.size > 0) std::memcpy(out, part.data, part.size);
    out += part.size;
  }
  ++sent_;
  const uint32_t old = State(slot).exchange(SequenceOf(sent_), std::memory_order_release);
  if ((old & kSleeperBit) != 0) {
    FutexWake(&slot.state, /*shared=*/true);
  }
  return true;
}

absl::StatusOr<std::optional<absl::Span<const uint8_t>>> MailboxEndpoint::Peek() {
  MailboxSlot& slot = rx_->slots[received_ % kSlots];
  const uint32_t state = State(slot).load(std::memory_order_acquire);
  if ((state & kSequenceMask) != SequenceOf(received_ + 1)) {
    // Read `down` after the slot: a message published before the connection went down is seen.
    if (down_->load(std::memory_order_acquire) && (State(slot).load(std::memory_order_acquire) &
                                                   kSequenceMask) != SequenceOf(received_ + 1)) {
      return DownStatus();
    }
    return std::nullopt;
  }
  const uint32_t length = std::atomic_ref<uint32_t>(slot.length).load(std::memory_order_relaxed);
  if (length > kMaxMessageBytes) {
    return absl::DataLossError(absl::StrCat("Mailbox: the peer wrote a malformed slot (length ",
                                            length, " > ", kMaxMessageBytes, ")"));
  }
  return absl::MakeConstSpan(slot.data, length);
}

void MailboxEndpoint::Release() {
  ++received_;
  std::atomic_ref<uint64_t>(rx_->taken).store(received_, std::memory_order_release);
}

void MailboxEndpoint::Wait(absl::Duration max) {
  if (max <= absl::ZeroDuration()) return;
  MailboxSlot& slot = rx_->slots[received_ % kSlots];
  uint32_t state = State(slot).load(std::memory_order_acquire);
  if ((state & kSequenceMask) == SequenceOf(received_ + 1)) return;
  if (down_->load(std::memory_order_acquire)) return;
  if ((state & kSleeperBit) == 0) {
    // Announce the sleeper; a sender that publishes meanwhile makes this fail: no sleep.
    if (!State(slot).compare_exchange_strong(state, state | kSleeperBit,
                                             std::memory_order_acq_rel)) {
      return;
    }
    state |= kSleeperBit;
  }
  FutexWait(&slot.state, state, /*shared=*/true, max);
}

}  // namespace plexus::transport::internal
