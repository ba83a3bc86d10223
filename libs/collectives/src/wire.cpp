#include "wire.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::collectives::internal {
namespace {

// Fixed-width field of `bytes` (1, 4 or 8) at `at`.
void Put(uint8_t* out, size_t at, uint64_t v, size_t bytes) {
  switch (bytes) {
    case 1:
      return base::StoreLittleEndian(out + at, static_cast<uint8_t>(v));
    case 4:
      return base::StoreLittleEndian(out + at, static_cast<uint32_t>(v));
    default:
      return base::StoreLittleEndian(out + at, v);
  }
}
uint64_t Get(const uint8_t* in, size_t at, size_t bytes) {
  switch (bytes) {
    case 1:
      return base::LoadLittleEndian<uint8_t>(in + at);
    case 4:
      return base::LoadLittleEndian<uint32_t>(in + at);
    default:
      return base::LoadLittleEndian<uint64_t>(in + at);
  }
}

}  // namespace

void CallHeader::Encode(uint8_t* out) const {
  std::memset(out, 0, kEncodedSize);
  Put(out, 0, kMagic, 4);
  Put(out, 4, kVersion, 1);
  Put(out, 5, static_cast<uint8_t>(kind), 1);
  Put(out, 6, static_cast<uint8_t>(dtype), 1);
  Put(out, 7, static_cast<uint8_t>(op), 1);
  Put(out, 8, static_cast<uint8_t>(algorithm), 1);
  Put(out, 9, wire.has_value() ? 1 + static_cast<uint8_t>(*wire) : 0, 1);
  Put(out, 12, static_cast<uint32_t>(root), 4);
  Put(out, 16, static_cast<uint32_t>(sender), 4);
  Put(out, 24, sequence, 8);
  Put(out, 32, count, 8);
  Put(out, 40, extra, 8);
  Put(out, 48, communicator, 8);
  Put(out, 56, epoch, 8);
}

absl::StatusOr<CallHeader> CallHeader::Decode(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kEncodedSize) {
    return absl::DataLossError(absl::StrCat("call header truncated (", bytes.size(), " bytes)"));
  }
  const uint8_t* in = bytes.data();
  if (Get(in, 0, 4) != kMagic || Get(in, 4, 1) != kVersion) {
    return absl::DataLossError("message does not start with a call header");
  }
  CallHeader h;
  const uint64_t kind = Get(in, 5, 1), dtype = Get(in, 6, 1), op = Get(in, 7, 1),
                 algorithm = Get(in, 8, 1), wire = Get(in, 9, 1);
  if (kind >= kNumCollectiveKinds || dtype >= kNumDataTypes || op >= kNumReduceOps ||
      algorithm >= kNumAlgorithms || wire > kNumDataTypes) {
    return absl::DataLossError("call header with out-of-range fields");
  }
  h.kind = static_cast<CollectiveKind>(kind);
  h.dtype = static_cast<DataType>(dtype);
  h.op = static_cast<ReduceOp>(op);
  h.algorithm = static_cast<Algorithm>(algorithm);
  if (wire > 0) h.wire = static_cast<DataType>(wire - 1);
  h.root = static_cast<int32_t>(static_cast<uint32_t>(Get(in, 12, 4)));
  h.sender = static_cast<int32_t>(static_cast<uint32_t>(Get(in, 16, 4)));
  h.sequence = Get(in, 24, 8);
  h.count = Get(in, 32, 8);
  h.extra = Get(in, 40, 8);
  h.communicator = Get(in, 48, 8);
  h.epoch = Get(in, 56, 8);
  return h;
}

std::string CallHeader::Describe() const {
  std::string out = absl::StrCat(std::string(CollectiveName(kind)), " #", sequence, " (count ",
                                 count, ", ", std::string(DataTypeName(dtype)));
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduce ||
      kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&out, ", ", std::string(ReduceOpName(op)));
  }
  if (root >= 0) absl::StrAppend(&out, ", root ", root);
  if (kind == CollectiveKind::kAllToAllV) absl::StrAppend(&out, ", ", extra, " elements to peer");
  if (wire.has_value()) {
    absl::StrAppend(&out, ", ", std::string(DataTypeName(*wire)), " on the wire");
  }
  if (device_peer) absl::StrAppend(&out, ", device buffers by peer access");
  absl::StrAppend(&out, ", ", std::string(AlgorithmName(algorithm)), ")");
  return out;
}

bool CallHeader::SameCall(const CallHeader& o) const {
  return kind == o.kind && dtype == o.dtype && op == o.op && algorithm == o.algorithm &&
         root == o.root && sequence == o.sequence && count == o.count &&
         communicator == o.communicator && wire == o.wire;
}

}  // namespace plexus::collectives::internal
