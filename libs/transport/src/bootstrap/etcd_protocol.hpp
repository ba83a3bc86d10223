// What EtcdStore says to etcd and reads back, without sockets (fuzzed: tests/fuzz): HTTP/1.1
// requests to etcd's v3 JSON gateway (POST /v3/kv/range, /v3/kv/txn, /v3/lease/grant, ...; keys
// and values base64 in JSON, 64-bit numbers as decimal strings), the responses' framing
// (Content-Length or chunked) and the few response fields the store reads. The gateway ships
// with etcd 3.4 and later on the client port; nothing else is needed on the machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace plexus::transport::etcd {

using Json = nlohmann::json;

// The largest response body accepted: a range of one key of kMaxStoreValueBytes in base64 and
// its JSON around it. More is a confused or hostile peer (DataLoss, nothing allocated for it).
inline constexpr size_t kMaxResponseBytes = size_t{96} << 20;

// "POST <path> HTTP/1.1" with `body` (JSON), keeping the connection open.
std::string EncodePost(absl::string_view host, absl::string_view path, absl::string_view body);

// Reads one HTTP/1.1 response from bytes as they arrive.
class ResponseParser {
 public:
  // Consumes `data`; the count of bytes used (the rest belongs to no request: the store never
  // pipelines, so it is an error for the caller). DataLoss naming what is malformed.
  absl::StatusOr<size_t> Feed(absl::string_view data);
  bool done() const { return state_ == State::kDone; }
  int status() const { return status_; }
  const std::string& body() const { return body_; }

 private:
  enum class State {
    kStatusLine,
    kHeaders,
    kBody,
    kChunkSize,
    kChunkData,
    kChunkEnd,
    kTrailer,
    kDone
  };
  absl::Status Line(absl::string_view line);
  State state_ = State::kStatusLine;
  std::string line_;  // a header or chunk-size line being collected
  int status_ = 0;
  std::optional<size_t> content_length_;
  bool chunked_ = false;
  size_t remaining_ = 0;  // of the body (Content-Length) or of the chunk being read
  std::string body_;
};

// Request bodies. Keys and values go base64 encoded; `lease` 0 is none.
std::string RangeBody(absl::string_view key);
std::string PutBody(absl::string_view key, absl::string_view value, int64_t lease);
std::string DeleteBody(absl::string_view key);
// A transaction that puts `value` at `key` if its modification revision is still `mod_revision`
// (0: if the key does not exist), else changes nothing.
std::string PutIfRevisionBody(absl::string_view key, absl::string_view value, int64_t mod_revision);
std::string LeaseGrantBody(int64_t ttl_seconds);
std::string LeaseIdBody(int64_t lease);  // keepalive, revoke

// A response body as JSON, or the error etcd reported in it ({"error": ..., "code": ...}), with
// `what` (the request) in the message.
absl::StatusOr<Json> ParseBody(const std::string& body, int http_status, absl::string_view what);

// A range of one key: its value and modification revision, or nullopt when absent.
struct KeyValue {
  std::string value;
  int64_t mod_revision = 0;
};
absl::StatusOr<std::optional<KeyValue>> ParseRange(const Json& response);
// A transaction's "succeeded".
absl::StatusOr<bool> ParseTxnSucceeded(const Json& response);
// A deleterange's "deleted" count.
absl::StatusOr<int64_t> ParseDeleted(const Json& response);
// A lease grant's or keepalive's ID and TTL (keepalive wraps them in "result"); a TTL of 0 or
// less means the lease is gone.
struct Lease {
  int64_t id = 0;
  int64_t ttl = 0;
};
absl::StatusOr<Lease> ParseLease(const Json& response);

}  // namespace plexus::transport::etcd
