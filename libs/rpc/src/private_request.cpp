#include "private_request.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::rpc::internal {

bool PrivateRequest::CopyToArena(const void* data, size_t bytes, size_t align, const char* what,
                                 void** out) {
  if (*overflow_ == nullptr) *overflow_ = std::make_unique<Arena>(limits_.max_arena_bytes);
  void* p = (*overflow_)->Allocate(bytes, align);
  if (p == nullptr) {
    error_ = absl::ResourceExhaustedError(absl::StrCat(
        "private copy of a ", desc_.full_name, " request for a content policy: field ", what,
        " exceeds the per-message limit of ", limits_.max_arena_bytes, " bytes"));
    return false;
  }
  if (bytes > 0) std::memcpy(p, data, bytes);
  *out = p;
  return true;
}

absl::Status PrivateRequest::Add(const Policy& policy, const MethodDesc& method) {
  if (all_) return absl::OkStatus();
  // From here on the scalars are the copy's: what the policies read and what is marshalled.
  if (root_ == nullptr && !Copy(request_, desc_.size, desc_.align, desc_.full_name, &root_)) {
    return std::move(error_);
  }
  bool failed = false;
  const bool named = policy.ContentFields(method, [&](FieldPath path) {
    if (!failed) failed = !AddPath(path);
  });
  if (failed) return std::move(error_);
  if (named) return absl::OkStatus();
  all_ = true;
  return AddAll(desc_, root_, 0);
}

bool PrivateRequest::AddPath(FieldPath path) {
  void* msg = root_;
  for (size_t i = 0; i < path.size(); ++i) {
    const FieldDesc& f = *path[i];
    const void* data = nullptr;
    size_t count = 0;
    if (f.kind == FieldKind::kMessage) {
      if (f.label == FieldLabel::kRepeated) {
        error_ = absl::InvalidArgumentError(absl::StrCat(
            "content field path through ", f.name, ": a repeated field (only singular messages)"));
        return false;
      }
      f.get_view(msg, &data, &count);
      if (count == 0) return true;  // absent: nothing to read
      if (std::find(private_structs_.begin(), private_structs_.end(), data) ==
          private_structs_.end()) {
        const MessageDesc& sub = *f.message();
        void* copy = nullptr;
        if (!Copy(data, sub.size, sub.align, f.name, &copy)) return false;
        f.set_view(msg, copy, 1);
        private_structs_.push_back(copy);
        data = copy;
      }
      msg = const_cast<void*>(data);
      continue;
    }
    if (i + 1 != path.size()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("content field path through ", f.name, ": not a message field"));
      return false;
    }
    // The last field. Scalars and enums are private with their struct; a string's or bytes'
    // bytes are copied (an unset optional one too: it may be set before the send).
    if (f.label == FieldLabel::kRepeated) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("content field ", f.name, ": a repeated field (name its message instead)"));
      return false;
    }
    if (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes) {
      // From the copy, not the application's struct: an earlier content policy may have checked
      // this field already, and its private bytes are what must be sent.
      f.get_view(msg, &data, &count);
      void* copy = nullptr;
      if (!Copy(data, count, 1, f.name, &copy)) return false;
      f.set_view(msg, copy, count);
    }
  }
  return true;
}

absl::Status PrivateRequest::AddAll(const MessageDesc& desc, void* msg, int depth) {
  if (depth > limits_.max_depth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message ", desc.full_name, " nests deeper than ", limits_.max_depth, " levels"));
  }
  for (size_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    const bool view = f.label == FieldLabel::kRepeated || f.kind == FieldKind::kString ||
                      f.kind == FieldKind::kBytes || f.kind == FieldKind::kMessage;
    if (!view) continue;  // private with its struct
    const void* data = nullptr;
    size_t count = 0;
    f.get_view(msg, &data, &count);
    if (f.kind == FieldKind::kMessage) {
      if (count == 0) continue;
      const MessageDesc& sub = *f.message();
      PLEXUS_ASSIGN_OR_RETURN(void* copy, CopyOr(data, sub.size * count, sub.align, f.name));
      for (size_t k = 0; k < count; ++k) {
        PLEXUS_RETURN_IF_ERROR(AddAll(sub, static_cast<char*>(copy) + k * sub.size, depth + 1));
      }
      f.set_view(msg, copy, count);
      continue;
    }
    if (f.label != FieldLabel::kRepeated) {  // a string or bytes
      PLEXUS_ASSIGN_OR_RETURN(void* copy, CopyOr(data, count, 1, f.name));
      f.set_view(msg, copy, count);
      continue;
    }
    if (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes) {
      // The array of views, then each element's bytes.
      const size_t es = f.kind == FieldKind::kString ? sizeof(std::string_view) : sizeof(Bytes);
      PLEXUS_ASSIGN_OR_RETURN(void* copy,
                              CopyOr(data, es * count, alignof(std::string_view), f.name));
      for (size_t k = 0; k < count; ++k) {
        if (f.kind == FieldKind::kString) {
          auto* sv = static_cast<std::string_view*>(copy) + k;
          PLEXUS_ASSIGN_OR_RETURN(void* bytes, CopyOr(sv->data(), sv->size(), 1, f.name));
          *sv = std::string_view(static_cast<const char*>(bytes), sv->size());
        } else {
          auto* b = static_cast<Bytes*>(copy) + k;
          PLEXUS_ASSIGN_OR_RETURN(void* bytes, CopyOr(b->data(), b->size(), 1, f.name));
          *b = Bytes(static_cast<const uint8_t*>(bytes), b->size());
        }
      }
      f.set_view(msg, copy, count);
      continue;
    }
    const size_t es = ScalarSize(f.kind);
    PLEXUS_ASSIGN_OR_RETURN(void* copy, CopyOr(data, es * count, std::max<size_t>(es, 1), f.name));
    f.set_view(msg, copy, count);
  }
  return absl::OkStatus();
}

}  // namespace plexus::rpc::internal
