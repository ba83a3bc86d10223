// What this process may run on: host identity and CPU sets.
#pragma once

#include <string>
#include <vector>

namespace plexus::base {

// This machine's host name ("unknown-host" when the kernel does not say).
std::string HostName();

// The CPUs this process may run on (its affinity mask), ascending; every online CPU when the
// mask cannot be read.
std::vector<int> UsableCpus();

// Number of CPUs online on this machine (at least 1).
int OnlineCpuCount();

}  // namespace plexus::base
