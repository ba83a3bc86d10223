// A collective as data: the messages each rank sends and receives, with the dependencies that
// make the schedule correct, pipelined and deterministic. Algorithms (algorithms.cpp) build
// plans; the communicator's executor runs them over the connections.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "plexus/collectives/types.hpp"

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

// Recursive doubling/halving over the largest power of two p2 <= n: the first 2 * rem positions
// (rem = n - p2) pair up, the even one of each pair folding its vector into the odd one before
// the core and getting the result back after it.
struct Fold {
  int p2 = 1;
  int rem = 0;
  int new_pos = -1;  // position among the p2 core ranks; -1: this position folds out
  // The rank at core position np.
  int Real(const Layout& L, int np) const { return L.at(np < rem ? 2 * np + 1 : np + rem); }
};
Fold MakeFold(const Layout& L);

// An element range of a buffer.
struct Block {
  size_t offset = 0;  // elements
  size_t count = 0;
};
// count elements split into `parts` blocks as evenly as possible, in order.
std::vector<Block> EvenBlocks(size_t count, int parts);

// Every builder appends to `plan`; buffers are element arrays of layout.esize bytes.
// Ring reduce-scatter and/or all-gather. segments[j] is the block ring segment j covers; after
// the reduce-scatter, position p holds the fully reduced segment (p + 1) mod n; the all-gather
// starts from there. With `input` (reduce-scatter only), this rank's contribution is read from
// input (same offsets) rather than buf, whose reduce-scatter segments need no initial contents:
// an out-of-place allreduce then skips copying its input.
void BuildRing(const Layout& L, uint8_t* buf, const std::vector<Block>& segments,
               bool reduce_scatter, bool all_gather, Plan* plan, const uint8_t* input = nullptr);
// Recursive doubling of the whole vector (small messages); any world size (extra ranks fold in).
// `input` as for BuildHalvingDoubling (powers of two only; otherwise buf holds the operand).
void BuildRecursiveDoubling(const Layout& L, uint8_t* buf, size_t count, Plan* plan,
                            const uint8_t* input = nullptr);
// Recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner); any world
// size (the first 2 * (n - 2^k) positions pair up first). `input` as for BuildRing, but only for
// powers of two: otherwise it is ignored and buf must hold the operand.
void BuildHalvingDoubling(const Layout& L, uint8_t* buf, size_t count, Plan* plan,
                          const uint8_t* input = nullptr);
// The two halves of power-of-two world sizes: blocks[b] is the block that position b owns after
// the halving. Used for ReduceScatter (halving only) and AllGather (doubling only). With
// `input`, the halving reads this rank's operand from input (as BuildRing): buf needs no copy.
void BuildHalving(const Layout& L, uint8_t* buf, const std::vector<Block>& blocks, Plan* plan,
                  const uint8_t* input = nullptr);
void BuildDoubling(const Layout& L, uint8_t* buf, const std::vector<Block>& blocks, Plan* plan);
// Double binary tree allreduce: half the data up and down each of two complementary trees.
void BuildDoubleTreeAllReduce(const Layout& L, uint8_t* buf, size_t count, Plan* plan);
// Double binary tree reduce to / broadcast from root_pos: half of the vector down (up) each of
// two heap-shaped trees rooted at root_pos, the second mirrored, pipelined chunk by chunk.
// Broadcasts: with `source`, the root sends from source instead of buf (its input, out of
// place; the caller copies it into buf), so its sends need not wait for that copy.
void BuildTreeReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan);
void BuildTreeBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                        const uint8_t* source = nullptr);
// Pipelined chains along the ring: broadcast from root_pos; reduce ending at root_pos.
void BuildChainBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                         const uint8_t* source = nullptr);
void BuildChainReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan);
// Sends count elements to / receives from one peer (chunked over channels). An empty message
// is still sent when `always` (so that the header travels: AllToAllV).
void BuildSendTo(const Layout& L, const uint8_t* buf, size_t count, int peer, bool always,
                 Plan* plan);
void BuildRecvFrom(const Layout& L, uint8_t* buf, size_t count, int peer, bool always, Plan* plan);

// ---------------------------------------------------------------------------------------------
// The plan builders: each algorithm's builder for every collective it implements, as one table
// (algorithms.cpp) that selection (Resolve) and the collectives read. A new algorithm needs its
// builder and its rows there, its name (types.hpp) and, to be chosen by default, a selector rule
// (selector.cpp).

// What a builder is given.
struct PlanArgs {
  const Layout& L;
  uint8_t* buf;      // the call's buffer (AllGather: the whole output; ReduceScatter: partial sums)
  size_t count;      // elements (AllGather, ReduceScatter: per rank)
  int root_pos = 0;  // Reduce, Broadcast: the root's ring position
  const uint8_t* input = nullptr;  // PlanBuilder::reads_input; Broadcast: the root's source
};

struct PlanBuilder {
  CollectiveKind kind;
  Algorithm algorithm;
  // The world sizes it runs at (nullptr: any).
  bool (*runs_at)(int n);
  // Given PlanArgs::input at world size n, the builder reads this rank's operand from there
  // (buf need not hold it; nullptr: never, buf must).
  bool (*reads_input)(int n);
  void (*build)(const PlanArgs& args, Plan* plan);
};

// The plan builder of `algorithm` for `kind` at world size n; nullptr when it has none.
const PlanBuilder* FindPlanBuilder(CollectiveKind kind, Algorithm algorithm, int n);

}  // namespace plexus::collectives::internal
