// The JSON form of a Program (format.hpp).
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/restructure/format.hpp"

namespace plexus::restructure {
namespace {

namespace bj = base::json;
using bj::Json;

Json AccessJson(const Program& p, const Access& a) {
  return {{"buffer", p.buffers[a.buffer].name}, {"base", a.base}, {"strides", a.strides}};
}

absl::StatusOr<std::vector<int64_t>> Integers(const Json& object, const std::string& path,
                                              std::string_view key, size_t most) {
  PLEXUS_ASSIGN_OR_RETURN(const Json* list, bj::ArrayField(object, path, key, true));
  const std::string at = bj::Child(path, key);
  if (list->size() > most) {
    return bj::Invalid(at, absl::StrCat("at most ", most, " entries, got ", list->size()));
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < list->size(); ++i) {
    PLEXUS_ASSIGN_OR_RETURN(int64_t v, bj::IntegerValue((*list)[i], bj::Index(at, i)));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Access> ParseAccess(const Json& step, const std::string& path, std::string_view key,
                                   const std::map<std::string, int, std::less<>>& names) {
  PLEXUS_ASSIGN_OR_RETURN(const Json* object, bj::ObjectField(step, path, key, true));
  const std::string at = bj::Child(path, key);
  PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(*object, at, {"buffer", "base", "strides"}));
  Access a;
  PLEXUS_ASSIGN_OR_RETURN(std::string name, bj::StringField(*object, at, "buffer", true));
  auto it = names.find(name);
  if (it == names.end()) {
    return bj::Invalid(bj::Child(at, "buffer"), absl::StrCat("no buffer named '", name, "'"));
  }
  a.buffer = it->second;
  PLEXUS_ASSIGN_OR_RETURN(a.base, bj::IntegerField(*object, at, "base", false, 0));
  PLEXUS_ASSIGN_OR_RETURN(a.strides, Integers(*object, at, "strides", kMaxLevels));
  return a;
}

absl::StatusOr<Op> ParseOp(const std::string& name, const std::string& path) {
  for (int i = 0; i < kNumOps; ++i) {
    if (OpName(static_cast<Op>(i)) == name) return static_cast<Op>(i);
  }
  return bj::Invalid(path, absl::StrCat("unknown op '", name,
                                        "' (expected copy, cast, add, mul, div, pow, log10 or "
                                        "maxpool)"));
}

absl::StatusOr<Role> ParseRole(const std::string& name, const std::string& path) {
  for (Role r : {Role::kInput, Role::kOutput, Role::kScratch}) {
    if (RoleName(r) == name) return r;
  }
  return bj::Invalid(path,
                     absl::StrCat("unknown role '", name, "' (expected input, output or scratch)"));
}

}  // namespace

std::string ProgramToJson(const Program& p) {
  Json buffers = Json::array();
  for (const BufferDecl& b : p.buffers) {
    buffers.push_back({{"name", b.name},
                       {"dtype", std::string(kernels::DataTypeName(b.dtype))},
                       {"count", b.count},
                       {"role", std::string(RoleName(b.role))}});
  }
  Json steps = Json::array();
  for (const Step& s : p.steps) {
    Json step = {{"op", std::string(OpName(s.op))},
                 {"iters", s.iters},
                 {"dst", AccessJson(p, s.dst)},
                 {"src1", AccessJson(p, s.src1)}};
    if (s.src2_kind == Operand2::kBuffer) step["src2"] = AccessJson(p, s.src2);
    // The scalar's bits, so that every float (NaN payloads, -0) survives the round trip; the
    // value beside it is for readers.
    if (s.src2_kind == Operand2::kScalar) {
      uint32_t bits;
      std::memcpy(&bits, &s.scalar, 4);
      step["scalar"] = std::isfinite(s.scalar) ? Json(s.scalar) : Json(nullptr);
      step["scalar_bits"] = bits;
    }
    if (s.window_levels != 0) step["window_levels"] = s.window_levels;
    steps.push_back(step);
  }
  return Json{{"buffers", buffers}, {"steps", steps}}.dump(1);
}

absl::StatusOr<Program> ProgramFromJson(std::string_view text) {
  PLEXUS_ASSIGN_OR_RETURN(Json root, bj::ParseJsonText(text, "the program"));
  if (!root.is_object()) return bj::Invalid("program", "expected an object");
  PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(root, "", {"buffers", "steps"}));
  Program p;
  PLEXUS_ASSIGN_OR_RETURN(const Json* buffers, bj::ArrayField(root, "", "buffers", true));
  if (buffers->size() > kMaxBuffers) {
    return bj::Invalid("buffers",
                       absl::StrCat("at most ", kMaxBuffers, " buffers, got ", buffers->size()));
  }
  std::map<std::string, int, std::less<>> names;
  for (size_t i = 0; i < buffers->size(); ++i) {
    const std::string at = bj::Index("buffers", i);
    const Json& b = (*buffers)[i];
    if (!b.is_object()) return bj::Invalid(at, "expected an object");
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(b, at, {"name", "dtype", "count", "role"}));
    BufferDecl d;
    PLEXUS_ASSIGN_OR_RETURN(d.name, bj::StringField(b, at, "name", true));
    PLEXUS_ASSIGN_OR_RETURN(std::string dtype, bj::StringField(b, at, "dtype", true));
    auto parsed = kernels::ParseDataType(dtype);
    if (!parsed.ok())
      return bj::Invalid(bj::Child(at, "dtype"), std::string(parsed.status().message()));
    d.dtype = *parsed;
    PLEXUS_ASSIGN_OR_RETURN(d.count, bj::IntegerField(b, at, "count", true));
    PLEXUS_ASSIGN_OR_RETURN(std::string role, bj::StringField(b, at, "role", true));
    PLEXUS_ASSIGN_OR_RETURN(d.role, ParseRole(role, bj::Child(at, "role")));
    if (!names.emplace(d.name, static_cast<int>(i)).second) {
      return bj::Invalid(bj::Child(at, "name"), absl::StrCat("'", d.name, "' is declared twice"));
    }
    p.buffers.push_back(std::move(d));
  }
  PLEXUS_ASSIGN_OR_RETURN(const Json* steps, bj::ArrayField(root, "", "steps", true));
  if (steps->size() > kMaxSteps) {
    return bj::Invalid("steps", absl::StrCat("at most ", kMaxSteps, " steps, got ", steps->size()));
  }
  for (size_t i = 0; i < steps->size(); ++i) {
    const std::string at = bj::Index("steps", i);
    const Json& s = (*steps)[i];
    if (!s.is_object()) return bj::Invalid(at, "expected an object");
    PLEXUS_RETURN_IF_ERROR(bj::CheckKeys(
        s, at, {"op", "iters", "dst", "src1", "src2", "scalar", "scalar_bits", "window_levels"}));
    Step step;
    PLEXUS_ASSIGN_OR_RETURN(std::string op, bj::StringField(s, at, "op", true));
    PLEXUS_ASSIGN_OR_RETURN(step.op, ParseOp(op, bj::Child(at, "op")));
    PLEXUS_ASSIGN_OR_RETURN(step.iters, Integers(s, at, "iters", kMaxLevels));
    PLEXUS_ASSIGN_OR_RETURN(step.dst, ParseAccess(s, at, "dst", names));
    PLEXUS_ASSIGN_OR_RETURN(step.src1, ParseAccess(s, at, "src1", names));
    const bool buffer = s.contains("src2");
    const bool scalar = s.contains("scalar") || s.contains("scalar_bits");
    if (buffer && scalar) {
      return bj::Invalid(at, "give src2 or scalar (scalar_bits), not both");
    }
    if (buffer) {
      step.src2_kind = Operand2::kBuffer;
      PLEXUS_ASSIGN_OR_RETURN(step.src2, ParseAccess(s, at, "src2", names));
    } else if (scalar) {
      step.src2_kind = Operand2::kScalar;
      if (s.contains("scalar_bits")) {
        PLEXUS_ASSIGN_OR_RETURN(
            int64_t bits,
            bj::IntegerValue(s["scalar_bits"], bj::Child(at, "scalar_bits"), 0, 0xffffffffll));
        const uint32_t b32 = static_cast<uint32_t>(bits);
        std::memcpy(&step.scalar, &b32, 4);
      } else {
        PLEXUS_ASSIGN_OR_RETURN(double v, bj::NumberField(s, at, "scalar", true));
        step.scalar = static_cast<float>(v);
      }
    }
    PLEXUS_ASSIGN_OR_RETURN(int64_t window, bj::IntegerField(s, at, "window_levels", false, 0));
    if (window < 0 || window > kMaxLevels) {
      return bj::Invalid(bj::Child(at, "window_levels"),
                         absl::StrCat("expected 0..", kMaxLevels, ", got ", window));
    }
    step.window_levels = static_cast<int>(window);
    p.steps.push_back(std::move(step));
  }
  PLEXUS_RETURN_IF_ERROR(Validate(p));
  return p;
}

}  // namespace plexus::restructure
