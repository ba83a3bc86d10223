// Placeholder until the verbs backend lands; replaced by the real implementation.
#include "backends.hpp"

namespace plexus::transport::internal {

bool VerbsAvailable(std::string* why_not) {
  if (why_not) *why_not = "verbs backend not implemented yet";
  return false;
}

absl::StatusOr<std::shared_ptr<Device>> CreateVerbsDevice(const DeviceOptions&) {
  return absl::UnimplementedError("the verbs backend is not implemented yet");
}

}  // namespace plexus::transport::internal
