// MultipathDevice's bytes from the network: the composite address and the set-up messages on the
// control connection (base::Records). Pure parsing (no I/O), so it is fuzzed directly
// (tests/fuzz).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/multipath/device.hpp"

namespace plexus::multipath::internal {

// The largest set-up message either side accepts.
inline constexpr size_t kSetupMessageBytes = 4096;

// "mp:IP0:PORT,IP1,..." (IPv6: "mp:[IP0]:PORT,IP1,...", IP1... with or without brackets;
// hosts come back without them): InvalidArgument naming the entry and what is wrong with it.
absl::StatusOr<MultipathDevice::Address> ParseCompositeAddress(std::string_view address);

// MultipathDeviceOptions::path_options against local_addresses and the backend (path_options.cpp):
// InvalidArgument naming the entry and the field.
absl::Status ValidatePathOptions(const MultipathDeviceOptions& options);

// The connector's request: how many paths it has.
std::string EncodeSetupRequest(int paths);
// The number of paths; InvalidArgument for anything else.
absl::StatusOr<int> ParseSetupRequest(std::string_view text);

// The listener's answer: the address ("IP:PORT", "[IPv6]:PORT") of each path's listener, or a
// refusal.
std::string EncodeSetupAccept(const std::vector<std::string>& addresses);
std::string EncodeSetupRefusal(std::string_view why);
struct SetupReply {
  bool refused = false;
  std::string why;                     // refused: the listener's reason
  std::vector<std::string> addresses;  // accepted: path k's listener
};
// Checks an acceptance against the `hosts` of the composite address (one address per host, in
// order, on that host); DataLoss naming what is malformed.
absl::StatusOr<SetupReply> ParseSetupReply(std::string_view text,
                                           const std::vector<std::string>& hosts);

// Each side's verdict once it has tried to bring every path up: ready, or why not. Both sides
// send theirs and return only the outcome both agree on (set-up succeeds on both or on neither).
std::string EncodeSetupReady();
std::string EncodeSetupFailed(std::string_view why);
struct SetupVerdict {
  bool ready = false;
  std::string why;  // not ready: the sender's reason
};
// DataLoss naming what is malformed.
absl::StatusOr<SetupVerdict> ParseSetupVerdict(std::string_view text);

}  // namespace plexus::multipath::internal
