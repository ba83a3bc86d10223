// What the kernel says about the test process itself (or a child it forked), for tests that
// bound memory use.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <sys/types.h>

namespace plexus::testing {

// A field of /proc/self/status (or /proc/<pid>/status) in bytes ("VmRSS", "VmSize", "VmHWM"); -1
// when it is absent.
inline int64_t ProcStatusBytes(std::string_view field, pid_t pid = 0) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status")
                            : "/proc/" + std::to_string(pid) + "/status");
  const std::string prefix = std::string(field) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long long kib = std::strtoll(line.c_str() + prefix.size(), &end, 10);  // "  123 kB"
    if (end == line.c_str() + prefix.size()) return -1;
    return static_cast<int64_t>(kib) * 1024;
  }
  return -1;
}

}  // namespace plexus::testing
