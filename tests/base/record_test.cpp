// base::Record: round trips of every field type, and the strict decoder's refusals (another kind
// or version, a missing, duplicate, unknown, mistyped or oversized field, truncation, trailing
// bytes), each naming the kind and the field.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/record.hpp"

namespace pb = plexus::base;

namespace {

std::string Sample() {
  return pb::RecordWriter("test.sample", 3)
      .Int("count", -42)
      .String("name", std::string("bin\0ary", 7))
      .Ints("ranks", std::vector<int>{0, 2, 1})
      .Strings("hosts", std::vector<std::string>{"a", "", "[::1]:5"})
      .Finish();
}

// The error of decoding `bytes` as a test.sample record read the way Sample() is written.
absl::Status Decode(const std::string& bytes) {
  auto r = pb::RecordReader::Parse(bytes, "test.sample", 3);
  if (!r.ok()) return r.status();
  r->Int("count");
  r->String("name", 100);
  r->Ints<int>("ranks", 10, 0);
  r->Strings("hosts", 10, 100);
  return r->Finish();
}

void CheckRefused(const absl::Status& status, const std::string& says) {
  INFO(status.ToString());
  CHECK(absl::IsDataLoss(status));
  CHECK(absl::StrContains(status.message(), "test.sample record: "));
  CHECK(absl::StrContains(status.message(), says));
}

}  // namespace

TEST_CASE("record: every field type round-trips, in order", "[base][record]") {
  const std::string bytes = Sample();
  auto r = pb::RecordReader::Parse(bytes, "test.sample", 3);
  REQUIRE(r.ok());
  const std::vector<pb::RecordReader::FieldInfo> fields = r->Fields();
  REQUIRE(fields.size() == 4);
  CHECK(fields[0].name == "count");
  CHECK(fields[3].type == pb::RecordType::kStrings);
  CHECK(r->Has("ranks"));
  CHECK_FALSE(r->Has("absent"));
  CHECK(r->Int("count") == -42);
  CHECK(r->String("name", 7) == std::string("bin\0ary", 7));
  CHECK(r->Ints<int>("ranks", 3, 0, 2) == std::vector<int>{0, 2, 1});
  CHECK(r->Strings("hosts", 3, 7) == std::vector<std::string>{"a", "", "[::1]:5"});
  CHECK(r->Finish().ok());
  // Fixed layout: magic, kind, version 3, 4 fields, then "count" as a little-endian i64.
  CHECK(bytes.substr(0, 20) == std::string("PXRC\x0b"
                                           "test.sample\x03\x00\x04\x00",
                                           20));
  CHECK(bytes.substr(20, 7) == std::string("\x05"
                                           "count\x01",
                                           7));
  CHECK(pb::LoadLittleEndian<int64_t>(reinterpret_cast<const uint8_t*>(bytes.data()) + 27) == -42);
  // An empty record and empty lists are records too.
  const std::string empty = pb::RecordWriter("test.empty", 1)
                                .Ints("none", std::vector<int64_t>{})
                                .Strings("no_strings", std::vector<std::string>{})
                                .Finish();
  auto e = pb::RecordReader::Parse(empty, "test.empty", 1);
  REQUIRE(e.ok());
  CHECK(e->Ints<int64_t>("none", 0).empty());
  CHECK(e->Strings("no_strings", 0, 0).empty());
  CHECK(e->Finish().ok());
}

TEST_CASE("record: another kind, another version, or not a record at all", "[base][record]") {
  const std::string bytes = Sample();
  auto kind = pb::RecordReader::Parse(bytes, "test.other", 3);
  REQUIRE_FALSE(kind.ok());
  CHECK(absl::IsDataLoss(kind.status()));
  CHECK(absl::StrContains(kind.status().message(), "test.other record: is a 'test.sample' record"));
  auto version = pb::RecordReader::Parse(bytes, "test.sample", 4);
  REQUIRE_FALSE(version.ok());
  CHECK(absl::StrContains(version.status().message(), "version 3, this reader knows version 4"));
  CheckRefused(Decode("requester=1\nchannels=2\n"), "not a record");
  CheckRefused(Decode(""), "not a record");
}

TEST_CASE("record: every truncation and every extension is refused", "[base][record]") {
  const std::string bytes = Sample();
  for (size_t len = 0; len < bytes.size(); ++len) {
    INFO("truncated to " << len);
    CHECK_FALSE(pb::RecordReader::Parse(bytes.substr(0, len), "test.sample", 3).ok());
  }
  CheckRefused(Decode(bytes + "x"), "1 trailing bytes after the last field");
}

