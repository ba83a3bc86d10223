// Placeholder until the tcp backend lands; replaced by the real implementation.
#include "backends.hpp"

namespace plexus::transport::internal {

absl::StatusOr<std::shared_ptr<Device>> CreateTcpDevice(const DeviceOptions&) {
  return absl::UnimplementedError("the tcp backend is not implemented yet");
}

}  // namespace plexus::transport::internal
