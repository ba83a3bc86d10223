// Placeholder until the inproc backend lands; replaced by the real implementation.
#include "backends.hpp"

namespace plexus::transport::internal {

absl::StatusOr<std::shared_ptr<Device>> CreateInprocDevice(const DeviceOptions&) {
  return absl::UnimplementedError("the inproc backend is not implemented yet");
}

}  // namespace plexus::transport::internal
