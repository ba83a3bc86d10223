// The table-driven codec of generated messages (see plexus/rpc/schema.hpp and docs/rpc.md).
//
// A message is encoded as one structure segment (its scalars and the lengths/counts of its views,
// nested messages inline, depth first) plus one data segment per non-empty string, bytes or
// repeated-scalar field (a repeated string/bytes field is one segment: its elements back to
// back). Data segments are gathered straight from the message's memory: no copy on send.
// Decoding rebuilds the message in place: views point into the receive buffer, nested messages
// and arrays of views live in an Arena. Every length, count, depth, bool and enum value is checked;
// an error names the field path ("kv.PutRequest.entries[2].key").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/rpc/schema.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::rpc::internal {

// A view of bytes to send, the transport's gather element.
using Part = transport::ConstBuffer;

struct EncodedMessage {
  std::string structure;
  // Data segment i is parts[segment_first[i], segment_first[i] + segment_parts[i]).
  std::vector<Part> parts;
  std::vector<uint32_t> segment_first;
  std::vector<uint32_t> segment_parts;
  std::vector<uint64_t> segment_bytes;
  void Clear();
};

struct CodecLimits {
  int max_depth = 32;                 // nesting of message fields
  size_t max_arena_bytes = 64 << 20;  // nested messages and view arrays of one decoded message
};

// Appends `msg` (of type `desc`) to `out`. Fails only on limits (depth, a view over 4 GiB).
absl::Status EncodeMessage(const MessageDesc& desc, const void* msg, EncodedMessage* out,
                           const CodecLimits& limits = {});

// Bump allocator owning the nested parts of decoded messages (all trivially destructible).
class Arena {
 public:
  explicit Arena(size_t limit = size_t{64} << 20) : limit_(limit) {}
  Arena(const Arena&) = delete;  // it may point into itself
  Arena& operator=(const Arena&) = delete;
  // nullptr when the limit would be exceeded.
  void* Allocate(size_t bytes, size_t align);
  // Bytes of the blocks allocated beyond the inline ones.
  size_t used() const { return used_; }
  // Forgets every allocation (frees the blocks beyond the inline bytes): a recycled owner's
  // arena starts empty.
  void Reset() {
    blocks_.clear();
    cursor_ = inline_;
    left_ = kInlineBytes;
    used_ = 0;
  }

 private:
  // The first bytes live in the arena itself: a small message (and its owner, allocated
  // together with it) needs no allocation of its own.
  static constexpr size_t kInlineBytes = 256;
  alignas(std::max_align_t) unsigned char inline_[kInlineBytes];
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
  unsigned char* cursor_ = inline_;
  size_t left_ = kInlineBytes;
  size_t used_ = 0;
  size_t limit_;
};

// Rebuilds a message of type `desc` in `arena` from its structure segment and data segments (views
// that must outlive the message). Returns the message (a `desc.size` object in the arena).
absl::StatusOr<void*> DecodeMessage(const MessageDesc& desc, absl::Span<const uint8_t> structure,
                                    absl::Span<const absl::Span<const uint8_t>> segments,
                                    Arena& arena, const CodecLimits& limits = {});

size_t ScalarSize(FieldKind kind);

}  // namespace plexus::rpc::internal
