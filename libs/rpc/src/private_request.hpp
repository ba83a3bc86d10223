// The private copy of a request that a Channel's content policies check (docs/rpc_engines.md,
// "Content ACL"): a shallow copy of the request struct, made when the first content policy is
// reached, into which the fields those policies read are copied (a string's or bytes' bytes, the
// nested structs on the way). Scalars are private as soon as the struct is copied. The channel
// marshals the copy once the chain passed, so the bytes checked are the bytes sent, whatever the
// application does to its own memory meanwhile; the fields no policy reads are still gathered from
// the application's memory (no copy), as without a content policy.
#pragma once

#include <cstring>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec.hpp"
#include "plexus/rpc/policy.hpp"

namespace plexus::rpc::internal {

class PrivateRequest {
 public:
  // `request` is the application's message of type `desc`. Copies go to `first` while it has
  // room, then to `*overflow` (an arena of limits.max_arena_bytes, made on first need); both must
  // outlive the send.
  PrivateRequest(const MessageDesc& desc, const void* request, absl::Span<unsigned char> first,
                 std::unique_ptr<Arena>* overflow, const CodecLimits& limits)
      : desc_(desc), request_(request), first_(first), overflow_(overflow), limits_(limits) {}
  // Makes the fields `policy` reads for `method` private (all of them when it does not name
  // them). ResourceExhausted when the copy exceeds the arena's limit.
  absl::Status Add(const Policy& policy, const MethodDesc& method);
  // The copy once a field was added (policies read it, the channel marshals it), else the
  // application's request.
  const void* message() const { return root_ != nullptr ? root_ : request_; }

 private:
  // AddPath and Copy return false with the reason in error_: the common path builds no Status.
  bool AddPath(FieldPath path);
  // Copies every view of `msg` (of type `desc`, already private itself), recursively.
  absl::Status AddAll(const MessageDesc& desc, void* msg, int depth);
  // `bytes` copied into memory of the call (false, an error naming `what`, past the arena's
  // limit). The first bytes go to the call's inline buffer (a power-of-two `align`), with no call.
  bool Copy(const void* data, size_t bytes, size_t align, const char* what, void** out) {
    const size_t at = (first_used_ + align - 1) & ~(align - 1);
    if (at + bytes > first_.size()) return CopyToArena(data, bytes, align, what, out);
    unsigned char* p = first_.data() + at;
    first_used_ = at + bytes;
    if (bytes > 0) std::memcpy(p, data, bytes);
    *out = p;
    return true;
  }
  bool CopyToArena(const void* data, size_t bytes, size_t align, const char* what, void** out);
  // Copy for the recursive AddAll.
  absl::StatusOr<void*> CopyOr(const void* data, size_t bytes, size_t align, const char* what) {
    void* p = nullptr;
    if (!Copy(data, bytes, align, what, &p)) return std::move(error_);
    return p;
  }

  const MessageDesc& desc_;
  const void* request_;
  absl::Span<unsigned char> first_;
  size_t first_used_ = 0;
  std::unique_ptr<Arena>* overflow_;
  const CodecLimits& limits_;
  void* root_ = nullptr;
  bool all_ = false;
  absl::Status error_;
  // Nested structs already copied (reached again by another path: not copied twice).
  absl::InlinedVector<const void*, 4> private_structs_;
};

}  // namespace plexus::rpc::internal
