// A collective's schedule: the one description of an algorithm in Plexus. It lists the
// transfers the collective makes between positions 0..n-1 (a rank order says which node sits at
// each position), each with its bytes, the bulk-synchronous round it belongs to, the earlier
// transfers it waits for (a DAG) and the pieces of the buffer it carries. The collectives
// runtime executes a schedule (each rank runs the transfers at its position, cut into chunks),
// the cost models price it against a cost matrix (PriceSchedule; reorder.hpp's models are a
// builder here and a Pricing), and the flow-level simulator runs it once PlaceSchedule has put a
// host at every position (flow_schedules.hpp does both for the simulator's allreduces).
// docs/netmodel.md, "Schedules".
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
  // What it carries, for an executable schedule (Schedule::pieces > 0): pieces first_piece,
  // first_piece + 1, ... (piece_count of them, modulo Schedule::pieces) of the buffer. The
  // receiver combines them into its own (`combine`: a reduction) or takes them as they are (a
  // result, or a block an all-gather collects).
  int first_piece = 0;
  int piece_count = 0;
  bool combine = false;
};

// An executable schedule obeys two rules the runtime relies on: rounds are numbered in the
// order of the transfers (so that within a run of equal rounds every position's sends read
// what it held before the round), and no position overwrites a piece it received before it has
// sent that piece on (a result replaces a partial sum only after the partial sum left).
struct Schedule {
  std::string name;
  std::vector<Transfer> transfers;
  double bytes = 0;  // the buffer every rank contributes (S)
  int pieces = 0;    // equal parts of the buffer the transfers name; 0: sizes only
};

// Which part of an allreduce a schedule runs: all of it, the reduce-scatter (each position ends
// with one reduced piece: the ring's (p + 1) mod n, halving's p) or the all-gather that starts
// from there.
enum class Phases : uint8_t { kAllReduce, kReduceScatter, kAllGather };

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
// position r sends bytes/n to r+1 after its previous receive: reduce-scatter step s carries
// piece (r - s) mod n, all-gather step t piece (r + 1 - t) mod n. `slices` > 1 cuts every round
// into that many independent pipelined pieces (round numbers shared; slice j's pieces are
// j*n .. j*n + n-1).
absl::StatusOr<Schedule> RingAllreduceSchedule(int n, double bytes, int slices = 1,
                                               Phases phases = Phases::kAllReduce);

// The order of the partners of recursive halving (recursive doubling runs it backwards).
enum class HalvingOrder : uint8_t {
  kFarFirst,   // partners p xor p2/2, ..., p xor 1: as the communicator runs it
  kNearFirst,  // partners p xor 1, p xor 2, ...: racks laid out in order exchange inside first
};
// Halving-doubling over the largest power of two p2 <= n: the first 2(n - p2) positions fold in
// pairwise (even -> odd, whole buffer), recursive halving in p2's log2 rounds (round k carries
// bytes / 2^(k+1): each core position keeps the half of its pieces on its side of the partner
// and sends the other), recursive doubling back, then the fold out (odd -> even). p2 pieces;
// far first, core position c ends the halving with piece c. Phases other than kAllReduce need
// n a power of two (no fold).
absl::StatusOr<Schedule> HalvingDoublingSchedule(int n, double bytes,
                                                 HalvingOrder order = HalvingOrder::kFarFirst,
                                                 Phases phases = Phases::kAllReduce);

// Recursive doubling of the whole buffer (small messages): the fold of halving-doubling, then in
// round k every core position exchanges the whole buffer with the one whose index differs in
// bit k, both combining; then the fold out. One piece.
absl::StatusOr<Schedule> RecursiveDoublingSchedule(int n, double bytes);

// Bruck's all-gather: every position contributes `bytes` (piece p is position p's block; the
// result is n pieces). In round d = 1, 2, 4, ... < n position p sends the m = min(d, n - d)
// pieces p .. p + m - 1 it holds by then to position p - d: ceil(log2 n) rounds at any n.
absl::StatusOr<Schedule> BruckAllgatherSchedule(int n, double bytes);

// Double binary tree (NCCL's shape): an in-order tree over indices i..j rooted at (i+j)/2 whose
// children are the roots of [i, m-1] and [m+1, j]; the second tree is the first with every
// index decremented mod n; each tree carries half of the buffer (piece 0 the first tree's, 1 the
// second's). The allreduce reduces up both trees (a parent forwards once all its children
// have), then broadcasts down them; with `reduce` false only the broadcast (root to leaves; one
// round per depth).
absl::StatusOr<Schedule> DoubleBinaryTreeSchedule(int n, double bytes, bool reduce = true);

// BCube over n = base^d positions: in reduce-scatter round i every position sends
// bytes / base^(i+1) to the base-1 positions that differ from it in base-B digit i; then the
// all-gather rounds in reverse. InvalidArgument when n is not a power of base (base >= 2).
absl::StatusOr<Schedule> BCubeSchedule(int n, double bytes, int base);

// Fully sharded, colocated parameter server: every position owns 1/n of the buffer (piece p);
// push the other shards to their owners, then pull the reduced shards back. 2 rounds.
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