TEST_CASE("record: missing, duplicate, unknown and mistyped fields are refused by name",
          "[base][record]") {
  // Missing.
  CheckRefused(Decode(pb::RecordWriter("test.sample", 3)
                          .Int("count", 1)
                          .String("name", "n")
                          .Strings("hosts", std::vector<std::string>{})
                          .Finish()),
               "field 'ranks': is missing");
  // Twice.
  CheckRefused(Decode(pb::RecordWriter("test.sample", 3).Int("count", 1).Int("count", 2).Finish()),
               "field 'count': appears twice");
  // Unknown to the decoder (a newer writer's field).
  const std::string extra = pb::RecordWriter("test.sample", 3)
                                .Int("count", 1)
                                .String("name", "n")
                                .Ints("ranks", std::vector<int>{})
                                .Strings("hosts", std::vector<std::string>{})
                                .Int("surprise", 5)
                                .Finish();
  CheckRefused(Decode(extra), "unknown field 'surprise'");
  // Another type.
  CheckRefused(Decode(pb::RecordWriter("test.sample", 3).String("count", "12").Finish()),
               "field 'count': is a string, expected an integer");
  // A malformed name and an unknown type byte.
  CheckRefused(Decode(pb::RecordWriter("test.sample", 3).Int("Bad-Name", 1).Finish()),
               "name 'Bad-Name' is not");
  std::string unknown_type = pb::RecordWriter("test.sample", 3).Int("count", 1).Finish();
  unknown_type[20 + 1 + 5] = 9;  // header (20 bytes), name length, "count", type
  CheckRefused(Decode(unknown_type), "field 'count': unknown type 9");
}

TEST_CASE("record: values outside their bounds are refused, naming the field", "[base][record]") {
  auto decode = [](const std::string& bytes, auto&& read) {
    auto r = pb::RecordReader::Parse(bytes, "test.sample", 3);
    REQUIRE(r.ok());
    read(*r);
    return r->Finish();
  };
  const std::string bytes = Sample();
  CheckRefused(decode(bytes,
                      [](pb::RecordReader& r) {
                        r.Int("count", 0);
                        r.String("name", 100);
                        r.Ints<int>("ranks", 10);
                        r.Strings("hosts", 10, 100);
                      }),
               "field 'count': -42 is outside [0, ");
  CheckRefused(decode(bytes, [](pb::RecordReader& r) { r.String("name", 6); }),
               "field 'name': has 7 bytes, at most 6");
  CheckRefused(decode(bytes, [](pb::RecordReader& r) { r.Ints<int>("ranks", 2); }),
               "field 'ranks': has 3 entries, at most 2");
  CheckRefused(decode(bytes, [](pb::RecordReader& r) { r.Ints<int>("ranks", 3, 0, 1); }),
               "field 'ranks': entry 1 = 2 is outside [0, 1]");
  CheckRefused(decode(bytes, [](pb::RecordReader& r) { r.Strings("hosts", 2, 100); }),
               "field 'hosts': has 3 entries, at most 2");
  CheckRefused(decode(bytes, [](pb::RecordReader& r) { r.Strings("hosts", 3, 6); }),
               "field 'hosts': entry 2 has 7 bytes, at most 6");
  // An int64 that does not fit the type asked for.
  const std::string big =
      pb::RecordWriter("test.sample", 3).Int("count", int64_t{1} << 40).Finish();
  CheckRefused(decode(big, [](pb::RecordReader& r) { r.IntAs<int>("count"); }),
               "field 'count': 1099511627776 is outside [-2147483648, 2147483647]");
  // A caller's own check, reported the same way; the first error is the one that sticks.
  CheckRefused(decode(bytes,
                      [](pb::RecordReader& r) {
                        r.Int("count");
                        r.Fail("count", "disagrees with 'ranks'");
                        r.Fail("name", "second");
                      }),
               "field 'count': disagrees with 'ranks'");
}

TEST_CASE("record: a lying count is refused before anything is allocated", "[base][record]") {
  std::string bytes = pb::RecordWriter("test.sample", 3).Ints("ranks", std::vector<int>{}).Finish();
  // The count of "ranks" (after the header, the name length, "ranks" and the type).
  pb::StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(bytes.data()) + 20 + 1 + 5 + 1,
                                  0xffffffffu);
  CheckRefused(Decode(bytes), "field 'ranks': 4294967295 entries do not fit in the 0 bytes left");
  std::string strings =
      pb::RecordWriter("test.sample", 3).Strings("hosts", std::vector<std::string>{}).Finish();
  pb::StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(strings.data()) + 20 + 1 + 5 + 1,
                                  1u << 30);
  CheckRefused(Decode(strings), "field 'hosts': 1073741824 entries do not fit");
}
