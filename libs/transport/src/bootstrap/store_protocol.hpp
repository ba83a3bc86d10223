// Wire protocol of TcpStore: length-prefixed binary frames, little-endian.
//
// Frame  = u32 magic "PXST" | u32 body length | body
// Request body  = u8 op | op fields          Response body = u8 op | u8 code | fields
//   kHello   u32 version, str job                              ok: u32 version, str job,
//                                                                  u8 job is a nonce
//   kSet     str key, str value                                ok: -
//   kGet     u64 timeout_ms, str key                           ok: str value
//   kAdd     i64 delta, str key                                ok: i64 new value
//   kWait    u64 timeout_ms, u32 n, n x str key                ok: -
//   kCheck   u32 n, n x str key                                ok: u8 all present
//   kDelete  str key                                           ok: u8 existed
// str = u32 length | bytes. A response whose code is not kOk carries str message instead.
// Hello's job is the job identity of the client (may be empty) and of the server (empty: the
// server serves any job); a Hello of version 1 has no job field (and decodes with an empty job), so
// that an old client gets the version error rather than a malformed-frame drop. timeout_ms =
// kNoTimeout waits forever. Decoders are pure and total: any input gives a value or an error, they
// never read out of bounds, and they allocate at most the (bounded) body length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport::store_protocol {

inline constexpr uint32_t kMagic = 0x54535850;  // "PXST" as little-endian bytes
inline constexpr uint32_t kVersion = 3;
using ::plexus::transport::kMaxJobIdBytes;
inline constexpr size_t kHeaderBytes = 8;
inline constexpr uint64_t kNoTimeout = ~uint64_t{0};
// The largest body: one maximal key and value plus field overhead; a Wait/Check may carry as
// many keys as fit in it.
inline constexpr size_t kMaxBodyBytes = kMaxStoreValueBytes + kMaxStoreKeyBytes + 64;
// What a server holds in keys and values unless told otherwise (PLEXUS_STORE_MAX_BYTES): a job's
// own entries (addresses, host names, per-rank records of a few KiB) are far below it.
inline constexpr uint64_t kDefaultMaxStoreBytes = uint64_t{256} << 20;

enum class Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kWait = 5,
  kCheck = 6,
  kDelete = 7,
};
const char* OpName(Op op);

enum class Code : uint8_t {
  kOk = 0,
  kTimeout = 1,  // Get/Wait: the keys did not appear in time
  kInvalid = 2,  // the request cannot be served (e.g. Add on a non-counter)
  kRefused = 3,  // Hello: the server serves another job
  kBusy = 4,     // Hello: the server is at its client limit
  kFull = 5,     // Set/Add: the value would take the store over its byte cap
};

struct Request {
  Op op = Op::kHello;
  std::vector<std::string> keys;  // one for Set/Get/Add/Delete, any number for Wait/Check
  std::string value;              // Set
  int64_t delta = 0;              // Add
  uint64_t timeout_ms = 0;        // Get/Wait
  uint32_t version = kVersion;    // Hello
  std::string job;                // Hello: the client's job identity, empty when it has none
};

struct Response {
  Op op = Op::kHello;
  Code code = Code::kOk;
  std::string value;   // Get: the value; code != kOk: the error message
  int64_t number = 0;  // Add: the new value; Hello: the server's version
  bool flag = false;   // Check: all present; Delete: existed; Hello: job is a nonce
  std::string job;     // Hello: the server's job identity, empty when it serves any job
};

// Looks at the start of `bytes`: 0 when the header is not complete yet, else the whole frame's
// size (header + body, which may not all be there yet). InvalidArgument for a bad magic or a body
// length above `max_body`, so that a reader never buffers more than max_body + kHeaderBytes.
absl::StatusOr<size_t> PeekFrame(absl::Span<const uint8_t> bytes, size_t max_body = kMaxBodyBytes);

// Decode one complete body (the frame without its header). InvalidArgument for unknown ops,
// truncated fields, trailing bytes, empty or oversized keys and values.
absl::StatusOr<Request> DecodeRequest(absl::Span<const uint8_t> body);
absl::StatusOr<Response> DecodeResponse(absl::Span<const uint8_t> body);

// Whole frames (header included), ready to send.
std::string EncodeRequest(const Request& request);
std::string EncodeResponse(const Response& response);

}  // namespace plexus::transport::store_protocol
