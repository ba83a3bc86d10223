// Test helpers shared by the Plexus test suites.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace plexus::testing {

// How many times slower a sanitized build runs, at most (paths that allocate and free much, such
// as closing a thousand connections, slow down the most): a bound on a latency a test checks (a
// stall that must not come back) is multiplied by it; the unsanitized build keeps the real bound.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kSanitizerSlowdown = 10;
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif

// Exit code registered as CTest's SKIP_RETURN_CODE.
inline constexpr int kSkipReturnCode = 77;

// Ends the test program as skipped after printing why (for absent hardware or privileges).
[[noreturn]] inline void SkipTest(std::string_view reason) {
  std::fprintf(stderr, "SKIPPED: %.*s\n", static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
  std::_Exit(kSkipReturnCode);
}

}  // namespace plexus::testing
