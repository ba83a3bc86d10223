#include "bootstrap/store_protocol.hpp"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::store_protocol {
namespace {

// A body's fields (base::CheckedByteReader: little-endian, bounds-checked, the first failure
// sticks) plus the protocol's length-prefixed strings.
class BodyReader : public base::CheckedByteReader {
 public:
  explicit BodyReader(absl::Span<const uint8_t> bytes)
      : CheckedByteReader(bytes.data(), bytes.size()) {}

  // A length-prefixed string of at most `max` bytes; `what` names it in the error.
  bool Str(std::string* out, size_t min, size_t max, const char* what) {
    uint32_t length = 0;
    if (!U32(&length)) return false;
    if (length < min || length > max) {
      return Fail(absl::StrCat(what, " of ", length, " bytes (allowed ", min, "..", max, ")"));
    }
    if (length > remaining()) {
      return Fail(absl::StrCat(what, " of ", length, " bytes truncated (", remaining(),
                               " bytes left in the frame)"));
    }
    std::string_view bytes;
    Bytes(length, &bytes);
    out->assign(bytes);
    return true;
  }

  absl::Status Finish(const char* what) {
    if (ok() && remaining() != 0) Fail(absl::StrCat(remaining(), " unexpected trailing bytes"));
    if (ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("malformed store ", what, ": ", error()));
  }
};

bool ValidOp(uint8_t op) {
  return op >= static_cast<uint8_t>(Op::kHello) && op <= static_cast<uint8_t>(Op::kDelete);
}

bool ReadKey(BodyReader& r, std::string* key) { return r.Str(key, 1, kMaxStoreKeyBytes, "key"); }

bool ReadKeyList(BodyReader& r, std::vector<std::string>* keys) {
  uint32_t count = 0;
  if (!r.U32(&count)) return false;
  // Each key takes at least 5 bytes, so a count beyond that is a lie; checking it before
  // reserving keeps a tiny frame from asking for a huge vector.
  if (count > r.remaining() / 5) {
    return r.Fail(absl::StrCat("key count ", count, " exceeds what the ", r.remaining(),
                               " remaining bytes can hold"));
  }
  keys->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    keys->emplace_back();
    if (!ReadKey(r, &keys->back())) return false;
  }
  return true;
}

// Appends little-endian fields to a frame (base::AppendLittleEndian); the header's length is
// patched by Finish().
class FrameWriter {
 public:
  FrameWriter() {
    U32(kMagic);
    U32(0);
  }
  void U8(uint8_t v) { base::AppendLittleEndian(out_, v); }
  void U32(uint32_t v) { base::AppendLittleEndian(out_, v); }
  void U64(uint64_t v) { base::AppendLittleEndian(out_, v); }
  void I64(int64_t v) { base::AppendLittleEndian(out_, v); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string Finish() && {
    const auto body = static_cast<uint32_t>(out_.size() - kHeaderBytes);
    base::StoreLittleEndian(reinterpret_cast<uint8_t*>(out_.data()) + 4, body);
    return std::move(out_);
  }

 private:
  std::string out_;
};

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kWait:
      return "wait";
    case Op::kCheck:
      return "check";
    case Op::kDelete:
      return "delete";
  }
  return "unknown";
}

absl::StatusOr<size_t> PeekFrame(absl::Span<const uint8_t> bytes, size_t max_body) {
  if (bytes.size() < kHeaderBytes) {
    // Reject a wrong magic as early as its first bytes, so that e.g. an HTTP client is dropped
    // without waiting for more.
    uint8_t magic[4];
    base::StoreLittleEndian(magic, kMagic);
    for (size_t i = 0; i < bytes.size() && i < 4; ++i) {
      if (bytes[i] != magic[i]) {
        return absl::InvalidArgumentError(
            "malformed store frame: bad magic (not a plexus store "
            "peer, or a different protocol)");
      }
    }
    return size_t{0};
  }
  base::ByteReader header(bytes.data());
  const uint32_t magic = header.U32();
  const uint32_t body = header.U32();
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        "malformed store frame: bad magic (not a plexus store peer, or a different protocol)");
  }
  if (body > max_body) {
    return absl::InvalidArgumentError(absl::StrCat("malformed store frame: body of ", body,
                                                   " bytes exceeds the limit of ", max_body));
  }
  return kHeaderBytes + body;
}

