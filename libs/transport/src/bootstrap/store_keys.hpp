// Key validation shared by the store implementations.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport::bootstrap {

inline absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store keys must not be empty");
  if (key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key '", std::string(key.substr(0, 64)),
                                                   "...' has ", key.size(), " bytes; the limit is ",
                                                   kMaxStoreKeyBytes));
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::bootstrap
