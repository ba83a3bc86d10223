// Placeholder until the shm backend lands; replaced by the real implementation.
#include "backends.hpp"

namespace plexus::transport::internal {

absl::StatusOr<std::shared_ptr<Device>> CreateShmDevice(const DeviceOptions&) {
  return absl::UnimplementedError("the shm backend is not implemented yet");
}

}  // namespace plexus::transport::internal
