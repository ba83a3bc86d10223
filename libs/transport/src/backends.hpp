// Factories of the concrete backends (each in its own folder of src/).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "plexus/transport/device.hpp"

namespace plexus::transport::internal {

absl::StatusOr<std::shared_ptr<Device>> CreateInprocDevice(const DeviceOptions& options);
absl::StatusOr<std::shared_ptr<Device>> CreateShmDevice(const DeviceOptions& options);
absl::StatusOr<std::shared_ptr<Device>> CreateTcpDevice(const DeviceOptions& options);
// Unavailable when built without verbs or when no RDMA device exists (the reason says which).
absl::StatusOr<std::shared_ptr<Device>> CreateVerbsDevice(const DeviceOptions& options);
bool VerbsAvailable(std::string* why_not);

}  // namespace plexus::transport::internal
