// Vocabulary of the collectives library: element types, reduction operators, algorithms and
// collective kinds, with their names for logs, tables and command lines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "absl/status/statusor.h"
#include "plexus/kernels/types.hpp"

namespace plexus::collectives {

// Element types and reduction operators are the kernels' (plexus/kernels/types.hpp).
using kernels::DataType;
using kernels::DataTypeName;
using kernels::DataTypeSize;
using kernels::kNumDataTypes;
using kernels::kNumReduceOps;
using kernels::ParseDataType;
using kernels::ParseReduceOp;
using kernels::ReduceOp;
using kernels::ReduceOpName;

// How a collective moves its data (docs/collectives.md gives steps and bytes on the wire). Each
// has its name at its index in kAlgorithmNames below; which collectives it implements is the
// plan-builder table's (src/algorithms.cpp).
enum class Algorithm : uint8_t {
  kAuto = 0,             // chosen by the selector (size, world size, table, overrides)
  kRing = 1,             // pipelined, chunked ring over every channel: bandwidth-optimal
  kHalvingDoubling = 2,  // recursive halving/doubling (any world size): log2(n) steps
  kTree = 3,             // double binary tree, pipelined: log2(n) depth, for latency-bound sizes
  // AllReduce: log2(n) exchanges of the whole vector at any size (halving-doubling does this
  // below 16 KiB): fewer bytes-independent steps, more bytes. Elsewhere as kHalvingDoubling.
  kRecursiveDoubling = 4,
  // AllGather: Bruck's ceil(log2(n)) rounds at any world size (the ring's bytes). Elsewhere as
  // kRing.
  kBruck = 5,
};
// Also parsed: "hd", "rhd" (halving_doubling), "rd" (recursive_doubling).
inline constexpr std::string_view kAlgorithmNames[] = {
    "auto", "ring", "halving_doubling", "tree", "recursive_doubling", "bruck"};
inline constexpr int kNumAlgorithms = static_cast<int>(std::size(kAlgorithmNames));
std::string_view AlgorithmName(Algorithm algorithm);
absl::StatusOr<Algorithm> ParseAlgorithm(std::string_view name);

// The operations of a communicator, as named in selector tables and mismatch errors.
enum class CollectiveKind : uint8_t {
  kAllReduce = 0,
  kReduce = 1,
  kBroadcast = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kAllToAll = 5,
  kAllToAllV = 6,
  kSendRecv = 7,  // point-to-point Send/Recv
  kBarrier = 8,
};
inline constexpr int kNumCollectiveKinds = 9;
// "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "alltoallv",
// "sendrecv", "barrier".
std::string_view CollectiveName(CollectiveKind kind);
absl::StatusOr<CollectiveKind> ParseCollective(std::string_view name);

// How a communicator that creates its devices picks the transport of each peer
// (docs/collectives.md, "Transport per peer").
enum class TransportPolicy : uint8_t {
  // Ranks on this host over shm (with mailboxes), ranks on other hosts over device.backend (tcp
  // when that is shm). With device.backend kInproc every peer is inproc.
  kPerPeer = 0,
  // device.backend for every peer (to measure or test one backend).
  kUniform = 1,
};

// The most channels a communicator connects (CommunicatorOptions::channels,
// Reconfiguration::channels).
inline constexpr int kMaxChannels = 64;

}  // namespace plexus::collectives
