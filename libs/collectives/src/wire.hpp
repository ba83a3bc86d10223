// The header that travels with the first message of every call on each connection: it lets the
// receiver check that both ranks are in the same call with the same arguments, under the same
// live-reconfiguration epoch (docs/collectives.md, "Contract").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/collectives/types.hpp"

namespace plexus::collectives::internal {

struct CallHeader {
  static constexpr size_t kEncodedSize = 64;
  static constexpr uint32_t kMagic = 0x4C435850;  // "PXCL"
  static constexpr uint8_t kVersion = 1;

  CollectiveKind kind = CollectiveKind::kAllReduce;
  DataType dtype = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kRing;
  int32_t root = -1;
  int32_t sender = 0;
  uint64_t sequence = 0;  // collectives: call number; point-to-point: per-pair message number
  uint64_t count = 0;
  uint64_t extra = 0;  // AllToAllV: elements sent to the receiver
  uint64_t communicator = 0;
  // The element type on the wire when it differs from dtype (a fused cast, CallOptions::
  // wire_dtype); encoded in a byte that version 1 left zero, so uncast calls encode as before.
  std::optional<DataType> wire;
  // The configuration epoch the sender ran the call under (ActiveConfiguration::epoch: 0 as
  // created, then the epoch of the last live reconfiguration applied); bytes 56-63, which
  // version 1 left zero, so a communicator never reconfigured encodes as before. Not part of
  // SameCall: the executor checks it on its own, for collectives (not Send/Recv), so that a
  // mismatch names both epochs.
  uint64_t epoch = 0;
  // Device buffers moved device to device (device_peers.hpp): such a call travels only by
  // mailbox, whose header carries this, so a rank that staged through the host instead fails the
  // call as mismatched. Not encoded.
  bool device_peer = false;

  void Encode(uint8_t* out) const;
  // DataLoss for anything that is not a header of this version.
  static absl::StatusOr<CallHeader> Decode(absl::Span<const uint8_t> bytes);
  // "allreduce #3 (count 10, f32, sum, ring)".
  std::string Describe() const;
  // The fields both ranks of one call must agree on, compared.
  bool SameCall(const CallHeader& other) const;
};

}  // namespace plexus::collectives::internal
