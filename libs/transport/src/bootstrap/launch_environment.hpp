// What the launch environment's parsing shares with the rendezvous that uses it.
#pragma once

#include "absl/status/status.h"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::transport::bootstrap {

// An etcd store is shared by every job that uses it, so a job must say which it is:
// InvalidArgument, saying how to set PLEXUS_JOB_ID, for an etcd store without a job id.
absl::Status RequireJobIdForEtcd(const LaunchInfo& config);

}  // namespace plexus::transport::bootstrap
