// What protoc-gen-plexus generates code against: the zero-copy field types of generated messages
// and the descriptor tables that the one table-driven codec (src/codec.cpp) walks.
//
// A generated message is a trivially destructible struct: scalars and enums inline, strings,
// bytes and repeated fields as (pointer, length) views, singular message fields as pointers
// (null = absent). A message never owns the memory its views point to: the sender keeps it alive
// until the call completes; a received message is rebuilt in place in its receive buffer, which
// the Reply (client) or ServerCall (server) holding it owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/types/span.h"

namespace plexus::rpc {

using Bytes = absl::Span<const uint8_t>;
template <typename T>
using Repeated = absl::Span<const T>;

// A proto3 `optional` scalar or string: the value and whether it is set.
template <typename T>
struct Optional {
  T value{};
  bool has = false;

  Optional& operator=(const T& v) {
    value = v;
    has = true;
    return *this;
  }
  explicit operator bool() const { return has; }
  const T& operator*() const { return value; }
  void reset() { *this = Optional(); }
};

inline Bytes AsBytes(std::string_view s) {
  return Bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

enum class FieldKind : uint8_t {
  kBool,
  kInt32,   // int32, sint32, sfixed32
  kUInt32,  // uint32, fixed32
  kInt64,   // int64, sint64, sfixed64
  kUInt64,  // uint64, fixed64
  kFloat,
  kDouble,
  kEnum,  // int32 on the wire, checked against the enum's values
  kString,
  kBytes,
  kMessage,
};
enum class FieldLabel : uint8_t { kSingular, kOptional, kRepeated };

struct EnumDesc {
  const char* full_name;
  const int32_t* values;  // every declared value, ascending
  size_t value_count;
};

struct MessageDesc;

// One field. The accessors are generated (captureless lambdas), so that the codec needs no
// knowledge of the struct's layout.
struct FieldDesc {
  const char* name;
  uint32_t number;
  FieldKind kind;
  FieldLabel label;
  const MessageDesc* (*message)();   // kMessage
  const EnumDesc* (*enumeration)();  // kEnum
  // Singular/optional scalars and enums: the address of the value.
  void* (*value)(void* msg);
  // Optional: the presence flag.
  bool* (*has)(void* msg);
  // Strings, bytes, repeated fields, message fields: the view as (data, count); count is bytes for
  // strings and bytes, elements for repeated fields, 0 or 1 for a singular message pointer.
  void (*get_view)(const void* msg, const void** data, size_t* count);
  void (*set_view)(void* msg, const void* data, size_t count);
};

struct MessageDesc {
  const char* full_name;
  size_t size;
  size_t align;
  void (*construct)(void* at);  // placement-new of a default instance
  const FieldDesc* fields;
  size_t field_count;
};

struct MethodDesc {
  const char* name;
  uint32_t id;  // index in the service
  const MessageDesc* (*request)();
  const MessageDesc* (*response)();
  // The .proto says running it twice is harmless (`option idempotency_level = IDEMPOTENT` or
  // NO_SIDE_EFFECTS): a Channel retries it on Unavailable after a reconnect, within its deadline
  // (ChannelOptions::retry_idempotent).
  bool idempotent = false;
};

struct ServiceDesc {
  const char* full_name;  // "package.Service"
  uint32_t id;            // FNV-1a of full_name, folded to 32 bits
  uint64_t schema_hash;   // over the service, its methods and every message/enum they reach
  const MethodDesc* methods;
  size_t method_count;
};

}  // namespace plexus::rpc
