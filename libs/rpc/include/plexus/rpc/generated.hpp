// Included by code protoc-gen-plexus generates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/rpc/call.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/schema.hpp"
#include "plexus/rpc/server.hpp"

namespace plexus::rpc::internal {

template <typename T>
void GetSpan(const absl::Span<const T>& s, const void** data, size_t* count) {
  *data = s.data();
  *count = s.size();
}
inline void GetString(std::string_view s, const void** data, size_t* count) {
  *data = s.data();
  *count = s.size();
}
inline std::string_view MakeString(const void* data, size_t count) {
  return std::string_view(static_cast<const char*>(data), count);
}

// The typed forms of a call, used by generated stubs.
template <typename Resp>
PendingCall<Resp> StartTyped(Channel& ch, const ServiceDesc& s, const MethodDesc& m,
                             const void* req, const CallOptions& opt) {
  return PendingCall<Resp>(ch.StartCall(s, m, req, opt, nullptr));
}
template <typename Resp>
void StartTypedCallback(Channel& ch, const ServiceDesc& s, const MethodDesc& m, const void* req,
                        const CallOptions& opt,
                        std::function<void(absl::StatusOr<Reply<Resp>>)> done) {
  ch.StartCall(s, m, req, opt, [done = std::move(done)](RawResult r) mutable {
    if (!r.ok()) {
      done(r.status());
    } else {
      done(Reply<Resp>(std::move(*r)));
    }
  });
}

}  // namespace plexus::rpc::internal

namespace plexus::rpc {
// Keeps the values a generated Builder was given, at stable addresses.
class Storage {
 public:
  template <typename T>
  const T& Keep(T value) {
    auto p = std::make_shared<T>(std::move(value));
    const T& ref = *p;
    items_.push_back(std::move(p));
    return ref;
  }

 private:
  std::vector<std::shared_ptr<void>> items_;
};
}  // namespace plexus::rpc
