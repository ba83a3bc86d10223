// Verbs entry points when Plexus is built without libibverbs (PLEXUS_WITH_VERBS=OFF or no
// headers). With verbs, src/verbs/ defines them instead (CMake compiles one or the other).
#include "backends.hpp"
#include "verbs_path_info.hpp"

namespace plexus::transport::internal {

bool VerbsAvailable(std::string* why_not) {
  if (why_not) {
    *why_not =
        "Plexus was built without RDMA verbs (PLEXUS_WITH_VERBS=OFF, or "
        "libibverbs-dev/librdmacm-dev "
        "not found)";
  }
  return false;
}

absl::StatusOr<std::shared_ptr<Device>> CreateVerbsDevice(const DeviceOptions&) {
  return absl::UnavailableError(
      "Plexus was built without RDMA verbs (PLEXUS_WITH_VERBS=OFF, or libibverbs-dev/librdmacm-dev "
      "not found)");
}

absl::StatusOr<VerbsPathInfo> DescribeVerbsPath(const Connection&) {
  return absl::UnavailableError("Plexus was built without RDMA verbs (PLEXUS_WITH_VERBS=OFF)");
}

}  // namespace plexus::transport::internal
