#include "plexus/base/log.hpp"

#include <atomic>
#include <cstdio>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/env.hpp"

namespace plexus::base {
namespace {

constexpr const char* kLogLevelVariable = "PLEXUS_LOG_LEVEL";

// Listed with the other parameters (PLEXUS_DEBUG=1); read through LogLevelFromEnvironment, not
// Get(): the PLEXUS_DEBUG listing is itself logged, from inside the first Get().
const Param<std::string> kLogLevelParam(kLogLevelVariable, "info",
                                        "threshold of the libraries' messages: debug, info, "
                                        "warning, error or off");

struct SinkState {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;  // null: silenced
};
SinkState& Sinks() {
  // Never destroyed: threads may log during static destruction.
  static SinkState* state = [] {
    auto* s = new SinkState;
    s->sink = std::make_shared<const LogSink>(StderrLogSink());
    return s;
  }();
  return *state;
}

constexpr int kUnset = -1;
std::atomic<int> threshold{kUnset};

}  // namespace

const char* LogLevelName(LogLevel level) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error", "off"};
  const auto index = static_cast<size_t>(level);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view text, std::string_view name) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(std::string(text)));
  for (LogLevel level :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kOff}) {
    if (t == LogLevelName(level)) return level;
  }
  return absl::InvalidArgumentError(absl::StrCat(std::string(name), "='", std::string(text),
                                                 "' is not valid: expected debug, info, "
                                                 "warning, error or off"));
}

LogSink StderrLogSink() {
  return [](LogLevel, std::string_view message) {
    std::string line(message);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stderr);
  };
}

LogSink SetLogSink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  SinkState& s = Sinks();
  std::shared_ptr<const LogSink> previous;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    previous = std::exchange(s.sink, std::move(next));
  }
  return previous ? *previous : LogSink();
}

LogLevel LogLevelFromEnvironment(std::string* error) {
  const std::optional<std::string> text = EnvValue(kLogLevelVariable);
  if (!text) return LogLevel::kInfo;
  absl::StatusOr<LogLevel> level = ParseLogLevel(*text, kLogLevelVariable);
  if (level.ok()) return *level;
  if (error != nullptr) *error = std::string(level.status().message());
  return LogLevel::kInfo;
}

LogLevel GetLogLevel() {
  int t = threshold.load(std::memory_order_relaxed);
  if (t != kUnset) return static_cast<LogLevel>(t);
  std::string error;
  const LogLevel from_environment = LogLevelFromEnvironment(&error);
  // A concurrent first read, or SetLogLevel, may have got there first: theirs stands.
  if (threshold.compare_exchange_strong(t, static_cast<int>(from_environment)) && !error.empty()) {
    Log(LogLevel::kWarning, absl::StrCat("plexus: ", error, "; using info"));
  }
  return static_cast<LogLevel>(threshold.load(std::memory_order_relaxed));
}

void SetLogLevel(LogLevel level) {
  threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

void Log(LogLevel level, std::string_view message) {
  if (!LogEnabled(level)) return;
  std::shared_ptr<const LogSink> sink;
  {
    SinkState& s = Sinks();
    std::lock_guard<std::mutex> lock(s.mu);
    sink = s.sink;
  }
  if (sink) (*sink)(level, message);
}

}  // namespace plexus::base
