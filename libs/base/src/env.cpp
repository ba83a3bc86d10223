#include "plexus/base/env.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/log.hpp"

namespace plexus::base {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<const internal::ParamBase*> params;
};
Registry& GlobalRegistry() {
  static Registry* registry = new Registry;  // never destroyed: params outlive static teardown
  return *registry;
}

absl::Status Invalid(std::string_view name, std::string_view text, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(name), "='", std::string(text),
                                                 "' is not valid: expected ",
                                                 std::string(expected)));
}

// Debian's Abseil has its own string_view: trim through std::string.
std::string Trimmed(std::string_view text) {
  return std::string(absl::StripAsciiWhitespace(std::string(text)));
}

}  // namespace

std::optional<std::string> EnvValue(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

absl::StatusOr<bool> ParseBool(std::string_view text, std::string_view name) {
  const std::string t = absl::AsciiStrToLower(Trimmed(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return Invalid(name, text, "1/0, true/false, yes/no or on/off");
}

absl::StatusOr<int64_t> ParseInt(std::string_view text, std::string_view name) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(Trimmed(text), &v)) {
    return Invalid(name, text, "an integer");
  }
  return v;
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view text, std::string_view name) {
  std::string lower = absl::AsciiStrToLower(Trimmed(text));
  // Longest suffixes first, so that "kib" is not taken for "b".
  static constexpr std::pair<std::string_view, uint64_t> kSuffixes[] = {{"kib", 1ull << 10},
                                                                        {"mib", 1ull << 20},
                                                                        {"gib", 1ull << 30},
                                                                        {"k", 1ull << 10},
                                                                        {"m", 1ull << 20},
                                                                        {"g", 1ull << 30},
                                                                        {"b", 1}};
  uint64_t multiplier = 1;
  for (const auto& [suffix, m] : kSuffixes) {
    if (lower.size() > suffix.size() && lower.ends_with(suffix)) {
      lower.resize(lower.size() - suffix.size());
      multiplier = m;
      break;
    }
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(lower, &v)) {
    return Invalid(name, text, "a byte count such as 4096, 64K, 1MiB or 2G");
  }
  if (v > UINT64_MAX / multiplier) return Invalid(name, text, "a byte count below 2^64");
  return v * multiplier;
}

absl::StatusOr<double> ParseDouble(std::string_view text, std::string_view name) {
  double v = 0;
  if (!absl::SimpleAtod(Trimmed(text), &v) || !std::isfinite(v)) {
    return Invalid(name, text, "a finite number");
  }
  return v;
}

absl::StatusOr<absl::Duration> ParseDurationValue(std::string_view text, std::string_view name) {
  const std::string t = Trimmed(text);
  double seconds = 0;
  if (absl::SimpleAtod(t, &seconds)) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return Invalid(name, text, "a non-negative duration");
    }
    return absl::Seconds(seconds);
  }
  absl::Duration d;
  if (!absl::ParseDuration(t, &d) || d < absl::ZeroDuration()) {
    return Invalid(name, text, "a duration such as 250ms, 10s, 1m30s, or a number of seconds");
  }
  return d;
}

namespace internal {

ParamBase::ParamBase(const char* name, const char* help) : name_(name), help_(help) {
  Registry& r = GlobalRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.params.push_back(this);
}

ParamBase::~ParamBase() {
  Registry& r = GlobalRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.params.erase(std::remove(r.params.begin(), r.params.end(), this), r.params.end());
}

void ParamBase::NoteRead() const {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::optional<std::string> debug = EnvValue("PLEXUS_DEBUG");
    if (!debug) return;
    auto on = ParseBool(*debug, "PLEXUS_DEBUG");
    if (!on.ok() || !*on) return;
    std::string table = FormatParams();
    if (!table.empty() && table.back() == '\n') table.pop_back();
    Log(LogLevel::kInfo, absl::StrCat("plexus: parameters (PLEXUS_DEBUG=1)\n", table));
  });
}

}  // namespace internal

std::vector<ParamReport> DescribeParams() {
  std::vector<ParamReport> out;
  Registry& r = GlobalRegistry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const internal::ParamBase* p : r.params) {
      ParamReport report;
      report.name = p->name();
      report.type = p->TypeName();
      report.value = p->EffectiveText(&report.source);
      report.default_value = p->DefaultText();
      report.help = p->help();
      out.push_back(std::move(report));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ParamReport& a, const ParamReport& b) { return a.name < b.name; });
  // A parameter declared in a header is one per translation unit: report each name once.
  out.erase(
      std::unique(out.begin(), out.end(),
                  [](const ParamReport& a, const ParamReport& b) { return a.name == b.name; }),
      out.end());
  return out;
}

std::string FormatParams() {
  std::string out;
  for (const ParamReport& p : DescribeParams()) {
    absl::StrAppendFormat(&out, "  %-32s = %-12s (%s; %s, default %s) %s\n", p.name, p.value,
                          p.source, p.type, p.default_value, p.help);
  }
  return out;
}

}  // namespace plexus::base
