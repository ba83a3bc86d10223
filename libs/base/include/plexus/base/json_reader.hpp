// A strict JSON field reader: every error names the element at fault ("workers[3].count:
// expected an integer, got 2.5"), and CheckKeys rejects unknown (misspelt) fields. Header-only on
// purpose: nlohmann/json stays a dependency of the libraries that read JSON, not of the base.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"

namespace plexus::base::json {

using Json = nlohmann::json;

inline absl::Status Invalid(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

inline std::string Child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", std::string(key));
}

inline std::string Index(const std::string& path, size_t i) {
  return absl::StrCat(path, "[", i, "]");
}

inline std::string TypeName(const Json& value) { return value.type_name(); }

// Rejects keys outside `allowed`, except "comment", "$schema" and keys starting with '_', so that a
// misspelt field is reported instead of silently ignored.
inline absl::Status CheckKeys(const Json& object, const std::string& path,
                              std::initializer_list<std::string_view> allowed) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (key == "comment" || key == "$schema" || (!key.empty() && key[0] == '_')) continue;
    bool known = false;
    for (std::string_view name : allowed) known = known || key == name;
    if (!known) {
      std::string expected;
      for (std::string_view name : allowed) {
        absl::StrAppend(&expected, expected.empty() ? "" : ", ", std::string(name));
      }
      return Invalid(Child(path, key),
                     absl::StrCat("unknown field (expected one of: ", expected, ")"));
    }
  }
  return absl::OkStatus();
}

inline absl::StatusOr<const Json*> Field(const Json& object, const std::string& path,
                                         std::string_view key, bool required) {
  auto it = object.find(std::string(key));
  if (it == object.end()) {
    if (required) return Invalid(Child(path, key), "missing required field");
    return nullptr;
  }
  return &*it;
}

inline absl::StatusOr<const Json*> ObjectField(const Json& object, const std::string& path,
                                               std::string_view key, bool required) {
  auto field = Field(object, path, key, required);
  if (!field.ok() || *field == nullptr) return field;
  if (!(*field)->is_object()) {
    return Invalid(Child(path, key), absl::StrCat("expected an object, got ", TypeName(**field)));
  }
  return field;
}

inline absl::StatusOr<const Json*> ArrayField(const Json& object, const std::string& path,
                                              std::string_view key, bool required) {
  auto field = Field(object, path, key, required);
  if (!field.ok() || *field == nullptr) return field;
  if (!(*field)->is_array()) {
    return Invalid(Child(path, key), absl::StrCat("expected an array, got ", TypeName(**field)));
  }
  return field;
}

inline absl::StatusOr<std::string> StringField(const Json& object, const std::string& path,
                                               std::string_view key, bool required,
                                               std::string fallback = "") {
  auto field = Field(object, path, key, required);
  if (!field.ok()) return field.status();
  if (*field == nullptr) return fallback;
  if (!(*field)->is_string()) {
    return Invalid(Child(path, key), absl::StrCat("expected a string, got ", TypeName(**field)));
  }
  std::string value = (*field)->get<std::string>();
  if (required && value.empty()) return Invalid(Child(path, key), "must not be empty");
  return value;
}

inline absl::StatusOr<double> NumberField(const Json& object, const std::string& path,
                                          std::string_view key, bool required,
                                          double fallback = 0) {
  auto field = Field(object, path, key, required);
  if (!field.ok()) return field.status();
  if (*field == nullptr) return fallback;
  if (!(*field)->is_number()) {
    return Invalid(Child(path, key), absl::StrCat("expected a number, got ", TypeName(**field)));
  }
  double value = (*field)->get<double>();
  if (!std::isfinite(value)) return Invalid(Child(path, key), "must be finite");
  return value;
}

// `value` (at `path`) as an integer in [min, max]. An integer above INT64_MAX is refused here
// rather than read back as a negative one.
inline absl::StatusOr<int64_t> IntegerValue(const Json& value, const std::string& path,
                                            int64_t min = std::numeric_limits<int64_t>::min(),
                                            int64_t max = std::numeric_limits<int64_t>::max()) {
  if (!value.is_number_integer()) {
    return Invalid(path, absl::StrCat("expected an integer, got ", value.dump()));
  }
  const bool above = value.is_number_unsigned()
                         ? value.get<uint64_t>() > static_cast<uint64_t>(max < 0 ? 0 : max)
                         : value.get<int64_t>() > max;
  if (above || (!value.is_number_unsigned() && value.get<int64_t>() < min)) {
    return Invalid(path,
                   absl::StrCat("expected an integer in ", min, "..", max, ", got ", value.dump()));
  }
  return value.is_number_unsigned() ? static_cast<int64_t>(value.get<uint64_t>())
                                    : value.get<int64_t>();
}

inline absl::StatusOr<int64_t> IntegerField(const Json& object, const std::string& path,
                                            std::string_view key, bool required,
                                            int64_t fallback = 0) {
  auto field = Field(object, path, key, required);
  if (!field.ok()) return field.status();
  if (*field == nullptr) return fallback;
  return IntegerValue(**field, Child(path, key));
}

inline absl::StatusOr<bool> BoolField(const Json& object, const std::string& path,
                                      std::string_view key, bool fallback) {
  auto field = Field(object, path, key, false);
  if (!field.ok()) return field.status();
  if (*field == nullptr) return fallback;
  if (!(*field)->is_boolean()) {
    return Invalid(Child(path, key),
                   absl::StrCat("expected true or false, got ", (*field)->dump()));
  }
  return (*field)->get<bool>();
}

// Parses `text` as one JSON document; the error names `what` and the byte offset.
inline absl::StatusOr<Json> ParseJsonText(std::string_view text, std::string_view what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " is not valid JSON (", error.what(), ")"));
  }
}

// Reads and parses the JSON file at `path` (errors name the file).
inline absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseJsonText(*text, absl::StrCat("'", path, "'"));
}

}  // namespace plexus::base::json
