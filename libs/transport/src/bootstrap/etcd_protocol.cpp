#include "bootstrap/etcd_protocol.hpp"

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace plexus::transport::etcd {
namespace {

// A header or chunk-size line longer than this is not etcd's.
constexpr size_t kMaxLineBytes = 8192;

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("malformed HTTP response from etcd: ", what));
}

std::string B64(absl::string_view bytes) { return absl::Base64Escape(bytes); }

// A 64-bit field the gateway writes as a decimal string (or, from some versions, a number);
// `fallback` when absent.
absl::StatusOr<int64_t> Int64Field(const Json& j, const char* name, int64_t fallback) {
  auto it = j.find(name);
  if (it == j.end()) return fallback;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t v = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &v)) return v;
  return absl::DataLossError(
      absl::StrCat("etcd's answer has a field '", name, "' that is not an integer: ", it->dump()));
}

}  // namespace

std::string EncodePost(absl::string_view host, absl::string_view path, absl::string_view body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", host,
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nConnection: keep-alive\r\n\r\n", body);
}

absl::StatusOr<size_t> ResponseParser::Feed(absl::string_view data) {
  size_t used = 0;
  while (used < data.size() && state_ != State::kDone) {
    if (state_ == State::kBody || state_ == State::kChunkData) {
      const size_t n = std::min(remaining_, data.size() - used);
      body_.append(data.data() + used, n);
      used += n;
      remaining_ -= n;
      if (remaining_ == 0) state_ = state_ == State::kBody ? State::kDone : State::kChunkEnd;
      continue;
    }
    // Line-oriented states: collect up to "\n".
    const size_t end = data.find('\n', used);
    const size_t take = (end == absl::string_view::npos ? data.size() : end) - used;
    if (line_.size() + take > kMaxLineBytes) return Malformed("a header line over 8 KiB");
    line_.append(data.data() + used, take);
    used += take;
    if (end == absl::string_view::npos) break;
    ++used;  // the '\n'
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    std::string line = std::move(line_);
    line_.clear();
    if (absl::Status s = Line(line); !s.ok()) return s;
  }
  return used;
}

absl::Status ResponseParser::Line(absl::string_view line) {
  switch (state_) {
    case State::kStatusLine: {
      // "HTTP/1.1 200 OK"
      if (!absl::StartsWith(line, "HTTP/1.") || line.size() < 12 || line[8] != ' ') {
        return Malformed(absl::StrCat("status line '", line.substr(0, 80), "'"));
      }
      if (!absl::SimpleAtoi(line.substr(9, 3), &status_) || status_ < 100 || status_ > 599) {
        return Malformed(absl::StrCat("status line '", line.substr(0, 80), "'"));
      }
      state_ = State::kHeaders;
      return absl::OkStatus();
    }
    case State::kHeaders: {
      if (line.empty()) {
        if (status_ < 200) {  // an interim response (100 Continue): the real one follows
          state_ = State::kStatusLine;
          content_length_.reset();
          chunked_ = false;
          return absl::OkStatus();
        }
        if (chunked_) {
          state_ = State::kChunkSize;
        } else if (content_length_.has_value()) {
          remaining_ = *content_length_;
          state_ = remaining_ == 0 ? State::kDone : State::kBody;
        } else {
          return Malformed("neither Content-Length nor chunked transfer encoding");
        }
        return absl::OkStatus();
      }
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos) {
        return Malformed(absl::StrCat("header line '", line.substr(0, 80), "'"));
      }
      const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
      const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      if (name == "content-length") {
        size_t n = 0;
        if (!absl::SimpleAtoi(value, &n)) return Malformed("Content-Length is not a number");
        if (n > kMaxResponseBytes) {
          return Malformed(
              absl::StrCat("a body of ", n, " bytes (at most ", kMaxResponseBytes, " accepted)"));
        }
        content_length_ = n;
      } else if (name == "transfer-encoding") {
        chunked_ = absl::StrContains(absl::AsciiStrToLower(value), "chunked");
      }
      return absl::OkStatus();
    }
    case State::kChunkSize: {
      const absl::string_view size_text = line.substr(0, line.find(';'));
      uint64_t n = 0;
      if (size_text.empty() || size_text.size() > 15 ||
          !absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &n)) {
        return Malformed(absl::StrCat("chunk size '", line.substr(0, 40), "'"));
      }
      if (body_.size() + n > kMaxResponseBytes) {
        return Malformed(absl::StrCat("a chunked body over ", kMaxResponseBytes, " bytes"));
      }
      remaining_ = static_cast<size_t>(n);
      state_ = n == 0 ? State::kTrailer : State::kChunkData;
      return absl::OkStatus();
    }
    case State::kChunkEnd:
      if (!line.empty()) return Malformed("a chunk not followed by CRLF");
      state_ = State::kChunkSize;
      return absl::OkStatus();
    case State::kTrailer:
      if (line.empty()) state_ = State::kDone;
      return absl::OkStatus();
    case State::kBody:
    case State::kChunkData:
    case State::kDone:
      break;
  }
  return absl::InternalError("etcd response parser: a line in a body state");
}

