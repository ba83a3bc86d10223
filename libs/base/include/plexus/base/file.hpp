// Whole-file reading and writing with errors that name the file and say what is wrong with it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::base {

// The whole content of `path`. NotFound when it does not exist, InvalidArgument when it is a
// directory or larger than `max_bytes`, PermissionDenied when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes = size_t{1} << 30);

// Writes `content` to `path` atomically (a temporary file in the same directory, then rename).
absl::Status WriteFileAtomic(const std::string& path, std::string_view content);

}  // namespace plexus::base
