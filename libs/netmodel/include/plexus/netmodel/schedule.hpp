// A collective's schedule: the one description of an algorithm in the network model. It lists
// the transfers the collective makes between positions 0..n-1 (a rank order says which node
// sits at each position), each with its bytes, the bulk-synchronous round it belongs to and the
// earlier transfers it waits for (a DAG). The cost models price a schedule against a cost
// matrix (PriceSchedule; reorder.hpp's models are a builder here and a Pricing), and the
// flow-level simulator runs it once PlaceSchedule has put a host at every position
// (flow_schedules.hpp does both for the simulator's allreduces). docs/netmodel.md, "Schedules".
//
//   auto ring = RingAllreduceSchedule(8, 100e6);                 // positions 0..7
//   double us = *PriceSchedule(*ring, Pricing::kRounds, matrix, order);
//   sim::Simulate(fabric, *PlaceSchedule(*ring, hosts));          // position p on hosts[p]
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/topology.hpp"

namespace plexus::netmodel {

// One transfer of `bytes` from `src` to `dst` (positions, or the simulator's endpoints once
// placed), started when every transfer in `after` (indices of EARLIER transfers) has finished.
// src == dst is a local step (a node that is its own parent in a tree): no link, no cost.
struct Transfer {
  int src = 0;
  int dst = 0;
  double bytes = 0;
  std::vector<int> after;
  int path = -1;  // simulator: equal-cost route (sim::Network::Paths), -1: the fixed hash
  int round = 0;  // the step of the algorithm it belongs to; rounds run one after the other
};

struct Schedule {
  std::string name;
  std::vector<Transfer> transfers;
  double bytes = 0;  // the buffer every rank contributes (S)
};

// How a cost model prices a schedule; c(t) is the cost matrix's cost of transfer t's bytes
// between the nodes at its positions, local steps excluded.
enum class Pricing : uint8_t {
  // Sum over rounds, in order, of the dearest transfer of the round: bulk-synchronous steps
  // (halving-doubling, BCube).
  kRounds,
  // The dearest dependency chain, first transfer to last: the sum of c(t) along it (the
  // double binary tree's root-to-leaf paths). Enumerates chains: for trees, not dense DAGs.
  kChains,
  // Sum over the links (ordered position pairs) the schedule uses, in order of first use, of
  // moving the whole buffer across it: a pipelined ring, whose pieces keep every hop busy, so
  // that the hops add up (the ring).
  kLinks,
};

// The cost (microseconds) of `schedule` with node order[p] at position p. InvalidArgument when
// a transfer names a position outside the order, or kChains finds too many chains.
absl::StatusOr<double> PriceSchedule(const Schedule& schedule, Pricing pricing,
                                     const CostMatrix& matrix, const std::vector<int>& order);

// Puts hosts[p] at position p: every transfer's ends become hosts. InvalidArgument when a
// transfer names a position outside hosts.
absl::StatusOr<Schedule> PlaceSchedule(Schedule schedule, std::span<const int> hosts);

// Allreduce schedules over n positions of a `bytes` buffer. Errors name the parameter.

// Bandwidth-optimal ring: reduce-scatter then all-gather, n-1 rounds each; in every round
// position r sends bytes/n to r+1 after its previous receive. `slices` > 1 cuts every round
// into that many independent pipelined pieces (round numbers shared).
absl::StatusOr<Schedule> RingAllreduceSchedule(int n, double bytes, int slices = 1);

// The order of the partners of recursive halving (recursive doubling runs it backwards).
enum class HalvingOrder : uint8_t {
  kFarFirst,   // partners p xor p2/2, ..., p xor 1: as the communicator runs it
  kNearFirst,  // partners p xor 1, p xor 2, ...: racks laid out in order exchange inside first
};
// Halving-doubling over the largest power of two p2 <= n: the first 2(n - p2) positions fold in
// pairwise (even -> odd, whole buffer), recursive halving in p2's log2 rounds (round k carries
// bytes / 2^(k+1)), recursive doubling back, then the fold out (odd -> even).
absl::StatusOr<Schedule> HalvingDoublingSchedule(int n, double bytes,
                                                 HalvingOrder order = HalvingOrder::kFarFirst);

// Double binary tree (NCCL's shape): an in-order tree over indices i..j rooted at (i+j)/2 whose
// children are the roots of [i, m-1] and [m+1, j]; the second tree is the first with every
// index decremented mod n; each tree carries half of the buffer. The allreduce reduces up both
// trees (a parent forwards once all its children have), then broadcasts down them; with
// `reduce` false only the broadcast (root to leaves; one round per depth).
absl::StatusOr<Schedule> DoubleBinaryTreeSchedule(int n, double bytes, bool reduce = true);

// BCube over n = base^d positions: in reduce-scatter round i every position sends
// bytes / base^(i+1) to the base-1 positions that differ from it in base-B digit i; then the
// all-gather rounds in reverse. InvalidArgument when n is not a power of base (base >= 2).
absl::StatusOr<Schedule> BCubeSchedule(int n, double bytes, int base);

// Fully sharded, colocated parameter server: every position owns 1/n of the buffer; push the
// other shards to their owners, then pull the reduced shards back. 2 rounds.
absl::StatusOr<Schedule> ShardedPsSchedule(int n, double bytes);

// The PLink dissertation's "Ring-Chunked": the whole buffer (in `chunks` pipelined pieces) is
// reduced once around the ring, 0 -> 1 -> ... -> n-1 -> 0, then broadcast along it,
// 0 -> 1 -> ... -> n-1: 2n-1 hops of the buffer each.
absl::StatusOr<Schedule> RingChunkedSchedule(int n, double bytes, int chunks = 1);

// Reduce up then broadcast down a tree of fan-out F over n = F^d positions, a parent being its
// own first child: level l joins groups of F positions spaced F^(l-1) apart into the first of
// them, so the tree has F + F^2 + ... + F^d edges, (n-1)/(F-1) of them local steps. 2d rounds.
absl::StatusOr<Schedule> FanoutTreeSchedule(int n, double bytes, int fanout);

}  // namespace plexus::netmodel
