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

namespace {

// Why `path` is not singular message fields then a singular or optional scalar, enum, string or
// bytes field (what a private copy holds without copying more); empty when it is.
std::string PathProblem(FieldPath path) {
  if (path.empty()) return "an empty field path";
  for (size_t i = 0; i < path.size(); ++i) {
    const FieldDesc& f = *path[i];
    const bool last = i + 1 == path.size();
    if (f.label == FieldLabel::kRepeated) {
      return absl::StrCat("field ", f.name, " is repeated");
    }
    if (!last && f.kind != FieldKind::kMessage) {
      return absl::StrCat("the path goes through ", f.name, ", not a message field");
    }
    if (last && f.kind == FieldKind::kMessage) {
      return absl::StrCat("field ", f.name, " is a message (name the fields read in it)");
    }
  }
  return "";
}

}  // namespace

const ContentPlan& ContentPlans::Make(const Policy& policy, const MethodDesc& method) {
  std::lock_guard<std::mutex> lock(mu_);
  const Table* old = table_.load(std::memory_order_relaxed);
  if (old != nullptr) {  // another call may have made it meanwhile
    for (const ContentPlan& plan : *old) {
      if (plan.method == &method) return plan;
    }
  }
  auto next = std::make_unique<Table>(old != nullptr ? *old : Table{});
  ContentPlan& plan = next->emplace_back();
  plan.method = &method;
  plan.all = !policy.ContentFields(method, [&](FieldPath path) {
    if (!plan.error.ok()) return;
    if (std::string problem = PathProblem(path); !problem.empty()) {
      plan.error = absl::InvalidArgumentError(absl::StrCat(
          "engine '", policy.name(), "' names a field of ", method.request()->full_name,
          " that a private copy cannot hold: ", problem,
          " (a path of singular messages to one scalar, enum, string or bytes field; or name no "
          "fields to have the whole request copied)"));
    }
    plan.paths.emplace_back(path.begin(), path.end());
  });
  plan.top_level = !plan.all && plan.error.ok();
  for (const auto& path : plan.paths) {
    if (path.size() != 1) {
      plan.top_level = false;
    } else if (path[0]->kind == FieldKind::kString || path[0]->kind == FieldKind::kBytes) {
      plan.top_views.push_back(path[0]);
    }
  }
  table_.store(next.get(), std::memory_order_release);
  tables_.push_back(std::move(next));
  return plan;
}

void ContentPlans::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  table_.store(nullptr, std::memory_order_relaxed);
  tables_.clear();
}

absl::Status PrivateRequest::AddAny(const ContentPlan& plan) {
  if (all_) return absl::OkStatus();
  if (!plan.error.ok()) return plan.error;
  // From here on the scalars are the copy's: what the policies read and what is marshalled.
  if (root_ == nullptr && !Copy(request_, desc_.size, desc_.align, desc_.full_name, &root_)) {
    return std::move(error_);
  }
  if (plan.all) {
    all_ = true;
    return AddAll(desc_, root_, 0);
  }
  for (const auto& path : plan.paths) {
    if (!AddPath(path)) return std::move(error_);
  }
  return absl::OkStatus();
}

bool PrivateRequest::AddPath(FieldPath path) {
  void* msg = root_;
  const void* data = nullptr;
  size_t count = 0;
  const size_t last = path.size() - 1;
  for (size_t i = 0; i < last; ++i) {  // singular messages (the plan checked)
    const FieldDesc& f = *path[i];
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
  }
  // The last field. Scalars and enums are private with their struct; a string's or bytes'
  // bytes are copied (an unset optional one too: it may be set before the send).
  const FieldDesc& f = *path[last];
  return f.kind == FieldKind::kString || f.kind == FieldKind::kBytes ? CopyView(f, msg) : true;
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
