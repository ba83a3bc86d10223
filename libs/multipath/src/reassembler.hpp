// Receiver side of chunked Sends: places chunks into the matching Recv (or holds them until it
// is posted), drops duplicates by (op, chunk), and completes Recvs in Send order once the
// notification came and every byte is in place. Pure logic (no I/O), so it is fuzzed directly.
//
// Matching messages to Recvs is the transport's (transport::Matcher: the FIFO of posted
// receives, held messages, the caps, the too-long error), as on every Device. A message can only
// be matched once every earlier one was (the matcher takes them in Send order), but its chunks
// may come first over another path: they go straight into the Recv it will get when that one is
// posted already (Matcher::PostedRecv), else into memory of their own until it is matched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/matcher.hpp"
#include "plexus/transport/types.hpp"
#include "wire.hpp"

namespace plexus::multipath::internal {

class Reassembler {
 public:
  explicit Reassembler(size_t max_held_bytes);
  Reassembler(const Reassembler&) = delete;
  Reassembler& operator=(const Reassembler&) = delete;

  // A decoded kChunk and its payload. `*duplicate` is set when it was already applied (the
  // sender still needs the ack). Errors are fatal for the channel (inconsistent peer, or the
  // held-bytes cap exceeded: ResourceExhausted).
  absl::Status OnChunk(const Frame& frame, absl::Span<const uint8_t> payload, bool* duplicate);
  // A decoded kNotify of a Send or a Write; `*duplicate` as above.
  absl::Status OnNotify(const Frame& frame, bool* duplicate);
  // The user's next receive buffer (matched with the next Send in order).
  void PostRecv(transport::MutableBuffer buffer, uint64_t wr_id);
  // Fails every posted Recv not completed yet with `why` (the channel is closing or failed).
  void CancelRecvs(const absl::Status& why);
  // Completions ready for the user (kRecv in Send order, kRemoteWrite), oldest first.
  std::vector<transport::Completion> TakeCompletions();

  // Bytes held for Recvs not posted yet: the matcher's and those of messages not matched yet.
  size_t held_bytes() const { return matcher_.held_bytes() + early_bytes_; }
  uint64_t duplicates() const { return duplicates_; }
  // Whether a posted Recv still waits for its message.
  bool recv_waiting() const { return recvs_posted_ > next_deliver_; }

 private:
  struct Message {
    uint64_t seq = 0;
    uint64_t total = 0;
    uint64_t bytes_seen = 0;
    uint64_t chunks_seen = 0;
    absl::flat_hash_set<uint32_t> seen;  // chunk indices applied
    bool notified = false;
    uint64_t chunk_count = 0;
    bool matched = false;           // admitted to the matcher (`slot`)
    transport::Matcher::Slot slot;  // the Recv's buffer or the matcher's held memory
    uint8_t* dest = nullptr;        // where chunks go: slot.dest, the Recv it will get, `early`
    std::vector<uint8_t> early;     // bytes that came before it could be matched
    bool too_long = false;          // larger than its Recv: the Recv fails, bytes are dropped
  };
  // What the matcher is doing when it reports a completion: a too-long error belongs to message
  // `index`, of `length` bytes, whose Recv has `buffer` bytes.
  struct Context {
    bool active = false;
    uint64_t index = 0;
    uint64_t length = 0;
    size_t buffer = 0;
  };

  bool Finished(uint64_t seq) const;
  void MarkFinished(uint64_t seq);
  absl::StatusOr<Message*> FindOrStart(const Frame& frame);
  // Admits the messages started in Send order from next_match_ on.
  absl::Status MatchReady();
  // A message that cannot be matched yet: into the Recv it will get, if posted, else `early`.
  absl::Status PlaceEarly(uint64_t index, Message& message);
  void DropEarly(Message& message);
  void OnMatcherCompletion(uint64_t wr_id, absl::Status status, size_t bytes);
  void Deliver();

  static constexpr size_t kMaxMessagesInProgress = 4096;
  size_t max_held_;
  // max_held_bytes, shared by the matcher's held messages and the early bytes.
  std::shared_ptr<transport::HoldBudget> budget_;
  transport::Matcher matcher_;
  size_t early_bytes_ = 0;
  uint64_t duplicates_ = 0;
  // Ops finished (every seq below the watermark, and the set above it).
  uint64_t finished_below_ = 0;
  absl::flat_hash_set<uint64_t> finished_;
  std::map<uint64_t, Message> messages_;  // by send_index
  uint64_t next_match_ = 0;               // send_index the matcher admits next
  uint64_t recvs_posted_ = 0;
  uint64_t next_deliver_ = 0;  // send_index of the next kRecv completion
  Context context_;
  bool failed_ = false;
  absl::Status failure_;
  // Too-long errors of messages after next_deliver_, released in Send order.
  std::map<uint64_t, transport::Completion> deferred_;
  std::deque<transport::Completion> ready_;
};

}  // namespace plexus::multipath::internal
