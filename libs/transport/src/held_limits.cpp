// The caps on bytes held for early messages, resolved from DeviceOptions and the environment
// (apart from matcher.cpp, which the fuzz targets compile without the base library).
#include <optional>

#include "absl/strings/str_cat.h"
#include "matcher.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::internal {
namespace {

const base::Param<base::Bytes> kHeldPerConnectionParam(
    "PLEXUS_MAX_HELD_BYTES_PER_CONNECTION", base::Bytes{kDefaultHeldBytesPerConnection},
    "bytes a connection holds for messages that arrive before their receive is posted");
const base::Param<base::Bytes> kHeldPerDeviceParam(
    "PLEXUS_MAX_HELD_BYTES_PER_DEVICE", base::Bytes{kDefaultHeldBytesPerDevice},
    "bytes all connections of a device hold for messages that arrive before their receive");

absl::StatusOr<size_t> ResolveCap(const base::Param<base::Bytes>& param, size_t option) {
  std::optional<base::Bytes> explicit_value;
  if (option > 0) explicit_value = base::Bytes{option};
  PLEXUS_ASSIGN_OR_RETURN(const base::Bytes cap, param.Resolve(explicit_value));
  if (cap.value == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(param.name(), " must be positive (a byte count such as 256M)"));
  }
  return static_cast<size_t>(cap.value);
}

}  // namespace

absl::StatusOr<HoldLimits> ResolveHoldLimits(const DeviceOptions& options) {
  HoldLimits limits;
  PLEXUS_ASSIGN_OR_RETURN(limits.per_connection, ResolveCap(kHeldPerConnectionParam,
                                                            options.max_held_bytes_per_connection));
  PLEXUS_ASSIGN_OR_RETURN(limits.per_device,
                          ResolveCap(kHeldPerDeviceParam, options.max_held_bytes_per_device));
  return limits;
}

}  // namespace plexus::transport::internal
