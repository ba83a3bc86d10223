// Fuzzes the receive matcher every backend shares (src/matcher.*) with sequences of peer-driven
// events (message headers of any length, bytes placed in any order) and user calls (receives of
// any size, failures). Checked throughout: bytes held never exceed either cap, every receive
// completes at most once and with the bytes of the message matched to it in FIFO order, and a
// matcher that goes away returns everything to the device's budget.
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "plexus/transport/matcher.hpp"

namespace pt = plexus::transport;

namespace {

#define CHECK_OR_TRAP(cond)        \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Side {
  struct Pending {
    pt::Matcher::Slot slot;
    uint8_t fill;
  };
  std::unique_ptr<pt::Matcher> matcher;
  std::deque<std::vector<uint8_t>> buffers;  // receive buffers (stable addresses)
  std::vector<int> completed;                // times each receive completed
  std::vector<Pending> pending;              // admitted, not yet placed
  uint64_t admitted = 0;                     // messages admitted, in order
  bool failed = false;

  void Fail(const absl::Status& why, bool keep_whole) {
    matcher->Fail(why, keep_whole);
    failed = true;
    pending.clear();  // a backend stops writing into a failed connection
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool eager = data[0] & 1;
  const size_t conn_cap = size_t{64} << (data[1] % 12);  // 64 B .. 128 KiB
  auto device = std::make_shared<pt::HoldBudget>(conn_cap + conn_cap / 2);
  Side sides[2];
  for (Side& s : sides) {
    Side* self = &s;
    s.matcher = std::make_unique<pt::Matcher>(
        pt::MatcherConfig{.backend = "fuzz",
                          .peer = "peer",
                          .connection_cap = conn_cap,
                          .device = device,
                          .max_spare_bytes = (data[0] & 2) ? conn_cap / 2 : 0,
                          .deliver_eagerly = eager},
        [self](uint64_t wr_id, absl::Status status, size_t bytes) {
          CHECK_OR_TRAP(wr_id < self->completed.size());
          CHECK_OR_TRAP(++self->completed[wr_id] == 1);
          if (status.ok()) {
            const std::vector<uint8_t>& b = self->buffers[wr_id];
            CHECK_OR_TRAP(bytes <= b.size());
            // Receive i gets message i: its bytes are all (i & 0xff).
            for (size_t k = 0; k < bytes; ++k) CHECK_OR_TRAP(b[k] == (wr_id & 0xff));
          }
        });
  }
  for (size_t i = 2; i + 2 < size; i += 3) {
    Side& s = sides[data[i] >> 7];
    const uint8_t op = data[i] & 7;
    const uint16_t arg = static_cast<uint16_t>(data[i + 1] | (data[i + 2] << 8));
    if (s.failed && op != 2 && op != 3) continue;
    switch (op) {
      case 0:
      case 1: {  // a header: mostly small, sometimes enormous
        const size_t length = (arg & 0x8000) ? (size_t{1} << (arg % 50)) : (arg & 0x7fff) / 8;
        pt::Matcher::Slot slot;
        auto admitted = s.matcher->Admit(length, &slot);
        if (!admitted.ok()) {
          s.Fail(admitted.status(), true);
          break;
        }
        if (*admitted == pt::Matcher::Admission::kWait) break;
        CHECK_OR_TRAP(slot.length == length);
        const uint8_t fill = static_cast<uint8_t>(s.admitted++ & 0xff);
        s.pending.push_back({slot, fill});
        break;
      }
      case 2: {  // the user posts a receive
        s.buffers.emplace_back(arg % 700, 0xee);
        s.completed.push_back(0);
        std::vector<uint8_t>& b = s.buffers.back();
        const uint64_t wr_id = s.buffers.size() - 1;
        const absl::Status posted = s.matcher->PostRecv({b.data(), b.size()}, wr_id);
        if (!posted.ok() && !s.failed) {
          CHECK_OR_TRAP(s.completed[wr_id] == 1);  // too long: the receive completed with it
          s.Fail(posted, true);
        }
        break;
      }
      case 3:
        s.matcher->DeliverOldest();
        break;
      case 4:
      case 5: {  // the bytes of an admitted message arrive (in any order among them)
        if (s.pending.empty()) break;
        const size_t k = arg % s.pending.size();
        const Side::Pending p = s.pending[k];
        s.pending.erase(s.pending.begin() + static_cast<std::ptrdiff_t>(k));
        if (p.slot.length > 0) std::memset(p.slot.dest, p.fill, p.slot.length);
        s.matcher->Placed(p.slot).IgnoreError();  // no consumed receives
        break;
      }
      case 6:
        s.Fail(absl::UnavailableError("peer died"), (arg & 1) != 0);
        break;
      case 7:
        if (!eager) {
          while (s.matcher->DeliverOldest()) {
          }
        }
        break;
    }
    CHECK_OR_TRAP(device->used() <= device->cap());
    for (Side& side : sides) CHECK_OR_TRAP(side.matcher->held_bytes() <= conn_cap);
  }
  for (Side& s : sides) s.matcher.reset();
  CHECK_OR_TRAP(device->used() == 0);
  return 0;
}
