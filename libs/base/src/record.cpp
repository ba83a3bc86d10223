// Records (record.hpp). Depends on Abseil and base's byte-order header only, so that the fuzzers
// (tests/fuzz) compile it beside the decoders that use it.
#include "plexus/base/record.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::base {
namespace {

constexpr std::string_view kMagic = "PXRC";

// Abseil's own string_view on some distributions: StrCat takes std::string_view through this.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > kMaxRecordNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Printable for an error message: the name as written, cut and with odd bytes replaced.
std::string Printable(std::string_view text) {
  std::string out(text.substr(0, std::min<size_t>(text.size(), kMaxRecordNameBytes)));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

}  // namespace

const char* RecordTypeName(RecordType type) {
  static constexpr const char* kNames[] = {"an integer", "a string", "a list of integers",
                                           "a list of strings"};
  const size_t index = static_cast<size_t>(type) - 1;  // kInt is 1
  return index < std::size(kNames) ? kNames[index] : "of an unknown type";
}

RecordWriter::RecordWriter(std::string_view kind, uint16_t version) {
  out_.append(kMagic);
  const std::string_view k = kind.substr(0, std::min(kind.size(), kMaxRecordKindBytes));
  AppendLittleEndian<uint8_t>(out_, static_cast<uint8_t>(k.size()));
  out_.append(k);
  AppendLittleEndian<uint16_t>(out_, version);
  count_at_ = out_.size();
  AppendLittleEndian<uint16_t>(out_, 0);
}

void RecordWriter::BeginField(std::string_view name, RecordType type) {
  const std::string_view n = name.substr(0, std::min(name.size(), kMaxRecordNameBytes));
  AppendLittleEndian<uint8_t>(out_, static_cast<uint8_t>(n.size()));
  out_.append(n);
  AppendLittleEndian<uint8_t>(out_, static_cast<uint8_t>(type));
  ++fields_;
}

void RecordWriter::AppendCount(size_t count) {
  AppendLittleEndian<uint32_t>(out_, static_cast<uint32_t>(count));
}

void RecordWriter::AppendInt(int64_t v) { AppendLittleEndian<int64_t>(out_, v); }

RecordWriter& RecordWriter::Int(std::string_view name, int64_t value) {
  BeginField(name, RecordType::kInt);
  AppendInt(value);
  return *this;
}

RecordWriter& RecordWriter::String(std::string_view name, std::string_view value) {
  BeginField(name, RecordType::kString);
  AppendCount(value.size());
  out_.append(value);
  return *this;
}

RecordWriter& RecordWriter::Strings(std::string_view name, absl::Span<const std::string> values) {
  BeginField(name, RecordType::kStrings);
  AppendCount(values.size());
  for (const std::string& v : values) {
    AppendCount(v.size());
    out_.append(v);
  }
  return *this;
}

std::string RecordWriter::Finish() {
  StoreLittleEndian<uint16_t>(reinterpret_cast<uint8_t*>(out_.data()) + count_at_, fields_);
  return std::move(out_);
}

absl::StatusOr<RecordReader> RecordReader::Parse(std::string_view bytes, std::string_view kind,
                                                 uint16_t version) {
  const std::string want(kind);
  const auto bad = [&](std::string_view why) {
    return absl::DataLossError(absl::StrCat(want, " record: ", Sv(why)));
  };
  CheckedByteReader r(bytes);
  std::string_view magic, theirs;
  uint8_t kind_bytes = 0;
  uint16_t their_version = 0, count = 0;
  if (!r.Bytes(kMagic.size(), &magic) || magic != kMagic) {
    return bad("not a record (no PXRC magic): written by something else, or corrupted");
  }
  if (!r.U8(&kind_bytes) || !r.Bytes(kind_bytes, &theirs) || !r.U16(&their_version) ||
      !r.U16(&count)) {
    return bad(absl::StrCat("header ", r.error()));
  }
  if (theirs != kind) return bad(absl::StrCat("is a '", Printable(theirs), "' record"));
  if (their_version != version) {
    return bad(absl::StrCat("version ", their_version, ", this reader knows version ", version));
  }
  if (count > kMaxRecordFields) {
    return bad(absl::StrCat(count, " fields, at most ", kMaxRecordFields));
  }
  RecordReader out(want, std::string(bytes));
  for (uint16_t i = 0; i < count; ++i) {
    uint8_t name_bytes = 0, type = 0;
    std::string_view name;
    if (!r.U8(&name_bytes) || !r.Bytes(name_bytes, &name)) {
      return bad(absl::StrCat("field ", i, "'s name: ", r.error()));
    }
    if (!ValidName(name)) {
      return bad(absl::StrCat("field ", i, "'s name '", Printable(name),
                              "' is not 1..64 characters of [a-z0-9_]"));
    }
    const auto field_error = [&](std::string_view why) {
      return bad(absl::StrCat("field '", Sv(name), "': ", Sv(why)));
    };
    if (out.Has(name)) return field_error("appears twice");
    if (!r.U8(&type)) return field_error(r.error());
    Field f{std::string(name), static_cast<RecordType>(type), 0, 0, 0};
    uint32_t length = 0;
    std::string_view value;
    // A list's count, checked against the bytes left before anything is sized by it (each entry
    // takes at least `entry_bytes`), so that a lying count neither overflows nor allocates.
    const auto read_count = [&](size_t entry_bytes) {
      if (!r.U32(&f.count)) return field_error(r.error());
      if (f.count > r.remaining() / entry_bytes) {
        return field_error(
            absl::StrCat(f.count, " entries do not fit in the ", r.remaining(), " bytes left"));
      }
      f.offset = r.offset();
      return absl::OkStatus();
    };
    switch (f.type) {
      case RecordType::kInt:
        f.offset = r.offset();
        f.size = sizeof(int64_t);
        if (!r.Bytes(f.size, &value)) return field_error(r.error());
        break;
      case RecordType::kString:
        if (!r.U32(&length)) return field_error(r.error());
        f.offset = r.offset();
        f.size = length;
        if (!r.Bytes(length, &value)) return field_error(r.error());
        break;
      case RecordType::kInts:
        if (absl::Status s = read_count(sizeof(int64_t)); !s.ok()) return s;
        f.size = size_t{f.count} * sizeof(int64_t);
        r.Bytes(f.size, &value);
        break;
      case RecordType::kStrings:
        if (absl::Status s = read_count(sizeof(uint32_t)); !s.ok()) return s;
        for (uint32_t k = 0; k < f.count; ++k) {
          if (!r.U32(&length) || !r.Bytes(length, &value)) {
            return field_error(absl::StrCat("entry ", k, ": ", r.error()));
          }
        }
        f.size = r.offset() - f.offset;
        break;
      default:
        return field_error(absl::StrCat("unknown type ", static_cast<int>(type)));
    }
    out.fields_.push_back(std::move(f));
  }
  if (r.remaining() != 0) {
    return bad(absl::StrCat(r.remaining(), " trailing bytes after the last field"));
  }
  return out;
}

bool RecordReader::Has(std::string_view name) const {
  return std::any_of(fields_.begin(), fields_.end(),
                     [&](const Field& f) { return f.name == name; });
}

void RecordReader::Fail(std::string_view name, std::string_view why) {
  if (error_.empty()) error_ = absl::StrCat("field '", Sv(name), "': ", Sv(why));
}

RecordReader::Field* RecordReader::Find(std::string_view name, RecordType type) {
  if (!error_.empty()) return nullptr;
  for (Field& f : fields_) {
    if (f.name != name) continue;
    f.read = true;
    if (f.type != type) {
      Fail(name, absl::StrCat("is ", RecordTypeName(f.type), ", expected ", RecordTypeName(type)));
      return nullptr;
    }
    return &f;
  }
  Fail(name, "is missing");
  return nullptr;
}

const RecordReader::Field* RecordReader::FindList(std::string_view name, RecordType type,
                                                  size_t max_count) {
  const Field* f = Find(name, type);
  if (f != nullptr && f->count > max_count) {
    Fail(name, absl::StrCat("has ", f->count, " entries, at most ", max_count));
    return nullptr;
  }
  return f;
}

int64_t RecordReader::Int(std::string_view name, int64_t min, int64_t max) {
  const Field* f = Find(name, RecordType::kInt);
  if (f == nullptr) return 0;
  const int64_t v =
      LoadLittleEndian<int64_t>(reinterpret_cast<const uint8_t*>(bytes_.data()) + f->offset);
  if (v < min || v > max) {
    Fail(name, absl::StrCat(v, " is outside [", min, ", ", max, "]"));
    return 0;
  }
  return v;
}

std::string RecordReader::String(std::string_view name, size_t max_bytes) {
  const Field* f = Find(name, RecordType::kString);
  if (f == nullptr) return {};
  if (f->size > max_bytes) {
    Fail(name, absl::StrCat("has ", f->size, " bytes, at most ", max_bytes));
    return {};
  }
  return bytes_.substr(f->offset, f->size);
}

std::vector<int64_t> RecordReader::IntList(std::string_view name, size_t max_count, int64_t min,
                                           int64_t max) {
  const Field* f = FindList(name, RecordType::kInts, max_count);
  if (f == nullptr) return {};
  std::vector<int64_t> out(f->count);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes_.data()) + f->offset;
  for (uint32_t k = 0; k < f->count; ++k) {
    out[k] = LoadLittleEndian<int64_t>(p + k * sizeof(int64_t));
    if (out[k] < min || out[k] > max) {
      Fail(name, absl::StrCat("entry ", k, " = ", out[k], " is outside [", min, ", ", max, "]"));
      return {};
    }
  }
  return out;
}