absl::StatusOr<Request> DecodeRequest(absl::Span<const uint8_t> body) {
  BodyReader r(body);
  Request req;
  uint8_t op = 0;
  if (r.U8(&op)) {
    if (!ValidOp(op)) {
      r.Fail(absl::StrCat("unknown op ", static_cast<int>(op)));
    } else {
      req.op = static_cast<Op>(op);
      req.keys.clear();
      switch (req.op) {
        case Op::kHello:
          // Version 1 had no job field: accept its absence there, so that an old client gets
          // the server's version error instead of being dropped as malformed.
          if (r.U32(&req.version) && req.version >= 2) {
            r.Str(&req.job, 0, kMaxJobIdBytes, "job id");
          }
          break;
        case Op::kSet:
          req.keys.emplace_back();
          if (ReadKey(r, &req.keys[0])) r.Str(&req.value, 0, kMaxStoreValueBytes, "value");
          break;
        case Op::kGet:
          req.keys.emplace_back();
          if (r.U64(&req.timeout_ms)) ReadKey(r, &req.keys[0]);
          break;
        case Op::kAdd:
          req.keys.emplace_back();
          if (r.I64(&req.delta)) ReadKey(r, &req.keys[0]);
          break;
        case Op::kWait:
          if (r.U64(&req.timeout_ms)) ReadKeyList(r, &req.keys);
          break;
        case Op::kCheck:
          ReadKeyList(r, &req.keys);
          break;
        case Op::kDelete:
          req.keys.emplace_back();
          ReadKey(r, &req.keys[0]);
          break;
      }
    }
  }
  PLEXUS_RETURN_IF_ERROR(r.Finish("request"));
  return req;
}

absl::StatusOr<Response> DecodeResponse(absl::Span<const uint8_t> body) {
  BodyReader r(body);
  Response resp;
  uint8_t op = 0;
  uint8_t code = 0;
  if (r.U8(&op) && r.U8(&code)) {
    if (!ValidOp(op)) {
      r.Fail(absl::StrCat("unknown op ", static_cast<int>(op)));
    } else if (code > static_cast<uint8_t>(Code::kFull)) {
      r.Fail(absl::StrCat("unknown response code ", static_cast<int>(code)));
    } else {
      resp.op = static_cast<Op>(op);
      resp.code = static_cast<Code>(code);
      if (resp.code != Code::kOk) {
        r.Str(&resp.value, 0, kMaxBodyBytes, "error message");
      } else {
        uint8_t flag = 0;
        switch (resp.op) {
          case Op::kHello: {
            uint32_t version = 0;
            uint8_t nonce = 0;
            if (r.U32(&version) && r.Str(&resp.job, 0, kMaxJobIdBytes, "job id") && r.U8(&nonce)) {
              if (nonce > 1) r.Fail(absl::StrCat("flag ", static_cast<int>(nonce), " is not 0/1"));
              resp.number = version;
              resp.flag = nonce == 1;
            }
            break;
          }
          case Op::kSet:
          case Op::kWait:
            break;
          case Op::kGet:
            r.Str(&resp.value, 0, kMaxStoreValueBytes, "value");
            break;
          case Op::kAdd:
            r.I64(&resp.number);
            break;
          case Op::kCheck:
          case Op::kDelete:
            if (r.U8(&flag)) {
              if (flag > 1) r.Fail(absl::StrCat("flag ", static_cast<int>(flag), " is not 0/1"));
              resp.flag = flag == 1;
            }
            break;
        }
      }
    }
  }
  PLEXUS_RETURN_IF_ERROR(r.Finish("response"));
  return resp;
}

std::string EncodeRequest(const Request& request) {
  FrameWriter w;
  w.U8(static_cast<uint8_t>(request.op));
  const std::string empty;
  const std::string& key = request.keys.empty() ? empty : request.keys[0];
  switch (request.op) {
    case Op::kHello:
      w.U32(request.version);
      if (request.version >= 2) w.Str(request.job);  // version 1 had no job field
      break;
    case Op::kSet:
      w.Str(key);
      w.Str(request.value);
      break;
    case Op::kGet:
      w.U64(request.timeout_ms);
      w.Str(key);
      break;
    case Op::kAdd:
      w.I64(request.delta);
      w.Str(key);
      break;
    case Op::kWait:
    case Op::kCheck:
      if (request.op == Op::kWait) w.U64(request.timeout_ms);
      w.U32(static_cast<uint32_t>(request.keys.size()));
      for (const std::string& k : request.keys) w.Str(k);
      break;
    case Op::kDelete:
      w.Str(key);
      break;
  }
  return std::move(w).Finish();
}

std::string EncodeResponse(const Response& response) {
  FrameWriter w;
  w.U8(static_cast<uint8_t>(response.op));
  w.U8(static_cast<uint8_t>(response.code));
  if (response.code != Code::kOk) {
    w.Str(response.value);
    return std::move(w).Finish();
  }
  switch (response.op) {
    case Op::kHello:
      w.U32(static_cast<uint32_t>(response.number));
      w.Str(response.job);
      w.U8(response.flag ? 1 : 0);
      break;
    case Op::kSet:
    case Op::kWait:
      break;
    case Op::kGet:
      w.Str(response.value);
      break;
    case Op::kAdd:
      w.I64(response.number);
      break;
    case Op::kCheck:
    case Op::kDelete:
      w.U8(response.flag ? 1 : 0);
      break;
  }
  return std::move(w).Finish();
}

}  // namespace plexus::transport::store_protocol
