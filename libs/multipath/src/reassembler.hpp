// Receiver side of chunked Sends: places chunks into the matching Recv (or holds them until it
// is posted), drops duplicates by (op, chunk), and completes Recvs in Send order once the
// notification came and every byte is in place. Pure logic (no I/O), so it is fuzzed directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/types.hpp"
#include "wire.hpp"

namespace plexus::multipath::internal {

class Reassembler {
 public:
  explicit Reassembler(size_t max_held_bytes) : max_held_(max_held_bytes) {}

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

  size_t held_bytes() const { return held_bytes_; }
  uint64_t duplicates() const { return duplicates_; }
  // Recvs posted and not completed.
  size_t pending_recvs() const { return recvs_.size(); }

 private:
  struct Message {
    uint64_t seq = 0;
    uint64_t total = 0;
    uint64_t bytes_seen = 0;
    uint64_t chunks_seen = 0;
    absl::flat_hash_set<uint32_t> seen;  // chunk indices applied
    bool notified = false;
    uint64_t chunk_count = 0;
    uint8_t* dest = nullptr;    // the user's buffer, or held.data()
    std::vector<uint8_t> held;  // bytes that came before their Recv
    bool too_long = false;      // larger than its Recv: the Recv fails, bytes are dropped
  };
  struct PostedRecv {
    transport::MutableBuffer buffer;
    uint64_t wr_id = 0;
  };

  bool Finished(uint64_t seq) const;
  void MarkFinished(uint64_t seq);
  absl::StatusOr<Message*> FindOrStart(const Frame& frame);
  void Bind(Message& message, PostedRecv& recv);
  void Deliver();

  static constexpr size_t kMaxMessagesInProgress = 4096;
  size_t max_held_;
  size_t held_bytes_ = 0;
  uint64_t duplicates_ = 0;
  // Ops finished (every seq below the watermark, and the set above it).
  uint64_t finished_below_ = 0;
  absl::flat_hash_set<uint64_t> finished_;
  std::map<uint64_t, Message> messages_;  // by send_index
  std::map<uint64_t, PostedRecv> recvs_;  // by the send_index it matches
  uint64_t next_recv_index_ = 0;          // send_index of the next PostRecv
  uint64_t next_deliver_ = 0;             // send_index of the next kRecv completion
  std::deque<transport::Completion> ready_;
};

}  // namespace plexus::multipath::internal
