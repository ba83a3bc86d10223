// Small POSIX socket helpers shared by the tcp backend.
#pragma once

#include <netinet/in.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::transport::internal::tcp {

// Parses "host:port" (IPv4 literal or resolvable name; port 0 allowed).
absl::StatusOr<sockaddr_in> ResolveAddress(std::string_view address);
std::string FormatAddress(const sockaddr_in& addr);
// errno as an actionable status, prefixed by what was being done.
absl::Status ErrnoStatus(int err, std::string_view what);
absl::Status SetNonBlocking(int fd, bool on);
// Writes / reads exactly n bytes on a blocking-or-not fd, polling until `deadline`.
absl::Status WriteFully(int fd, const void* data, size_t n, absl::Time deadline);
absl::Status ReadFully(int fd, void* data, size_t n, absl::Time deadline);

}  // namespace plexus::transport::internal::tcp
