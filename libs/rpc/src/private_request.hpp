// The private copy of a request that a Channel's content policies check (docs/rpc_engines.md,
// "Content ACL"): a shallow copy of the request struct, made when the first content policy is
// reached, into which the fields those policies read are copied (a string's or bytes' bytes, the
// nested structs on the way). Scalars are private as soon as the struct is copied. The channel
// marshals the copy once the chain passed, so the bytes checked are the bytes sent, whatever the
// application does to its own memory meanwhile; the fields no policy reads are still gathered from
// the application's memory (no copy), as without a content policy.
#pragma once

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec.hpp"
#include "plexus/rpc/policy.hpp"

namespace plexus::rpc::internal {

// What a content policy reads in requests of one method: the answer of its ContentFields, with
// every path checked once, not per call.
struct ContentPlan {
  const MethodDesc* method = nullptr;
  bool all = false;  // the policy names no fields: the whole request is made private
  // Each named field's path: singular message fields, then a singular or optional scalar, enum,
  // string or bytes field.
  std::vector<absl::InlinedVector<const FieldDesc*, 2>> paths;
  absl::Status error;  // a named path of another shape: every call of the method fails with it
  // Every path is one field of the request itself (no error, not `all`): then only the string
  // and bytes ones among them need their bytes copied, the rest being private with the struct.
  bool top_level = false;
  absl::InlinedVector<const FieldDesc*, 2> top_views;
};

// One engine slot's plans, made on a method's first call. Calls read them inside the slot's gate
// without a lock; Clear runs with the gate closed (the policy was swapped or configured).
class ContentPlans {
 public:
  ContentPlans() = default;
  ContentPlans(const ContentPlans&) = delete;
  ContentPlans& operator=(const ContentPlans&) = delete;
  const ContentPlan& For(const Policy& policy, const MethodDesc& method) {
    if (const Table* t = table_.load(std::memory_order_acquire)) {
      for (const ContentPlan& plan : *t) {
        if (plan.method == &method) return plan;
      }
    }
    return Make(policy, method);
  }
  void Clear();

 private:
  using Table = std::vector<ContentPlan>;
  const ContentPlan& Make(const Policy& policy, const MethodDesc& method);
  // The newest table, read without a lock. A new method publishes a larger copy; the older tables
  // stay until Clear, since calls may still hold their plans (a table per method of the
  // channel's services at most).
  std::atomic<const Table*> table_{nullptr};
  std::mutex mu_;
  std::vector<std::unique_ptr<const Table>> tables_;
};

class PrivateRequest {
 public:
  // `request` is the application's message of type `desc`. Copies go to `first` while it has
  // room, then to `*overflow` (an arena of limits.max_arena_bytes, made on first need); both must
  // outlive the send.
  PrivateRequest(const MessageDesc& desc, const void* request, absl::Span<unsigned char> first,
                 std::unique_ptr<Arena>* overflow, const CodecLimits& limits)
      : desc_(desc), request_(request), first_(first), overflow_(overflow), limits_(limits) {}
  // Makes the fields of `plan` private (all of them when it names none). ResourceExhausted when
  // the copy exceeds the arena's limit; the plan's own error when it has one.
  absl::Status Add(const ContentPlan& plan) {
    if (!plan.top_level || all_) return AddAny(plan);
    if (root_ == nullptr && !Copy(request_, desc_.size, desc_.align, desc_.full_name, &root_)) {
      return std::move(error_);
    }
    for (const FieldDesc* f : plan.top_views) {
      if (!CopyView(*f, root_)) return std::move(error_);
    }
    return absl::OkStatus();
  }
  // The copy once a field was added (policies read it, the channel marshals it), else the
  // application's request.
  const void* message() const { return root_ != nullptr ? root_ : request_; }

 private:
  absl::Status AddAny(const ContentPlan& plan);
  // AddPath (a path checked by its plan), CopyView and Copy return false with the reason in
  // error_: the common path builds no Status.
  bool AddPath(FieldPath path);
  // The bytes of string or bytes field `f` of private struct `msg`, copied. From the copy, not
  // the application's struct: an earlier content policy may have checked this field already, and
  // its private bytes are what must be sent.
  bool CopyView(const FieldDesc& f, void* msg) {
    const void* data = nullptr;
    size_t count = 0;
    f.get_view(msg, &data, &count);
    void* copy = nullptr;
    if (!Copy(data, count, 1, f.name, &copy)) return false;
    f.set_view(msg, copy, count);
    return true;
  }
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
