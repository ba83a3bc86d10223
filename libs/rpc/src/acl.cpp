#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/base/status.hpp"
#include "plexus/rpc/policies.hpp"

namespace plexus::rpc {

// A rule as a call checks it. What the check of a top-level string or bytes rule reads comes first
// and shares a cache line with the first denied value: the field, the kind of lookup, the values.
struct AclPolicy::Compiled {
  // The rule's field when it is a singular string or bytes field of the request itself (no
  // presence, no nested message to walk): the check is one view and a comparison. Else null.
  const FieldDesc* top_view = nullptr;
  bool hashed = false;  // a string or bytes rule with more values than `few` holds: `deny`
  // A string or bytes field's denied values while there are few: compared one by one, cheaper
  // than hashing per call.
  absl::InlinedVector<std::string, 2> few;
  absl::InlinedVector<const FieldDesc*, 2> path;
  // A scalar or enum field's denied values as 64-bit keys (ScalarKey), sorted: compared as
  // numbers, no text made per call.
  absl::InlinedVector<uint64_t, 2> keys;
  absl::flat_hash_set<std::string> deny;  // canonical text (see Canonical)
  std::string rule;
  std::string method;  // "package.Service/Method"
  std::string field;   // the path as given
  bool Denies(std::string_view v) const {
    if (hashed) [[unlikely]]
      return DeniesHashed(v);
    for (const std::string& d : few) {
      if (d == v) return true;
    }
    return false;
  }
  // Out of line: the hash's code would make Denies a call with a frame for every rule.
  [[gnu::noinline]] bool DeniesHashed(std::string_view v) const {
    return deny.contains(absl::string_view(v.data(), v.size()));
  }
  bool DeniesKey(uint64_t k) const {
    if (keys.size() > 4) return std::binary_search(keys.begin(), keys.end(), k);
    for (uint64_t d : keys) {
      if (d == k) return true;
    }
    return false;
  }
};

AclPolicy::AclPolicy(std::string name) : name_(std::move(name)) {}
AclPolicy::~AclPolicy() = default;

namespace {

bool Supported(const FieldDesc& f) { return f.kind != FieldKind::kMessage; }

// The text a value of field `f` compares as; false when `in` does not parse as that type.
bool Canonical(const FieldDesc& f, std::string_view text, std::string* out) {
  // Debian's Abseil has its own string_view.
  const absl::string_view in(text.data(), text.size());
  switch (f.kind) {
    case FieldKind::kString:
    case FieldKind::kBytes:
      *out = std::string(text);
      return true;
    case FieldKind::kBool:
      if (text != "true" && text != "false") return false;
      *out = std::string(text);
      return true;
    case FieldKind::kInt32:
    case FieldKind::kEnum: {
      int32_t v;
      if (!absl::SimpleAtoi(in, &v)) return false;
      *out = absl::StrCat(v);
      return true;
    }
    case FieldKind::kInt64: {
      int64_t v;
      if (!absl::SimpleAtoi(in, &v)) return false;
      *out = absl::StrCat(v);
      return true;
    }
    case FieldKind::kUInt32: {
      uint32_t v;
      if (!absl::SimpleAtoi(in, &v)) return false;
      *out = absl::StrCat(v);
      return true;
    }
    case FieldKind::kUInt64: {
      uint64_t v;
      if (!absl::SimpleAtoi(in, &v)) return false;
      *out = absl::StrCat(v);
      return true;
    }
    case FieldKind::kFloat:
    case FieldKind::kDouble: {
      double v;
      if (!absl::SimpleAtod(in, &v)) return false;
      *out = absl::StrCat(v);
      return true;
    }
    case FieldKind::kMessage:
      return false;
  }
  return false;
}

// A double's bits, every NaN as one (a rule denying "nan" denies them all).
uint64_t DoubleKey(double v) {
  if (std::isnan(v)) return 0x7FF8000000000000ULL;
  uint64_t k;
  std::memcpy(&k, &v, sizeof k);
  return k;
}

// The value of scalar field `f` of `msg` as a 64-bit key: integers and enums sign-extended, a
// float widened to double and its bits taken.
uint64_t ScalarKey(const FieldDesc& f, const void* msg) {
  const void* p = f.value(const_cast<void*>(msg));
  switch (f.kind) {
    case FieldKind::kBool:
      return *static_cast<const bool*>(p) ? 1 : 0;
    case FieldKind::kInt32:
    case FieldKind::kEnum:
      return static_cast<uint64_t>(int64_t{*static_cast<const int32_t*>(p)});
    case FieldKind::kUInt32:
      return *static_cast<const uint32_t*>(p);
    case FieldKind::kInt64:
      return static_cast<uint64_t>(*static_cast<const int64_t*>(p));
    case FieldKind::kUInt64:
      return *static_cast<const uint64_t*>(p);
    case FieldKind::kFloat:
      return DoubleKey(*static_cast<const float*>(p));
    case FieldKind::kDouble:
      return DoubleKey(*static_cast<const double*>(p));
    default:
      return 0;
  }
}

// The key of a denied value `text` of scalar field `f` (already checked by Canonical).
uint64_t TextKey(const FieldDesc& f, std::string_view text) {
  const absl::string_view in(text.data(), text.size());
  switch (f.kind) {
    case FieldKind::kBool:
      return text == "true" ? 1 : 0;
    case FieldKind::kInt32:
    case FieldKind::kEnum:
    case FieldKind::kInt64: {
      int64_t v = 0;
      (void)absl::SimpleAtoi(in, &v);
      return static_cast<uint64_t>(v);
    }
    case FieldKind::kUInt32:
    case FieldKind::kUInt64: {
      uint64_t v = 0;
      (void)absl::SimpleAtoi(in, &v);
      return v;
    }
    case FieldKind::kFloat: {
      double v = 0;
      (void)absl::SimpleAtod(in, &v);
      return DoubleKey(static_cast<float>(v));
    }
    case FieldKind::kDouble: {
      double v = 0;
      (void)absl::SimpleAtod(in, &v);
      return DoubleKey(v);
    }
    default:
      return 0;
  }
}

// The value of scalar field `f` of `msg` as canonical text.
std::string ScalarText(const FieldDesc& f, const void* msg) {
  const void* p = f.value(const_cast<void*>(msg));
  switch (f.kind) {
    case FieldKind::kBool:
      return *static_cast<const bool*>(p) ? "true" : "false";
    case FieldKind::kInt32:
    case FieldKind::kEnum:
      return absl::StrCat(*static_cast<const int32_t*>(p));
    case FieldKind::kUInt32:
      return absl::StrCat(*static_cast<const uint32_t*>(p));
    case FieldKind::kInt64:
      return absl::StrCat(*static_cast<const int64_t*>(p));
    case FieldKind::kUInt64:
      return absl::StrCat(*static_cast<const uint64_t*>(p));
    case FieldKind::kFloat:
      return absl::StrCat(*static_cast<const float*>(p));
    case FieldKind::kDouble:
      return absl::StrCat(*static_cast<const double*>(p));
    default:
      return "";
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<AclPolicy>> AclPolicy::Create(
    std::string name, const std::vector<const ServiceDesc*>& services, std::vector<AclRule> rules) {
  std::shared_ptr<AclPolicy> acl(new AclPolicy(name));
  for (AclRule& r : rules) {
    const std::string where = absl::StrCat("acl '", name, "': rule '", r.name, "'");
    const std::vector<std::string> parts = absl::StrSplit(r.method, '/');
    const MethodDesc* method = nullptr;
    for (const ServiceDesc* s : services) {
      if (parts.size() != 2 || parts[0] != s->full_name) continue;
      for (size_t m = 0; m < s->method_count; ++m) {
        if (parts[1] == s->methods[m].name) method = &s->methods[m];
      }
    }
    if (method == nullptr) {
      std::vector<std::string> known;
      for (const ServiceDesc* s : services) {
        for (size_t m = 0; m < s->method_count; ++m) {
          known.push_back(absl::StrCat(s->full_name, "/", s->methods[m].name));
        }
      }
      return absl::NotFoundError(absl::StrCat(where, ": no method '", r.method,
                                              "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    auto c = std::make_unique<Compiled>();
    c->rule = r.name;
    c->method = r.method;
    c->field = r.field;
    const MessageDesc* msg = method->request();
    const std::vector<std::string> names = absl::StrSplit(r.field, '.');
    for (size_t i = 0; i < names.size(); ++i) {
      const FieldDesc* found = nullptr;
      for (size_t k = 0; msg != nullptr && k < msg->field_count; ++k) {
        if (names[i] == msg->fields[k].name) found = &msg->fields[k];
      }
      if (found == nullptr) {
        return absl::NotFoundError(absl::StrCat(where, ": ", msg ? msg->full_name : "?",
                                                " has no field '", names[i], "'"));
      }
      const bool last = i + 1 == names.size();
      if (found->label == FieldLabel::kRepeated || (last && !Supported(*found)) ||
          (!last && found->kind != FieldKind::kMessage)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": field ", msg->full_name, ".", names[i],
                         last ? " is repeated or a message: the ACL compares one scalar, "
                                "enum, string or bytes value"
                              : " is not a singular message field"));
      }
      c->path.push_back(found);
      msg = found->kind == FieldKind::kMessage ? found->message() : nullptr;
    }
    for (const std::string& v : r.deny) {
      std::string canon;
      if (!Canonical(*c->path.back(), v, &canon)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": value '", v, "' is not a value of field ", r.field));
      }
      const FieldDesc& last = *c->path.back();
      if (last.kind == FieldKind::kString || last.kind == FieldKind::kBytes) {
        c->deny.insert(std::move(canon));
      } else {
        c->keys.push_back(TextKey(last, v));
      }
    }
    if (c->deny.size() <= 4) {
      c->few.assign(c->deny.begin(), c->deny.end());
    } else {
      c->hashed = true;
    }
    const FieldDesc& last = *c->path.back();
    if (c->path.size() == 1 && last.label == FieldLabel::kSingular &&
        (last.kind == FieldKind::kString || last.kind == FieldKind::kBytes)) {
      c->top_view = &last;
    }
    std::sort(c->keys.begin(), c->keys.end());
    c->keys.erase(std::unique(c->keys.begin(), c->keys.end()), c->keys.end());
    auto at =
        std::lower_bound(acl->rules_.begin(), acl->rules_.end(), method,
                         [](const MethodRules& m, const MethodDesc* d) { return m.first < d; });
    if (at == acl->rules_.end() || at->first != method) at = acl->rules_.insert(at, {method, {}});
    at->second.push_back(std::move(*c));
  }
  return acl;
}

std::string AclPolicy::DescribeJson() const {
  size_t rules = 0;
  for (const auto& [m, r] : rules_) rules += r.size();
  return absl::StrCat("{\"rules\":", rules, ",\"checked\":", checked_.Value(),
                      ",\"denied\":", denied_.load(), "}");
}

absl::StatusOr<EngineState> AclPolicy::Decompose() const {
  EngineState state(kind(), version());
  state.Put("checked", checked_.Value());
  state.Put("denied", denied_.load());
  return state;
}

absl::Status AclPolicy::Restore(const EngineState& state) {
  PLEXUS_RETURN_IF_ERROR(Policy::Restore(state));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t checked, state.Get<uint64_t>("checked"));
  PLEXUS_ASSIGN_OR_RETURN(uint64_t denied, state.Get<uint64_t>("denied"));
  checked_.Add(checked);
  denied_ += denied;
  return absl::OkStatus();
}

const std::vector<AclPolicy::Compiled>* AclPolicy::Find(const MethodDesc* method) const {
  if (rules_.size() <= 8) {
    for (const auto& [m, rules] : rules_) {
      if (m == method) return &rules;
    }
    return nullptr;
  }
  auto at = std::lower_bound(rules_.begin(), rules_.end(), method,
                             [](const MethodRules& m, const MethodDesc* d) { return m.first < d; });
  return at != rules_.end() && at->first == method ? &at->second : nullptr;
}

bool AclPolicy::ContentFields(const MethodDesc& method,
                              absl::FunctionRef<void(FieldPath)> read) const {
  if (const auto* rules = Find(&method)) {
    for (const Compiled& rule : *rules) read(rule.path);
  }
  return true;
}

namespace {

// The denial's message: made only for a denied call, out of the checking path.
[[gnu::noinline, gnu::cold]] absl::Status Denial(const std::string& acl,
                                                 const AclPolicy::Compiled& rule,
                                                 const FieldDesc& f, const void* msg) {
  std::string shown;
  if (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes) {
    const void* data = nullptr;
    size_t count = 0;
    f.get_view(msg, &data, &count);
    shown.assign(static_cast<const char*>(data), count);
  } else {
    shown = ScalarText(f, msg);
  }
  return absl::PermissionDeniedError(absl::StrCat("acl '", acl, "': rule '", rule.rule, "' denies ",
                                                  rule.method, ": field ", rule.field, " is '",
                                                  shown, "'"));
}

// The message holding the rule's field in `msg` when it holds a denied value, else null: a rule
// through nested messages, on an optional field or on a scalar (out of the path of a top-level
// string or bytes rule).
[[gnu::noinline]] const void* DeniedIn(const AclPolicy::Compiled& rule, const void* msg) {
  for (size_t i = 0; msg != nullptr && i + 1 < rule.path.size(); ++i) {
    const void* data = nullptr;
    size_t count = 0;
    rule.path[i]->get_view(msg, &data, &count);
    msg = count == 1 ? data : nullptr;
  }
  if (msg == nullptr) return nullptr;
  const FieldDesc& f = *rule.path.back();
  if (f.label == FieldLabel::kOptional && !*f.has(const_cast<void*>(msg))) return nullptr;
  if (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes) {
    const void* data = nullptr;
    size_t count = 0;
    f.get_view(msg, &data, &count);
    return rule.Denies(std::string_view(static_cast<const char*>(data), count)) ? msg : nullptr;
  }
  return rule.DeniesKey(ScalarKey(f, msg)) ? msg : nullptr;
}

}  // namespace

absl::Status AclPolicy::OnRequest(const CallInfo& call) {
  const auto* rules = Find(call.method);
  if (rules == nullptr || call.request == nullptr) return absl::OkStatus();
  checked_.Add();
  for (const Compiled& rule : *rules) {
    const void* in;
    if (rule.top_view != nullptr) {
      const void* data = nullptr;
      size_t count = 0;
      rule.top_view->get_view(call.request, &data, &count);
      if (!rule.Denies(std::string_view(static_cast<const char*>(data), count))) continue;
      in = call.request;
    } else if ((in = DeniedIn(rule, call.request)) == nullptr) {
      continue;
    }
    denied_.fetch_add(1, std::memory_order_relaxed);
    return Denial(name_, rule, *rule.path.back(), in);
  }
  return absl::OkStatus();
}

}  // namespace plexus::rpc
