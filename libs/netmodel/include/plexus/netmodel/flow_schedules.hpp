// Allreduce schedules for the flow simulator (flow_sim.hpp): netmodel's schedules
// (schedule.hpp) with rank r placed on host `hosts[r]` (a rank order; one rank per host);
// `bytes` is the buffer every rank contributes (S in the PLink dissertation's Table 4.1).
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "plexus/netmodel/flow_sim.hpp"
#include "plexus/netmodel/schedule.hpp"

namespace plexus::netmodel::sim {

// Fully sharded, colocated parameter server: every rank owns 1/P of the buffer; push the other
// shards to their owners, then pull the reduced shards back. 2 rounds.
absl::StatusOr<Schedule> ShardedPsSchedule(std::span<const int> hosts, double bytes);

// Bandwidth-optimal ring (reduce-scatter then allgather, P-1 steps each, S/P per step), as NCCL
// and Gloo's ring run it. `slices` > 1 cuts each step into that many pipelined pieces.
absl::StatusOr<Schedule> RingSchedule(std::span<const int> hosts, double bytes, int slices = 1);

// The dissertation's "Ring-Chunked": the whole buffer (in `chunks` pipelined pieces) is reduced
// once around the ring, rank 0 -> 1 -> ... -> P-1 -> 0, then broadcast along it,
// 0 -> 1 -> ... -> P-1: 2P-1 hops of S each.
absl::StatusOr<Schedule> RingChunkedSchedule(std::span<const int> hosts, double bytes,
                                             int chunks = 1);

// Recursive halving (reduce-scatter) then recursive doubling (allgather); P a power of two;
// partners at distance 1, 2, 4, ... in the reduce-scatter (HalvingOrder::kNearFirst), so that
// ranks laid out rack by rack exchange inside the rack while the pieces are large.
absl::StatusOr<Schedule> HalvingDoublingSchedule(std::span<const int> hosts, double bytes);

// Reduce up then broadcast down a tree of fan-out F over P = F^d ranks, with the dissertation's
// convention that a parent is its own first child: level l joins groups of F ranks spaced F^(l-1)
// apart into the first of them, so each level has P / F^(l-1) members and the tree has
// F + F^2 + ... + F^d edges, (P-1)/(F-1) of them a rank to itself (local transfers, no wire).
// 2d rounds.
absl::StatusOr<Schedule> TreeSchedule(std::span<const int> hosts, double bytes, int fanout);

}  // namespace plexus::netmodel::sim
