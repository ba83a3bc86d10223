// The command-line conventions of every Plexus tool and benchmark, over CLI11: `--help` on the
// tool and on every subcommand, `--version`, `--json` for machine-readable output, strict numbers
// (garbage is an error naming the flag, never 0; out-of-range values name the limit), exit code 2
// for usage errors and 1 for failures, every message prefixed with the tool's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::tooling {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The project version (from CMake's project()).
std::string_view Version();

// Strict parsers: the whole of `text` must be the number, within [min, max]. Errors read
// "--runs expects an integer in 1..100, got 'abc'" (`flag` names the option).
absl::StatusOr<int64_t> ParseInteger(std::string_view flag, std::string_view text, int64_t min,
                                     int64_t max);
absl::StatusOr<uint64_t> ParseUnsigned(std::string_view flag, std::string_view text, uint64_t min,
                                       uint64_t max);
absl::StatusOr<double> ParseReal(std::string_view flag, std::string_view text, double min,
                                 double max);

class Tool {
 public:
  Tool(std::string name, std::string description);

  const std::string& name() const { return name_; }
  CLI::App& app() { return app_; }

  // A subcommand with its own --help.
  CLI::App* Subcommand(const std::string& name, const std::string& description);

  // Parses the command line. Returns the code main() should return now (0 after --help or
  // --version, kExitUsage after a usage error, with the message printed), or nullopt when the
  // program goes on.
  std::optional<int> Parse(int argc, char** argv);

  // "<tool>: <message>" on stderr; returns kExitFailure (or kExitUsage for Usage).
  int Fail(std::string_view message) const;
  int Fail(const absl::Status& status) const;
  int Usage(std::string_view message) const;

 private:
  std::string name_;
  CLI::App app_;
};

// The example data (scenarios, problems, traces): <prefix>/share/plexus/data beside an
// installed program (<prefix>/bin/...), else the checkout's examples/data (a program run from
// its build tree). What help texts name and data options default to.
std::string DataDir();

// --json: machine-readable output instead of the table.
CLI::Option* AddJsonFlag(CLI::App* app, bool* json);

namespace internal {
// One number of an option, strictly (ParseReal, ParseInteger or ParseUnsigned by T); throws
// CLI::ValidationError, which Tool::Parse reports as a usage error.
template <typename T>
T ParseNumberOrThrow(const std::string& flag, const std::string& text, T min, T max) {
  static_assert(std::is_arithmetic_v<T>);
  if constexpr (std::is_floating_point_v<T>) {
    auto v = ParseReal(flag, text, static_cast<double>(min), static_cast<double>(max));
    if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
    return static_cast<T>(*v);
  } else if constexpr (std::is_signed_v<T>) {
    auto v = ParseInteger(flag, text, static_cast<int64_t>(min), static_cast<int64_t>(max));
    if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
    return static_cast<T>(*v);
  } else {
    auto v = ParseUnsigned(flag, text, static_cast<uint64_t>(min), static_cast<uint64_t>(max));
    if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
    return static_cast<T>(*v);
  }
}
}  // namespace internal

// A numeric option parsed strictly into `*value`, with its range checked and named in --help.
template <typename T>
CLI::Option* AddNumber(CLI::App* app, const std::string& names, T* value, const std::string& help,
                       T min, T max) {
  auto parse = [value, min, max, names](const std::string& text) {
    *value = internal::ParseNumberOrThrow<T>(names.substr(names.rfind(',') + 1), text, min, max);
  };
  CLI::Option* option = app->add_option_function<std::string>(names, parse, help);
  option->type_name(std::is_floating_point_v<T> ? "NUMBER" : "INT");
  option->default_str(CLI::detail::to_string(*value));
  option->capture_default_str();
  return option;
}

// A comma-separated list of numbers (--loads 0.3,0.5), each parsed strictly and within
// [min, max]; the list replaces `*values` (its default) when given.
template <typename T>
CLI::Option* AddNumberList(CLI::App* app, const std::string& names, std::vector<T>* values,
                           const std::string& help, T min, T max) {
  auto parse = [values, min, max, names](const std::vector<std::string>& texts) {
    const std::string flag = names.substr(names.rfind(',') + 1);
    std::vector<T> parsed;
    for (const std::string& text : texts) {
      parsed.push_back(internal::ParseNumberOrThrow<T>(flag, text, min, max));
    }
    *values = std::move(parsed);
  };
  CLI::Option* option = app->add_option_function<std::vector<std::string>>(names, parse, help);
  option->delimiter(',');
  option->type_name(std::is_floating_point_v<T> ? "NUMBER,..." : "INT,...");
  std::string shown;
  for (const T& v : *values) shown += (shown.empty() ? "" : ",") + CLI::detail::to_string(v);
  option->default_str(shown);
  return option;
}

}  // namespace plexus::tooling
