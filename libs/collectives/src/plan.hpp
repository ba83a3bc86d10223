// A collective as data: the messages each rank sends and receives, with the dependencies that
// make the schedule correct, pipelined and deterministic. The plan builders (algorithms.cpp)
// lower the network model's schedules (plexus/netmodel/schedule.hpp) to plans, or build the
// rooted and point-to-point ones directly; the communicator's executor runs them over the
// connections.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/collectives/types.hpp"
#include "plexus/netmodel/schedule.hpp"

namespace plexus::collectives::internal {

// Messages between a pair of ranks on one channel are matched in the order the plan lists them,
// so two ranks' plans must list the messages they exchange on each (peer, channel) in the same
// order. Every algorithm here is written so that this holds by construction.
struct SendOp {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int peer = 0;  // rank
  int channel = 0;
  int dep = -1;        // a recv (index) that must be finished before posting
  int dep_prefix = 0;  // every recv with a lower index must be finished before posting
  // The data is a final result of the call (all-gather phases, broadcasts). With a wire cast the
  // sender keeps the rounded value it sends (data then points into the call's output), so that
  // every rank, the owner included, ends with the same bits.
  bool final = false;
};

struct RecvOp {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int peer = 0;
  int channel = 0;
  bool reduce = false;     // data = data op incoming (else the bytes are placed at data)
  bool src_first = false;  // reduce as incoming op data
  // Reduce out of place: data = local op incoming (src_first: incoming op local), so that data
  // need not hold this rank's operand beforehand. Null: the operand is at data.
  const uint8_t* local = nullptr;
  int war_prefix = 0;  // every send with a lower index must have completed before writing
};

// Reductions are applied in recv index order (never arrival order): that is what makes results
// bit-identical from run to run.
struct Plan {
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  // Per peer rank: the `extra` word of the header this rank sends, and the value it expects from
  // that peer (AllToAllV counts). Empty = zeros.
  std::vector<uint64_t> tx_extra;
  std::vector<uint64_t> rx_extra;
  // A fused cast (CallOptions::wire_dtype): the buffers hold f32, every message travels as this
  // type. Each send converts its chunk while packing it into a send slot; each receive lands in a
  // slot and is converted into place, or reduced into its f32 destination, in one pass.
  std::optional<DataType> wire;
};

// Where the ranks sit and how data is cut.
struct Layout {
  int rank = 0;
  int n = 1;
  std::vector<int> order;     // ring position -> rank
  std::vector<int> position;  // rank -> ring position
  int channels = 1;
  size_t chunk_bytes = 1 << 20;
  size_t esize = 4;
  size_t chunk_elems() const {
    const size_t e = chunk_bytes / esize;
    return e == 0 ? 1 : e;
  }
  int pos() const { return position[rank]; }
  int at(int pos) const { return order[((pos % n) + n) % n]; }
};

// An element range of a buffer.
struct Block {
  size_t offset = 0;  // elements
  size_t count = 0;
};
// count elements split into `parts` blocks as evenly as possible, in order.
std::vector<Block> EvenBlocks(size_t count, int parts);

// A schedule of plexus::netmodel (the one description of an algorithm) as the runtime runs it,
// indexed: the transfers at each position and, per transfer, its run (a maximal stretch of
// consecutive transfers of one round).
struct RunnableSchedule {
  netmodel::Schedule schedule;
  std::vector<std::vector<int>> at;  // per position: the transfers from or to it, in order
  std::vector<int> run;              // per transfer
};
// Indexes `schedule` over n positions; InvalidArgument naming the schedule and transfer when
// it names no pieces, a position or piece count out of range, or depends on a later transfer.
absl::StatusOr<RunnableSchedule> MakeRunnable(netmodel::Schedule schedule, int n);

// Appends this rank's part of `s` to `plan`: every transfer at its position (L.pos()), run by
// run, the run's sends before its receives (a round's sends read what the rank held before the
// round); each piece is cut into chunks of L.chunk_elems() elements, a transfer's messages on
// consecutive channels. pieces[j * P + q] is the block piece q of slice j names (P =
// s.schedule.pieces): `slices` copies of the schedule, each over its own pieces, run one after
// the other (a pipeline: each is a few chunks, and slice j + 1 need not wait for slice j).
// Dependencies come from the data: a send waits for the receive that last wrote its chunk
// here; a receive waits for the sends that read its chunk from buf before it (write after
// read); combining receives reduce in plan order. A piece this rank has received nothing into
// yet is read from `input` (when given: sends read it there, the first combining receive
// reduces local = input), so that buf needs no copy of the operand.
void BuildFromSchedule(const RunnableSchedule& s, const Layout& L, uint8_t* buf,
                       std::span<const Block> pieces, int slices, const uint8_t* input, Plan* plan);

// The schedules the plan builders and the mailbox path run: built on first use per world size
// and kept for the life of the process (one per shape and size: a few kilobytes each).
enum class Shape : uint8_t {
  kRing,               // ring allreduce
  kRingReduceScatter,  // its first n - 1 steps
  kRingAllGather,      // its last n - 1 steps
  kHalvingDoubling,    // halving-doubling allreduce, far first, with the fold
  kHalving,            // its halving (powers of two)
  kDoubling,           // its doubling (powers of two)
  kRecursiveDoubling,  // whole-vector doubling, with the fold
  kDoubleBinaryTree,   // NCCL's double binary tree allreduce
  kBruck,              // Bruck's all-gather
};
absl::StatusOr<const RunnableSchedule*> ScheduleOf(Shape shape, int n);

// Double binary tree reduce to / broadcast from root_pos: half of the vector down (up) each of
// two heap-shaped trees rooted at root_pos, the second mirrored, pipelined chunk by chunk.
// Broadcasts: with `source`, the root sends from source instead of buf (its input, out of
// place; the caller copies it into buf), so its sends need not wait for that copy. Reduces: with
// `input` (this rank's operand, not buf), buf need not hold it: the first reduction of a chunk
// reads it in place and a rank with nothing to add sends it as it is.
void BuildTreeReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                     const uint8_t* input = nullptr);
void BuildTreeBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                        const uint8_t* source = nullptr);
// Pipelined chains along the ring: broadcast from root_pos; reduce ending at root_pos.
void BuildChainBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                         const uint8_t* source = nullptr);
void BuildChainReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                      const uint8_t* input = nullptr);
// Sends count elements to / receives from one peer (chunked over channels). An empty message
// is still sent when `always` (so that the header travels: AllToAllV).
void BuildSendTo(const Layout& L, const uint8_t* buf, size_t count, int peer, bool always,
                 Plan* plan);
