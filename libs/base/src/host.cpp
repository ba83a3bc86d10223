#include "plexus/base/host.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace plexus::base {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

int OnlineCpuCount() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::max(online, 1L));
}

std::vector<int> UsableCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    for (int c = 0; c < OnlineCpuCount(); ++c) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace plexus::base
