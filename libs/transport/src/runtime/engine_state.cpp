#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/transport/runtime.hpp"

namespace plexus::transport {
namespace {

std::string Demangle(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(type.name());
}

}  // namespace

std::vector<std::string> EngineState::Keys() const {
  std::vector<std::string> keys;
  keys.reserve(fields_.size());
  for (const auto& [key, field] : fields_) keys.push_back(key);
  return keys;
}

absl::Status EngineState::FieldError(std::string_view key, const std::type_info& wanted) const {
  const std::string key_str(key);
  auto it = fields_.find(key);
  if (it == fields_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "engine state '", kind_, "' v", version_, " has no field '", key_str, "' (fields: [",
        absl::StrJoin(Keys(), ", "), "]); was it written by another engine kind?"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("field '", key_str, "' of engine state '", kind_, "' v", version_, " holds ",
                   Demangle(*it->second.type), ", not the requested ", Demangle(wanted)));
}

}  // namespace plexus::transport
