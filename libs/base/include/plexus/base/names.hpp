// Names of enumerators for logs, tables and command lines: one table of names per enum, looked up
// in both directions, with one error text for every unknown name.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace plexus::base {

// names[index], or "invalid" for an index past the table.
template <size_t N>
std::string_view NameAt(size_t index, const std::string_view (&names)[N]) {
  return index < N ? names[index] : std::string_view("invalid");
}

// The enumerator whose name (case-insensitive) is `name`, assuming enumerator i is named
// names[i]; InvalidArgument naming `what` and listing the valid names otherwise.
template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseName(std::string_view name, const std::string_view (&names)[N],
                               std::string_view what) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  for (size_t i = 0; i < N; ++i) {
    if (lower == names[i]) return static_cast<Enum>(i);
  }
  std::string valid;
  for (size_t i = 0; i < N; ++i) absl::StrAppend(&valid, i ? ", " : "", std::string(names[i]));
  return absl::InvalidArgumentError(absl::StrCat("unknown ", std::string(what), " '",
                                                 std::string(name), "' (valid: ", valid, ")"));
}

}  // namespace plexus::base