void BuildRecvFrom(const Layout& L, uint8_t* buf, size_t count, int peer, bool always, Plan* plan);

// ---------------------------------------------------------------------------------------------
// The plan builders: each algorithm's builder for every collective it implements, as one table
// (algorithms.cpp) that selection (Resolve) and the collectives read. A new algorithm needs its
// schedule (plexus/netmodel/schedule.hpp) and its rows there, its name (types.hpp) and, to be
// chosen by default, a selector rule (selector.cpp).

// What a builder is given.
struct PlanArgs {
  const Layout& L;
  uint8_t* buf;      // the call's buffer (AllGather: the whole output; ReduceScatter: partial sums)
  size_t count;      // elements (AllGather, ReduceScatter: per rank)
  int root_pos = 0;  // Reduce, Broadcast: the root's ring position
  const uint8_t* input = nullptr;  // PlanBuilder::reads_input; Broadcast: the root's source
  // AllGather (ring): this rank's block, which its sends read from here rather than from its
  // copy in buf (count elements; nullptr: from buf).
  const uint8_t* own_block = nullptr;
};

struct PlanBuilder {
  CollectiveKind kind;
  Algorithm algorithm;
  // The world sizes it runs at (nullptr: any).
  bool (*runs_at)(int n);
  // Given PlanArgs::input at world size n, the builder reads this rank's operand from there
  // (buf need not hold it; nullptr: never, buf must).
  bool (*reads_input)(int n);
  absl::Status (*build)(const PlanArgs& args, Plan* plan);
};

// The plan builder of `algorithm` for `kind` at world size n; nullptr when it has none.
const PlanBuilder* FindPlanBuilder(CollectiveKind kind, Algorithm algorithm, int n);

}  // namespace plexus::collectives::internal