std::string RangeBody(absl::string_view key) { return Json{{"key", B64(key)}}.dump(); }

std::string PutBody(absl::string_view key, absl::string_view value, int64_t lease) {
  Json j{{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j.dump();
}

std::string DeleteBody(absl::string_view key) { return Json{{"key", B64(key)}}.dump(); }

std::string PutIfRevisionBody(absl::string_view key, absl::string_view value,
                              int64_t mod_revision) {
  // Absent keys have create_revision 0; present ones are compared on their last modification.
  Json compare;
  compare["key"] = B64(key);
  compare["result"] = "EQUAL";
  if (mod_revision == 0) {
    compare["target"] = "CREATE";
    compare["create_revision"] = "0";
  } else {
    compare["target"] = "MOD";
    compare["mod_revision"] = std::to_string(mod_revision);
  }
  Json put;
  put["key"] = B64(key);
  put["value"] = B64(value);
  Json op;
  op["request_put"] = put;
  Json txn;
  txn["compare"] = Json::array();
  txn["compare"].push_back(compare);
  txn["success"] = Json::array();
  txn["success"].push_back(op);
  return txn.dump();
}

std::string LeaseGrantBody(int64_t ttl_seconds) {
  return Json{{"TTL", std::to_string(ttl_seconds)}}.dump();
}

std::string LeaseIdBody(int64_t lease) { return Json{{"ID", std::to_string(lease)}}.dump(); }

absl::StatusOr<Json> ParseBody(const std::string& body, int http_status, absl::string_view what) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat("etcd answered ", what, " with HTTP ", http_status,
                                            " and a body that is not a JSON object: '",
                                            body.substr(0, 120), "'"));
  }
  // Errors come as {"error": "...", "code": N, "message": "..."} (a streaming call wraps them
  // in "error": {...}).
  const Json* err = nullptr;
  if (auto it = j.find("error"); it != j.end()) err = &*it;
  if (http_status != 200 || err != nullptr) {
    std::string message;
    if (auto m = j.find("message"); m != j.end() && m->is_string()) {
      message = m->get<std::string>();
    } else if (err != nullptr && err->is_string()) {
      message = err->get<std::string>();
    } else if (err != nullptr && err->is_object() && err->contains("message") &&
               (*err)["message"].is_string()) {
      message = (*err)["message"].get<std::string>();
    } else {
      message = body.substr(0, 200);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("etcd refused ", what, " (HTTP ", http_status, "): ", message));
  }
  return j;
}

absl::StatusOr<std::optional<KeyValue>> ParseRange(const Json& response) {
  auto kvs = response.find("kvs");
  if (kvs == response.end() || (kvs->is_array() && kvs->empty())) return std::nullopt;
  if (!kvs->is_array() || !(*kvs)[0].is_object()) {
    return absl::DataLossError("etcd's range answer has a 'kvs' that is not a list of objects");
  }
  const Json& kv = (*kvs)[0];
  KeyValue out;
  if (auto v = kv.find("value"); v != kv.end()) {
    if (!v->is_string() || !absl::Base64Unescape(v->get<std::string>(), &out.value)) {
      return absl::DataLossError("etcd's range answer has a value that is not base64");
    }
  }
  auto rev = Int64Field(kv, "mod_revision", 0);
  if (!rev.ok()) return rev.status();
  out.mod_revision = *rev;
  return out;
}

absl::StatusOr<bool> ParseTxnSucceeded(const Json& response) {
  auto it = response.find("succeeded");
  if (it == response.end()) return false;  // proto3 leaves false fields out
  if (!it->is_boolean()) {
    return absl::DataLossError("etcd's transaction answer has a 'succeeded' that is not a bool");
  }
  return it->get<bool>();
}

absl::StatusOr<int64_t> ParseDeleted(const Json& response) {
  return Int64Field(response, "deleted", 0);
}

absl::StatusOr<Lease> ParseLease(const Json& response) {
  const Json* j = &response;
  if (auto r = response.find("result"); r != response.end() && r->is_object()) j = &*r;
  Lease out;
  auto id = Int64Field(*j, "ID", 0);
  if (!id.ok()) return id.status();
  auto ttl = Int64Field(*j, "TTL", 0);
  if (!ttl.ok()) return ttl.status();
  out.id = *id;
  out.ttl = *ttl;
  if (out.id == 0) return absl::DataLossError("etcd's lease answer names no lease ID");
  return out;
}

}  // namespace plexus::transport::etcd
