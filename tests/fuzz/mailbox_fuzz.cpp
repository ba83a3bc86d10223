// Fuzzes the mailbox reader: a peer process shares the inbox memory, so every byte of it (slot
// states, lengths, the consumed counter) may be hostile. No input may crash the endpoint or let
// Peek hand out bytes outside the slot; sending into a hostile inbox must fail cleanly.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "mailbox.hpp"

namespace pt = plexus::transport;
namespace pi = plexus::transport::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto inbox = std::make_unique<pi::MailboxInbox>();
  auto peer_inbox = std::make_unique<pi::MailboxInbox>();
  std::memset(inbox.get(), 0, sizeof(pi::MailboxInbox));
  std::memset(peer_inbox.get(), 0, sizeof(pi::MailboxInbox));
  // The input overwrites slot headers first (where it matters most), then everything else.
  for (size_t i = 0; i < size && i < 8 * pt::Mailbox::kSlots; ++i) {
    reinterpret_cast<uint8_t*>(&inbox->slots[i / 8])[i % 8] = data[i];
  }
  if (size > 8 * pt::Mailbox::kSlots) {
    std::memcpy(&peer_inbox->taken, data + 8 * pt::Mailbox::kSlots,
                std::min(sizeof(uint64_t), size - 8 * pt::Mailbox::kSlots));
  }
  std::atomic<bool> down{size % 3 == 0};
  pi::MailboxEndpoint endpoint(peer_inbox.get(), inbox.get(), &down,
                               [] { return absl::UnavailableError("down"); });
  for (int i = 0; i < 2 * pt::Mailbox::kSlots; ++i) {
    auto message = endpoint.Peek();
    if (!message.ok() || !message->has_value()) break;
    const absl::Span<const uint8_t> bytes = **message;
    const uint8_t* slot = inbox->slots[i % pt::Mailbox::kSlots].data;
    if (bytes.data() != slot || bytes.size() > pt::Mailbox::kMaxMessageBytes) __builtin_trap();
    endpoint.Release();
  }
  uint8_t payload[pt::Mailbox::kMaxMessageBytes] = {};
  for (int i = 0; i < 2 * pt::Mailbox::kSlots; ++i) {
    auto sent = endpoint.TrySend(absl::MakeConstSpan(payload, i % 64));
    if (!sent.ok() || !*sent) break;
  }
  return 0;
}
