// The wire protocol of torch 1.13's c10d TCPStore (the store torchrun's agent serves at
// MASTER_ADDR:MASTER_PORT), as its server speaks it: a request is one query byte followed by its
// arguments; strings and byte vectors are a little-endian uint64 length and the bytes; counts
// are uint64, counters int64. Nothing frames a request: a server that cannot parse one closes
// the connection. Learned from the torch 1.13 source and checked against Debian's python3-torch
// (tests/transport/torch_store_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::transport::torch_store {

enum class Query : uint8_t {
  kSet = 0,  // key, value; no reply
  kCompareSet = 1,
  kGet = 2,    // key; reply: bytes (the key must exist: Wait for it first)
  kAdd = 3,    // key, int64 delta; reply: int64 new value (decimal text in the store)
  kCheck = 4,  // uint64 count, keys; reply: one byte, kReady or kNotReady
  kWait = 5,   // uint64 count, keys; reply: kStopWaiting once every key exists
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,  // key; reply: int64 number of keys deleted (0 or 1)
};

inline constexpr uint8_t kReady = 0;
inline constexpr uint8_t kNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;

// Requests, ready to send.
std::string EncodeSet(std::string_view key, std::string_view value);
std::string EncodeGet(std::string_view key);
std::string EncodeAdd(std::string_view key, int64_t delta);
std::string EncodeCheck(absl::Span<const std::string> keys);
std::string EncodeWait(absl::Span<const std::string> keys);
std::string EncodeDelete(std::string_view key);

// The shape of a reply.
enum class Reply : uint8_t {
  kByte,   // CHECK, WAIT
  kInt64,  // ADD, DELETE_KEY
  kBytes,  // GET: uint64 length, then that many bytes
};

// A reply decoded from the bytes received so far.
struct Decoded {
  bool complete = false;  // false: `needed` more bytes must arrive first
  size_t needed = 0;      // total bytes the reply takes (known once its length prefix arrived)
  uint8_t byte = 0;       // kByte
  int64_t value = 0;      // kInt64
  std::string bytes;      // kBytes
};

// Decodes a reply of `kind` from the start of `data`. DataLoss when a GET reply announces more
// than `max_value_bytes` (a hostile or confused peer must not make us allocate without bound).
absl::StatusOr<Decoded> DecodeReply(Reply kind, absl::Span<const uint8_t> data,
                                    size_t max_value_bytes);

}  // namespace plexus::transport::torch_store
