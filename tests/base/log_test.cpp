// base::Log: the default stderr sink, a sink that redirects, silencing, the threshold and
// PLEXUS_LOG_LEVEL.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "plexus/base/log.hpp"

namespace pb = plexus::base;

namespace {

// What the calls in `fn` write to stderr (fd 2, through a temporary file).
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  std::fflush(stderr);
  char path[] = "/tmp/plexus_log_test_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = dup(2);
  dup2(fd, 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  unlink(path);
  return out;
}

// Restores the default sink and threshold when a test ends.
struct Restore {
  ~Restore() {
    pb::SetLogSink(pb::StderrLogSink());
    pb::SetLogLevel(pb::LogLevel::kInfo);
  }
};

}  // namespace

TEST_CASE("log: the default sink writes each message as one line on stderr", "[base][log]") {
  Restore restore;
  pb::SetLogLevel(pb::LogLevel::kInfo);
  const std::string out = CaptureStderr([] {
    pb::Logf(pb::LogLevel::kWarning, "plexus store %s: dropping client %s", "127.0.0.1:1", "x");
    pb::Log(pb::LogLevel::kInfo, "second");
    pb::Log(pb::LogLevel::kDebug, "below the threshold");
  });
  CHECK(out == "plexus store 127.0.0.1:1: dropping client x\nsecond\n");
}

TEST_CASE("log: a sink redirects every message, with its level", "[base][log]") {
  Restore restore;
  pb::SetLogLevel(pb::LogLevel::kDebug);
  std::vector<std::pair<pb::LogLevel, std::string>> seen;
  pb::SetLogSink([&](pb::LogLevel level, std::string_view message) {
    seen.emplace_back(level, std::string(message));
  });
  const std::string out = CaptureStderr([] {
    pb::Logf(pb::LogLevel::kError, "rank %d: %s", 3, std::string("gone"));
    pb::Log(pb::LogLevel::kDebug, "detail");
  });
  CHECK(out.empty());  // nothing reached stderr
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::make_pair(pb::LogLevel::kError, std::string("rank 3: gone")));
  CHECK(seen[1] == std::make_pair(pb::LogLevel::kDebug, std::string("detail")));
  // Setting a sink hands back the one it replaced.
  pb::LogSink previous = pb::SetLogSink(pb::StderrLogSink());
  REQUIRE(previous);
  previous(pb::LogLevel::kInfo, "direct");
  CHECK(seen.back().second == "direct");
}

TEST_CASE("log: an empty sink silences; the threshold filters", "[base][log]") {
  Restore restore;
  pb::SetLogSink(nullptr);
  const std::string silent = CaptureStderr([] {
    pb::Log(pb::LogLevel::kError, "not shown");
    pb::Logf(pb::LogLevel::kWarning, "nor %s", "this");
  });
  CHECK(silent.empty());
  CHECK_FALSE(pb::SetLogSink(pb::StderrLogSink()));  // the silent sink was empty

  std::vector<std::string> seen;
  pb::SetLogSink([&](pb::LogLevel, std::string_view m) { seen.emplace_back(m); });
  pb::SetLogLevel(pb::LogLevel::kWarning);
  CHECK_FALSE(pb::LogEnabled(pb::LogLevel::kInfo));
  CHECK(pb::LogEnabled(pb::LogLevel::kError));
  pb::Log(pb::LogLevel::kInfo, "dropped");
  pb::Log(pb::LogLevel::kWarning, "kept");
  pb::SetLogLevel(pb::LogLevel::kOff);
  pb::Log(pb::LogLevel::kError, "off drops even errors");
  CHECK(seen == std::vector<std::string>{"kept"});
  CHECK(pb::GetLogLevel() == pb::LogLevel::kOff);
}

TEST_CASE("log: PLEXUS_LOG_LEVEL names the threshold; a bad value keeps info and says why",
          "[base][log]") {
  unsetenv("PLEXUS_LOG_LEVEL");
  CHECK(pb::LogLevelFromEnvironment() == pb::LogLevel::kInfo);
  setenv("PLEXUS_LOG_LEVEL", "Warning", 1);
  CHECK(pb::LogLevelFromEnvironment() == pb::LogLevel::kWarning);
  setenv("PLEXUS_LOG_LEVEL", "off", 1);
  CHECK(pb::LogLevelFromEnvironment() == pb::LogLevel::kOff);
  setenv("PLEXUS_LOG_LEVEL", "loud", 1);
  std::string error;
  CHECK(pb::LogLevelFromEnvironment(&error) == pb::LogLevel::kInfo);
  CHECK(error ==
        "PLEXUS_LOG_LEVEL='loud' is not valid: expected debug, info, warning, error or off");
  unsetenv("PLEXUS_LOG_LEVEL");
  for (pb::LogLevel level : {pb::LogLevel::kDebug, pb::LogLevel::kInfo, pb::LogLevel::kWarning,
                             pb::LogLevel::kError, pb::LogLevel::kOff}) {
    CHECK(pb::ParseLogLevel(pb::LogLevelName(level), "x").value() == level);
  }
}
