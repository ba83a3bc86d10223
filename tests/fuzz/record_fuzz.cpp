// libFuzzer target for base::Record's decoder (libs/base/src/record.cpp), which reads what other
// processes wrote to the store or sent during a set-up. The first byte picks the version asked
// for and whether the rest is taken whole or as the fields after a valid header (so that short
// runs reach the fields). Nothing may crash, read out of bounds or allocate beyond the input; a
// record that parses re-encodes, field by field, to the same bytes; tight bounds fail cleanly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "plexus/base/byte_order.hpp"
#include "plexus/base/record.hpp"

namespace pb = plexus::base;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  constexpr std::string_view kKind = "fuzz";
  const uint16_t version = data[0] % 3;
  std::string bytes;
  if ((data[0] & 0x80) != 0) {
    bytes = pb::RecordWriter(kKind, version).Finish();  // the header, no field yet
    pb::StoreLittleEndian<uint16_t>(reinterpret_cast<uint8_t*>(bytes.data()) + bytes.size() - 2,
                                    data[1] % 8);
    bytes.append(reinterpret_cast<const char*>(data + 2), size - 2);
  } else {
    bytes.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  auto r = pb::RecordReader::Parse(bytes, kKind, version);
  if (!r.ok()) return 0;
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  pb::RecordWriter w(kKind, version);
  for (const pb::RecordReader::FieldInfo& f : r->Fields()) {
    switch (f.type) {
      case pb::RecordType::kInt:
        w.Int(f.name, r->Int(f.name));
        break;
      case pb::RecordType::kString:
        w.String(f.name, r->String(f.name, kAny));
        break;
      case pb::RecordType::kInts:
        w.Ints(f.name, r->Ints<int64_t>(f.name, kAny));
        break;
      case pb::RecordType::kStrings:
        w.Strings(f.name, r->Strings(f.name, kAny, kAny));
        break;
    }
  }
  if (!r->Finish().ok() || w.Finish() != bytes) std::abort();
  // The same record read with bounds nothing satisfies: an error, never a crash.
  auto tight = pb::RecordReader::Parse(bytes, kKind, version);
  if (!tight.ok()) std::abort();
  for (const pb::RecordReader::FieldInfo& f : tight->Fields()) {
    tight->Int(f.name, 1, 0);
    tight->String(f.name, 0);
    tight->Ints<int>(f.name, 0);
    tight->Strings(f.name, 0, 0);
  }
  if (!tight->Fields().empty() && tight->Finish().ok()) std::abort();
  return 0;
}
