#include "bootstrap/torch_store_protocol.hpp"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::transport::torch_store {
namespace {

// torch sends its integers in host order; every platform it ships on is little-endian, and so
// is every one plexus builds for.
void AppendU64(std::string* out, uint64_t v) { base::AppendLittleEndian<uint64_t>(*out, v); }

uint64_t ReadU64(const uint8_t* p) { return base::LoadLittleEndian<uint64_t>(p); }

void AppendString(std::string* out, std::string_view s) {
  AppendU64(out, s.size());
  out->append(s.data(), s.size());
}

std::string Start(Query q) { return std::string(1, static_cast<char>(q)); }

std::string EncodeKeys(Query q, absl::Span<const std::string> keys) {
  std::string out = Start(q);
  AppendU64(&out, keys.size());
  for (const std::string& k : keys) AppendString(&out, k);
  return out;
}

}  // namespace

std::string EncodeSet(std::string_view key, std::string_view value) {
  std::string out = Start(Query::kSet);
  AppendString(&out, key);
  AppendString(&out, value);
  return out;
}

std::string EncodeGet(std::string_view key) {
  std::string out = Start(Query::kGet);
  AppendString(&out, key);
  return out;
}

std::string EncodeAdd(std::string_view key, int64_t delta) {
  std::string out = Start(Query::kAdd);
  AppendString(&out, key);
  AppendU64(&out, static_cast<uint64_t>(delta));
  return out;
}

std::string EncodeCheck(absl::Span<const std::string> keys) {
  return EncodeKeys(Query::kCheck, keys);
}

std::string EncodeWait(absl::Span<const std::string> keys) {
  return EncodeKeys(Query::kWait, keys);
}

std::string EncodeDelete(std::string_view key) {
  std::string out = Start(Query::kDeleteKey);
  AppendString(&out, key);
  return out;
}

absl::StatusOr<Decoded> DecodeReply(Reply kind, absl::Span<const uint8_t> data,
                                    size_t max_value_bytes) {
  Decoded d;
  switch (kind) {
    case Reply::kByte:
      d.needed = 1;
      if (data.size() < 1) return d;
      d.byte = data[0];
      break;
    case Reply::kInt64:
      d.needed = 8;
      if (data.size() < 8) return d;
      d.value = static_cast<int64_t>(ReadU64(data.data()));
      break;
    case Reply::kBytes: {
      d.needed = 8;
      if (data.size() < 8) return d;
      const uint64_t length = ReadU64(data.data());
      if (length > max_value_bytes) {
        return absl::DataLossError(absl::StrCat("the torch store announced a value of ", length,
                                                " bytes; the limit is ", max_value_bytes));
      }
      d.needed = 8 + static_cast<size_t>(length);
      if (data.size() < d.needed) return d;
      d.bytes.assign(reinterpret_cast<const char*>(data.data()) + 8, static_cast<size_t>(length));
      break;
    }
  }
  d.complete = true;
  return d;
}

}  // namespace plexus::transport::torch_store
