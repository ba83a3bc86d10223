// Records: the one encoding of the small structured values Plexus processes hand each other
// through the rendezvous store or a set-up connection (collectives' reconfiguration requests and
// blame records, moe's membership values, multipath's set-up messages). A record is a kind, a
// version and named, typed fields, in the order written:
//
//   std::string bytes = base::RecordWriter("moe.alive", 1).Int("step", 12).Int("generation", 3)
//                           .Finish();
//
//   PLEXUS_ASSIGN_OR_RETURN(base::RecordReader r, base::RecordReader::Parse(bytes, "moe.alive",
//   1)); v.step = r.Int("step", 0);                // at least 0 v.generation = r.Int("generation",
//   0); PLEXUS_RETURN_IF_ERROR(r.Finish());       // the first error, or a field nobody read
//
// Decoding is strict, because the bytes come from another process: Parse refuses another kind or
// version, a truncated field, a field twice, an unknown type, a malformed name and trailing bytes;
// the getters refuse a missing field, a field of another type and a value outside its bounds
// (range, bytes, entries); Finish refuses a field the decoder did not ask for. Every error is
// DataLoss naming the kind and the field. Getters after an error return zero values; the first
// error is the one reported. Parse allocates no more than the input's size.
//
// Wire form (little-endian): "PXRC" | u8 kind length | kind | u16 version | u16 field count |
// fields; a field is u8 name length | name ([a-z0-9_], 1..kMaxRecordNameBytes) | u8 type | value:
//   int      i64
//   string   u32 length | bytes
//   ints     u32 count | count x i64
//   strings  u32 count | count x (u32 length | bytes)
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::base {

inline constexpr size_t kMaxRecordFields = 64;
inline constexpr size_t kMaxRecordNameBytes = 64;
inline constexpr size_t kMaxRecordKindBytes = 64;

enum class RecordType : uint8_t { kInt = 1, kString = 2, kInts = 3, kStrings = 4 };
const char* RecordTypeName(RecordType type);

class RecordWriter {
 public:
  // `kind` names what the record is ("moe.ticket"); readers ask for it and for `version`.
  RecordWriter(std::string_view kind, uint16_t version);

  // Field names are [a-z0-9_] and distinct within a record (a reader refuses a record that breaks
  // either).
  RecordWriter& Int(std::string_view name, int64_t value);
  RecordWriter& String(std::string_view name, std::string_view value);
  RecordWriter& Strings(std::string_view name, absl::Span<const std::string> values);
  template <typename T>
  RecordWriter& Ints(std::string_view name, absl::Span<const T> values) {
    static_assert(std::is_integral_v<T> && std::is_signed_v<T>, "record ints are int64_t");
    BeginField(name, RecordType::kInts);
    AppendCount(values.size());
    for (const T v : values) AppendInt(static_cast<int64_t>(v));
    return *this;
  }
  template <typename T>
  RecordWriter& Ints(std::string_view name, const std::vector<T>& values) {
    return Ints(name, absl::MakeConstSpan(values));
  }

  // The record's bytes (the writer is spent: call once, last).
  std::string Finish();

 private:
  void BeginField(std::string_view name, RecordType type);
  void AppendCount(size_t count);
  void AppendInt(int64_t v);

  std::string out_;
  size_t count_at_ = 0;
  uint16_t fields_ = 0;
};

class RecordReader {
 public:
  // Parses the header and every field of `bytes` (see the file comment).
  static absl::StatusOr<RecordReader> Parse(std::string_view bytes, std::string_view kind,
                                            uint16_t version);

  // Whether the record has a field `name` (an optional field; a present one must still be read).
  bool Has(std::string_view name) const;

  // Required fields; a missing one, one of another type or out of bounds is an error.
  int64_t Int(std::string_view name, int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max());
  // An Int within T's range (and [min, max]), as a T.
  template <typename T>
  T IntAs(std::string_view name, T min = std::numeric_limits<T>::lowest(),
          T max = std::numeric_limits<T>::max()) {
    static_assert(std::is_integral_v<T> && std::is_signed_v<T>, "record ints are int64_t");
    return static_cast<T>(Int(name, min, max));
  }
  std::string String(std::string_view name, size_t max_bytes);
  // At most `max_count` entries, each within [min, max] (and T's range).
  template <typename T>
  std::vector<T> Ints(std::string_view name, size_t max_count,
                      T min = std::numeric_limits<T>::lowest(),
                      T max = std::numeric_limits<T>::max()) {
    static_assert(std::is_integral_v<T> && std::is_signed_v<T>, "record ints are int64_t");
    std::vector<T> out;
    for (int64_t v : IntList(name, max_count, min, max)) out.push_back(static_cast<T>(v));
    return out;
  }
  // At most `max_count` strings of at most `max_bytes` each.
  std::vector<std::string> Strings(std::string_view name, size_t max_count, size_t max_bytes);

  // Records an error about field `name` (a value the getters cannot judge, such as two fields
  // that disagree); the first error sticks.
  void Fail(std::string_view name, std::string_view why);
  bool ok() const { return error_.empty(); }

  // OK when every getter succeeded and every field was read; else DataLoss naming the kind and
  // the field.
  absl::Status Finish() const;

  struct FieldInfo {
    std::string name;
    RecordType type;
  };
  // The fields, in the order written (for generic tools and the fuzzer).
  std::vector<FieldInfo> Fields() const;

 private:
  struct Field {
    std::string name;
    RecordType type;
    size_t offset;   // of the value in bytes_ (after a count, for lists)
    size_t size;     // of the value in bytes (lists: of every entry, with their lengths)
    uint32_t count;  // entries, for lists
    bool read = false;
  };

  RecordReader(std::string kind, std::string bytes)
      : kind_(std::move(kind)), bytes_(std::move(bytes)) {}
  Field* Find(std::string_view name, RecordType type);
  // Find, and at most `max_count` entries.
  const Field* FindList(std::string_view name, RecordType type, size_t max_count);
  std::vector<int64_t> IntList(std::string_view name, size_t max_count, int64_t min, int64_t max);

  std::string kind_;
  std::string bytes_;
  std::vector<Field> fields_;
  std::string error_;
};

}  // namespace plexus::base
