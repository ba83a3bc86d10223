// Diagnostics from inside the libraries: the one way Plexus code reports what no caller asked
// about and no Status can carry (a store server dropping a client, a trace file it could not
// write, the traces PLEXUS_COLL_DEBUG asks for). Fallible calls still return absl::Status; this
// is for what happens beside them.
//
//   base::Logf(base::LogLevel::kWarning, "plexus store %s: dropping client %s: %s", address,
//              peer, why);
//
// Levels, lowest first: debug, info, warning, error. A message below the threshold is dropped
// before it is formatted. The threshold is PLEXUS_LOG_LEVEL (debug, info, warning, error or off;
// any case; default info), read once, when the first message is logged; SetLogLevel overrides
// it. An invalid value logs one warning and leaves the default.
//
// Where messages go: by default to stderr, one line each, as they are (the message carries its
// own prefix, such as "plexus store ..." or "[plexus-coll rank 3] ..."). An application routes
// them into its own logging, or silences them, with SetLogSink:
//
//   base::SetLogSink([](base::LogLevel level, std::string_view message) {
//     my_logger.Write(level >= base::LogLevel::kWarning, message);
//   });
//   base::SetLogSink(nullptr);                   // silence every message
//   base::SetLogSink(base::StderrLogSink());     // back to the default
//
// Thread-safe: messages may come from any thread (the libraries' progress and watcher threads
// among them), and the sink is called outside any lock of this module, so it may log itself. A
// sink replaced while a message is being delivered may still receive that message.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace plexus::base {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// "debug", "info", "warning", "error", "off".
const char* LogLevelName(LogLevel level);
// The inverse of LogLevelName, any case; `name` (the variable) is used in the error.
absl::StatusOr<LogLevel> ParseLogLevel(std::string_view text, std::string_view name);

// Receives each message that passes the threshold, without a trailing newline.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Replaces the sink (an empty one silences every message); returns the one it replaced.
LogSink SetLogSink(LogSink sink);
// The default sink: the message and a newline to stderr, in one write.
LogSink StderrLogSink();

// The threshold: messages below it are dropped (kOff: all of them).
LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
// PLEXUS_LOG_LEVEL's value now (kInfo when unset or invalid; `error`, when given, gets the reason
// it is invalid). GetLogLevel reads it once, on first use.
LogLevel LogLevelFromEnvironment(std::string* error = nullptr);

// Whether a message at `level` would reach the sink.
inline bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= static_cast<int>(GetLogLevel());
}

// Hands `message` to the sink when `level` passes the threshold.
void Log(LogLevel level, std::string_view message);

// printf-style (absl::StrFormat), formatted only when `level` passes the threshold.
template <typename... Args>
void Logf(LogLevel level, const absl::FormatSpec<Args...>& format, const Args&... args) {
  if (LogEnabled(level)) Log(level, absl::StrFormat(format, args...));
}

}  // namespace plexus::base
