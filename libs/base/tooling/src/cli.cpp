#include "plexus/tooling/cli.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "plexus/config.hpp"
#include "plexus/tooling/launch.hpp"

namespace plexus::tooling {
namespace {

absl::Status Expect(std::string_view flag, std::string_view what, std::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(flag), " expects ", std::string(what),
                                                 ", got '", std::string(text), "'"));
}

absl::Status OutOfRange(std::string_view flag, std::string_view what, std::string_view text) {
  return absl::OutOfRangeError(absl::StrCat(std::string(flag), " is out of range: expects ",
                                            std::string(what), ", got ", std::string(text)));
}

// Text that is a number, only not written as an integer ("1e18", "2.5"): the message says it
// is out of range when it is, rather than that it is no integer.
bool IsRealOutside(const std::string& text, double min, double max) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || std::isnan(v)) return false;
  return v < min || v > max;
}

}  // namespace

std::string_view Version() { return PLEXUS_VERSION_STRING; }

std::string DataDir() {
  const std::filesystem::path self = SelfPath("");
  if (!self.empty()) {
    const std::filesystem::path installed =
        self.parent_path().parent_path() / "share" / "plexus" / "data";
    std::error_code ec;
    if (std::filesystem::is_directory(installed, ec)) return installed.string();
  }
  return PLEXUS_SOURCE_DATA_DIR;
}

absl::StatusOr<int64_t> ParseInteger(std::string_view flag, std::string_view text, int64_t min,
                                     int64_t max) {
  const std::string what = absl::StrCat("an integer in ", min, "..", max);
  const std::string copy(text);
  if (copy.empty() || std::isspace(static_cast<unsigned char>(copy[0]))) {
    return Expect(flag, what, text);
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(copy.c_str(), &end, 10);
  if (end != copy.c_str() + copy.size()) {
    if (IsRealOutside(copy, static_cast<double>(min), static_cast<double>(max))) {
      return OutOfRange(flag, what, text);
    }
    return Expect(flag, what, text);
  }
  if (errno == ERANGE || v < min || v > max) return OutOfRange(flag, what, text);
  return static_cast<int64_t>(v);
}

absl::StatusOr<uint64_t> ParseUnsigned(std::string_view flag, std::string_view text, uint64_t min,
                                       uint64_t max) {
  const std::string what = absl::StrCat("an integer in ", min, "..", max);
  const std::string copy(text);
  if (copy.empty() || !std::isdigit(static_cast<unsigned char>(copy[0]))) {
    return Expect(flag, what, text);
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(copy.c_str(), &end, 10);
  if (end != copy.c_str() + copy.size()) {
    if (IsRealOutside(copy, static_cast<double>(min), static_cast<double>(max))) {
      return OutOfRange(flag, what, text);
    }
    return Expect(flag, what, text);
  }
  if (errno == ERANGE || v < min || v > max) return OutOfRange(flag, what, text);
  return static_cast<uint64_t>(v);
}

absl::StatusOr<double> ParseReal(std::string_view flag, std::string_view text, double min,
                                 double max) {
  const std::string what = absl::StrCat("a number in ", min, "..", max);
  const std::string copy(text);
  if (copy.empty() || std::isspace(static_cast<unsigned char>(copy[0]))) {
    return Expect(flag, what, text);
  }
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || std::isnan(v)) return Expect(flag, what, text);
  if (errno == ERANGE || !std::isfinite(v) || v < min || v > max) {
    return OutOfRange(flag, what, text);
  }
  return v;
}

Tool::Tool(std::string name, std::string description)
    : name_(std::move(name)), app_(std::move(description), name_) {
  app_.set_version_flag("--version", absl::StrCat(name_, " ", std::string(Version())));
  app_.set_help_flag("-h,--help", "print this help and exit");
}

CLI::App* Tool::Subcommand(const std::string& name, const std::string& description) {
  CLI::App* sub = app_.add_subcommand(name, description);
  sub->set_help_flag("-h,--help", "print this help and exit");
  return sub;
}

std::optional<int> Tool::Parse(int argc, char** argv) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app_.help();  // CLI11 hands it to the subcommand that was asked for
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app_.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion&) {
    std::cout << name_ << " " << Version() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the usage.\n", name_.c_str(), message.c_str(),
                 name_.c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

int Tool::Fail(std::string_view message) const {
  std::fprintf(stderr, "%s: %.*s\n", name_.c_str(), static_cast<int>(message.size()),
               message.data());
  return kExitFailure;
}

int Tool::Fail(const absl::Status& status) const { return Fail(std::string(status.message())); }

int Tool::Usage(std::string_view message) const {
  std::fprintf(stderr, "%s: %.*s\nRun '%s --help' for the usage.\n", name_.c_str(),
               static_cast<int>(message.size()), message.data(), name_.c_str());
  return kExitUsage;
}

CLI::Option* AddJsonFlag(CLI::App* app, bool* json) {
  return app->add_flag("--json", *json, "print machine-readable JSON instead of the table");
}

}  // namespace plexus::tooling
