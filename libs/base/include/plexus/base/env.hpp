// Environment parameters, in the spirit of NCCL_PARAM: each tunable that the environment may set
// is declared once, with its type, default and help, and read through one parser per type.
//
//   const plexus::base::Param<int64_t> kChannels("PLEXUS_COLL_CHANNELS", 2, "sockets per peer");
//   PLEXUS_ASSIGN_OR_RETURN(int64_t channels, kChannels.Resolve(options.channels));
//
// Rules every parameter follows:
//  - an explicit option (Resolve's argument) beats the environment, which beats the default;
//  - an unset or empty variable means the default; a value that does not parse is an
//    InvalidArgument naming the variable and the expected form (never silently 0);
//  - booleans have one spelling: 1/0, true/false, yes/no, on/off (any case);
//  - with PLEXUS_DEBUG=1 the process prints every registered parameter's effective value and
//    where it came from, once, through base::Log (stderr by default), the first time any
//    parameter is read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::base {

// One parser per type; `name` (the variable) is used in error messages.
absl::StatusOr<bool> ParseBool(std::string_view text, std::string_view name);
absl::StatusOr<int64_t> ParseInt(std::string_view text, std::string_view name);
// Byte counts: "4096", "64K"/"64KiB", "1M"/"1MiB", "2G"/"2GiB" (binary multiples).
absl::StatusOr<uint64_t> ParseBytes(std::string_view text, std::string_view name);
absl::StatusOr<double> ParseDouble(std::string_view text, std::string_view name);
// Durations: "250ms", "10s", "1m30s" (absl::ParseDuration), or a plain number of seconds.
absl::StatusOr<absl::Duration> ParseDurationValue(std::string_view text, std::string_view name);

// The raw value of environment variable `name`; nullopt when unset or empty.
std::optional<std::string> EnvValue(std::string_view name);

// A byte count, for Param<Bytes> (typed so that "64K" parses and prints as bytes).
struct Bytes {
  uint64_t value = 0;
  friend bool operator==(Bytes a, Bytes b) { return a.value == b.value; }
};

namespace internal {

class ParamBase {
 public:
  ParamBase(const char* name, const char* help);
  ParamBase(const ParamBase&) = delete;
  ParamBase& operator=(const ParamBase&) = delete;
  virtual ~ParamBase();
  const char* name() const { return name_; }
  const char* help() const { return help_; }
  virtual std::string TypeName() const = 0;
  virtual std::string DefaultText() const = 0;
  // The effective value as text (or the parse error), and "default" or "environment".
  virtual std::string EffectiveText(std::string* source) const = 0;

 protected:
  void NoteRead() const;  // prints every parameter once when PLEXUS_DEBUG is set

 private:
  const char* name_;
  const char* help_;
};

template <typename T>
struct ParamTraits;
template <>
struct ParamTraits<bool> {
  static constexpr const char* kType = "bool";
  static absl::StatusOr<bool> Parse(std::string_view t, std::string_view n) {
    return ParseBool(t, n);
  }
  static std::string Format(bool v) { return v ? "1" : "0"; }
};
template <>
struct ParamTraits<int64_t> {
  static constexpr const char* kType = "int";
  static absl::StatusOr<int64_t> Parse(std::string_view t, std::string_view n) {
    return ParseInt(t, n);
  }
  static std::string Format(int64_t v) { return std::to_string(v); }
};
template <>
struct ParamTraits<Bytes> {
  static constexpr const char* kType = "bytes";
  static absl::StatusOr<Bytes> Parse(std::string_view t, std::string_view n) {
    auto v = ParseBytes(t, n);
    if (!v.ok()) return v.status();
    return Bytes{*v};
  }
  static std::string Format(Bytes v) { return std::to_string(v.value); }
};
template <>
struct ParamTraits<double> {
  static constexpr const char* kType = "number";
  static absl::StatusOr<double> Parse(std::string_view t, std::string_view n) {
    return ParseDouble(t, n);
  }
  static std::string Format(double v) { return std::to_string(v); }
};
template <>
struct ParamTraits<std::string> {
  static constexpr const char* kType = "string";
  static absl::StatusOr<std::string> Parse(std::string_view t, std::string_view) {
    return std::string(t);
  }
  static std::string Format(const std::string& v) { return v; }
};
template <>
struct ParamTraits<absl::Duration> {
  static constexpr const char* kType = "duration";
  static absl::StatusOr<absl::Duration> Parse(std::string_view t, std::string_view n) {
    return ParseDurationValue(t, n);
  }
  static std::string Format(absl::Duration v) { return absl::FormatDuration(v); }
};

}  // namespace internal

// A parameter read from environment variable `name`. Declare it at namespace scope (static
// storage: it registers itself for PLEXUS_DEBUG); reading is thread-safe and never cached, so a
// test may change the variable between reads.
template <typename T>
class Param final : public internal::ParamBase {
 public:
  Param(const char* name, T default_value, const char* help)
      : ParamBase(name, help), default_(std::move(default_value)) {}

  const T& default_value() const { return default_; }

  // The environment's value, or the default when unset or empty.
  absl::StatusOr<T> Get() const {
    NoteRead();
    const std::optional<std::string> text = EnvValue(name());
    if (!text) return default_;
    return internal::ParamTraits<T>::Parse(*text, name());
  }

  // The explicit value when given, else Get().
  absl::StatusOr<T> Resolve(const std::optional<T>& explicit_value) const {
    if (explicit_value) {
      NoteRead();
      return *explicit_value;
    }
    return Get();
  }

  std::string TypeName() const override { return internal::ParamTraits<T>::kType; }
  std::string DefaultText() const override { return internal::ParamTraits<T>::Format(default_); }
  std::string EffectiveText(std::string* source) const override {
    const std::optional<std::string> text = EnvValue(name());
    if (!text) {
      *source = "default";
      return DefaultText();
    }
    *source = "environment";
    auto value = internal::ParamTraits<T>::Parse(*text, name());
    if (!value.ok()) return std::string("invalid: ") + std::string(value.status().message());
    return internal::ParamTraits<T>::Format(*value);
  }

 private:
  T default_;
};

struct ParamReport {
  std::string name, type, value, source, default_value, help;
};
// Every parameter registered in this process (those linked in), sorted by name.
std::vector<ParamReport> DescribeParams();
// The table PLEXUS_DEBUG=1 prints, one parameter a line.
std::string FormatParams();

}  // namespace plexus::base