std::vector<std::string> RecordReader::Strings(std::string_view name, size_t max_count,
                                               size_t max_bytes) {
  const Field* f = FindList(name, RecordType::kStrings, max_count);
  if (f == nullptr) return {};
  // Parse checked every length against the bytes.
  CheckedByteReader r(std::string_view(bytes_).substr(f->offset, f->size));
  std::vector<std::string> out;
  for (uint32_t k = 0; k < f->count; ++k) {
    uint32_t length = 0;
    std::string_view value;
    r.U32(&length);
    r.Bytes(length, &value);
    if (value.size() > max_bytes) {
      Fail(name, absl::StrCat("entry ", k, " has ", value.size(), " bytes, at most ", max_bytes));
      return {};
    }
    out.emplace_back(value);
  }
  return out;
}

absl::Status RecordReader::Finish() const {
  std::string error = error_;
  for (const Field& f : fields_) {
    if (!error.empty()) break;
    if (!f.read)
      error = absl::StrCat("unknown field '", f.name, "' (", RecordTypeName(f.type), ")");
  }
  if (error.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(kind_, " record: ", error));
}

std::vector<RecordReader::FieldInfo> RecordReader::Fields() const {
  std::vector<FieldInfo> out;
  for (const Field& f : fields_) out.push_back({f.name, f.type});
  return out;
}

}  // namespace plexus::base
