#include <algorithm>
#include <span>

#include "plan.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives::internal {
namespace {

size_t NumChunks(const Layout& L, size_t count) {
  const size_t ce = L.chunk_elems();
  return (count + ce - 1) / ce;
}
// Chunk k of a block: [offset, count) in elements.
Block ChunkOf(const Layout& L, const Block& b, size_t k) {
  const size_t ce = L.chunk_elems();
  const size_t start = k * ce;
  return Block{b.offset + start, std::min(ce, b.count - start)};
}

int AddSend(const Layout& L, Plan* plan, const uint8_t* buf, const Block& c, int peer, int channel,
            int dep = -1, int dep_prefix = 0, bool final = false) {
  SendOp op;
  op.final = final;
  op.data = buf + c.offset * L.esize;
  op.bytes = c.count * L.esize;
  op.peer = peer;
  op.channel = channel;
  op.dep = dep;
  op.dep_prefix = dep_prefix;
  plan->sends.push_back(op);
  return static_cast<int>(plan->sends.size()) - 1;
}

int AddRecv(const Layout& L, Plan* plan, uint8_t* buf, const Block& c, int peer, int channel,
            bool reduce, bool src_first = false, int war_prefix = 0) {
  RecvOp op;
  op.data = buf + c.offset * L.esize;
  op.bytes = c.count * L.esize;
  op.peer = peer;
  op.channel = channel;
  op.reduce = reduce;
  op.src_first = src_first;
  op.war_prefix = war_prefix;
  plan->recvs.push_back(op);
  return static_cast<int>(plan->recvs.size()) - 1;
}

int Channel(const Layout& L, size_t k) { return static_cast<int>(k % L.channels); }

// Sends all of buf to `peer` chunk by chunk; returns nothing (indices are contiguous).
void SendAll(const Layout& L, Plan* plan, const uint8_t* buf, size_t count, int peer,
             int dep_prefix, bool final = false) {
  const Block all{0, count};
  for (size_t k = 0; k < NumChunks(L, count); ++k) {
    AddSend(L, plan, buf, ChunkOf(L, all, k), peer, Channel(L, k), -1, dep_prefix, final);
  }
}
void RecvAll(const Layout& L, Plan* plan, uint8_t* buf, size_t count, int peer, bool reduce,
             bool src_first, int war_prefix) {
  const Block all{0, count};
  for (size_t k = 0; k < NumChunks(L, count); ++k) {
    AddRecv(L, plan, buf, ChunkOf(L, all, k), peer, Channel(L, k), reduce, src_first, war_prefix);
  }
}

// Heap-ordered binary tree over indices 0..n-1.
int TreeParent(int i) { return i == 0 ? -1 : (i - 1) / 2; }

// Calls step(tree, chunk, channel) for every chunk of the two halves of a count-element vector
// that a double binary tree carries, chunk by chunk, alternating trees: the order both ends of
// every (peer, channel) list their messages in.
template <typename Step>
void ForEachTreeChunk(const Layout& L, size_t count, Step&& step) {
  const Block halves[2] = {{0, count / 2}, {count / 2, count - count / 2}};
  const size_t kn = std::max(NumChunks(L, halves[0].count), NumChunks(L, halves[1].count));
  for (size_t k = 0; k < kn; ++k) {
    for (int tree = 0; tree < 2; ++tree) {
      if (k >= NumChunks(L, halves[tree].count)) continue;
      step(tree, ChunkOf(L, halves[tree], k),
           static_cast<int>((static_cast<size_t>(tree) + k) % L.channels));
    }
  }
}

// The two trees of a rooted double binary tree: heap-shaped over the positions counted from the
// root, the second mirrored (i -> n - i) so that the leaves of one are inner nodes of the other.
// Each carries half of the vector.
struct RootedTrees {
  const Layout& L;
  int root_pos;
  int IndexOf(int tree, int pos) const {
    const int i = ((pos - root_pos) % L.n + L.n) % L.n;
    return tree == 0 ? i : (L.n - i) % L.n;
  }
  int RankOf(int tree, int index) const {
    return L.at(root_pos + (tree == 0 ? index : (L.n - index) % L.n));
  }
};

}  // namespace

std::vector<Block> EvenBlocks(size_t count, int parts) {
  std::vector<Block> blocks(parts);
  const size_t q = count / parts;
  const size_t r = count % parts;
  size_t offset = 0;
  for (int b = 0; b < parts; ++b) {
    blocks[b].offset = offset;
    blocks[b].count = q + (static_cast<size_t>(b) < r ? 1 : 0);
    offset += blocks[b].count;
  }
  return blocks;
}

void BuildTreeReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                     const uint8_t* input) {
  if (L.n == 1 || count == 0) return;
  const RootedTrees trees{L, root_pos};
  ForEachTreeChunk(L, count, [&](int tree, const Block& c, int channel) {
    const int i = trees.IndexOf(tree, L.pos());
    int last_up = -1;
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
      last_up = AddRecv(L, plan, buf, c, trees.RankOf(tree, child), channel, true);
      if (input != nullptr && child == 2 * i + 1) {
        plan->recvs.back().local = input + c.offset * L.esize;
      }
    }
    const uint8_t* from = last_up < 0 && input != nullptr ? input : buf;
    if (i != 0) AddSend(L, plan, from, c, trees.RankOf(tree, TreeParent(i)), channel, last_up);
  });
}

void BuildTreeBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                        const uint8_t* source) {
  if (L.n == 1 || count == 0) return;
  const RootedTrees trees{L, root_pos};
  ForEachTreeChunk(L, count, [&](int tree, const Block& c, int channel) {
    const int i = trees.IndexOf(tree, L.pos());
    int dep = -1;
    if (i != 0) dep = AddRecv(L, plan, buf, c, trees.RankOf(tree, TreeParent(i)), channel, false);
    const uint8_t* from = i == 0 && source != nullptr ? source : buf;
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
      AddSend(L, plan, from, c, trees.RankOf(tree, child), channel, dep, 0, true);
    }
  });
}

void BuildChainBroadcast(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                         const uint8_t* source) {
  const int n = L.n;
  if (n == 1 || count == 0) return;
  const int i = ((L.pos() - root_pos) % n + n) % n;
  const uint8_t* from = i == 0 && source != nullptr ? source : buf;
  const Block all{0, count};
  for (size_t k = 0; k < NumChunks(L, count); ++k) {
    const Block c = ChunkOf(L, all, k);
    int dep = -1;
    if (i != 0) dep = AddRecv(L, plan, buf, c, L.at(root_pos + i - 1), Channel(L, k), false);
    if (i != n - 1) AddSend(L, plan, from, c, L.at(root_pos + i + 1), Channel(L, k), dep, 0, true);
  }
}

void BuildChainReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan,
                      const uint8_t* input) {
  const int n = L.n;
  if (n == 1 || count == 0) return;
  // The chain runs root+1 -> root+2 -> ... -> root+n-1 -> root.
  const int i = ((L.pos() - root_pos) % n + n) % n;
  const Block all{0, count};
  for (size_t k = 0; k < NumChunks(L, count); ++k) {
    const Block c = ChunkOf(L, all, k);
    const int from_peer = L.at(root_pos + (i == 0 ? n - 1 : i - 1));
    int dep = -1;
    if (i != 1) {
      dep = AddRecv(L, plan, buf, c, from_peer, Channel(L, k), true, true);
      if (input != nullptr) plan->recvs.back().local = input + c.offset * L.esize;
    }
    if (i == 0) continue;
    const uint8_t* from = i == 1 && input != nullptr ? input : buf;
    AddSend(L, plan, from, c, L.at(root_pos + i + 1), Channel(L, k), dep);
  }
}

void BuildSendTo(const Layout& L, const uint8_t* buf, size_t count, int peer, bool always,
                 Plan* plan) {
  if (count == 0) {
    if (always) AddSend(L, plan, buf, Block{0, 0}, peer, 0);
    return;
  }
  SendAll(L, plan, buf, count, peer, 0);
}

void BuildRecvFrom(const Layout& L, uint8_t* buf, size_t count, int peer, bool always, Plan* plan) {
  if (count == 0) {
    if (always) AddRecv(L, plan, buf, Block{0, 0}, peer, 0, false);
    return;
  }
  RecvAll(L, plan, buf, count, peer, false, false, 0);
}

// ---------------------------------------------------------------------------------------------
// The plan builders

namespace {

bool PowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }
bool Always(int) { return true; }
bool SeveralRanks(int n) { return n > 1; }  // one rank's reduce only copies its input

// AllGather and ReduceScatter blocks: ring segment j belongs to the rank that owns it at the end
// (position j - 1); halving block b to the rank at position b.
std::vector<Block> RingBlocks(const Layout& L, size_t count) {
  std::vector<Block> blocks(L.n);
  for (int j = 0; j < L.n; ++j) blocks[j] = Block{L.at(j - 1) * count, count};
  return blocks;
}
std::vector<Block> PositionBlocks(const Layout& L, size_t count) {
  std::vector<Block> blocks(L.n);
  for (int b = 0; b < L.n; ++b) blocks[b] = Block{L.order[b] * count, count};
  return blocks;
}

// Points the sends that read this rank's block in buf at a.own_block instead. A rank never
// receives its own block, so every such send is one of its first, reading the block as it was.
// The peers then read the caller's input, which no one writes during the call, rather than
// lines this rank has just written into buf and its CPU's cache still holds modified (fetched
// from there by a peer's cross-memory pull or ring copy at a cross-core cost).
void SendOwnBlockFrom(const PlanArgs& a, Plan* plan) {
  const uint8_t* own = a.buf + static_cast<size_t>(a.L.rank) * a.count * a.L.esize;
  const uint8_t* own_end = own + a.count * a.L.esize;
  for (SendOp& op : plan->sends) {
    if (op.data >= own && op.data < own_end) op.data = a.own_block + (op.data - own);
  }
}

// Runs the schedule `shape` over `blocks` (one per piece).
absl::Status Run(Shape shape, const PlanArgs& a, std::span<const Block> blocks, Plan* plan,
                 int slices = 1, const uint8_t* input = nullptr) {
  if (a.L.n == 1 || a.count == 0) return absl::OkStatus();
  PLEXUS_ASSIGN_OR_RETURN(const RunnableSchedule* s, ScheduleOf(shape, a.L.n));
  BuildFromSchedule(*s, a.L, a.buf, blocks, slices, input, plan);
  return absl::OkStatus();
}
// An allreduce's pieces: the vector cut evenly into `slices` times as many pieces as the
// schedule names.
absl::Status RunAllReduce(Shape shape, const PlanArgs& a, Plan* plan, int slices = 1) {
  if (a.L.n == 1 || a.count == 0) return absl::OkStatus();
  PLEXUS_ASSIGN_OR_RETURN(const RunnableSchedule* s, ScheduleOf(shape, a.L.n));
  BuildFromSchedule(*s, a.L, a.buf, EvenBlocks(a.count, s->schedule.pieces * slices), slices,
                    a.input, plan);
  return absl::OkStatus();
}

// Reduce by recursive halving, then a gather (Rabenseifner's reduce): the vector cut into n
// blocks, block b owned by the rank at position b; a halving reduce-scatter leaves each rank its
// block reduced over all ranks (every rank's CPU reduces 1/n of the vector, where a chain or a
// tree leaves all of it to the root's), and each sends it to the root. A rank's block leaves once
// all its reduce-scatter receives are done; the root's receives of the blocks wait for all its
// reduce-scatter sends, which may read the same bytes of buf.
absl::Status BuildHalvingReduce(const PlanArgs& a, Plan* plan) {
  const Layout& L = a.L;
  if (L.n == 1 || a.count == 0) return absl::OkStatus();
  const std::vector<Block> blocks = EvenBlocks(a.count, L.n);
  PLEXUS_RETURN_IF_ERROR(Run(Shape::kHalving, a, blocks, plan, 1, a.input));
  const int rs_sends = static_cast<int>(plan->sends.size());
  const int rs_recvs = static_cast<int>(plan->recvs.size());
  const int me = L.pos();
  if (me != a.root_pos) {
    const Block& mine = blocks[me];
    if (mine.count > 0) {
      SendAll(L, plan, a.buf + mine.offset * L.esize, mine.count, L.at(a.root_pos), rs_recvs);
    }
    return absl::OkStatus();
  }
  for (int q = 0; q < L.n; ++q) {
    if (q == me || blocks[q].count == 0) continue;
    RecvAll(L, plan, a.buf + blocks[q].offset * L.esize, blocks[q].count, L.at(q), false, false,
            rs_sends);
  }
  return absl::OkStatus();
}

// The double binary tree pipelines chunk by chunk: one slice of the schedule per chunk of a
// half, so that a node forwards a chunk as soon as it has it.
int TreeSlices(const PlanArgs& a) {
  const size_t half = (a.count + 1) / 2;
  return static_cast<int>(std::max<size_t>(1, (half + a.L.chunk_elems() - 1) / a.L.chunk_elems()));
}

using K = CollectiveKind;
using A = Algorithm;

const PlanBuilder kPlanBuilders[] = {
    {K::kAllReduce, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) { return RunAllReduce(Shape::kRing, a, p); }},
    {K::kAllReduce, A::kHalvingDoubling, nullptr, Always,
     [](const PlanArgs& a, Plan* p) { return RunAllReduce(Shape::kHalvingDoubling, a, p); }},
    {K::kAllReduce, A::kRecursiveDoubling, nullptr, Always,
     [](const PlanArgs& a, Plan* p) { return RunAllReduce(Shape::kRecursiveDoubling, a, p); }},
    {K::kAllReduce, A::kTree, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       return RunAllReduce(Shape::kDoubleBinaryTree, a, p, TreeSlices(a));
     }},
    {K::kReduce, A::kRing, nullptr, SeveralRanks,
     [](const PlanArgs& a, Plan* p) {
       BuildChainReduce(a.L, a.buf, a.count, a.root_pos, p, a.input);
       return absl::OkStatus();
     }},
    {K::kReduce, A::kHalvingDoubling, PowerOfTwo, SeveralRanks, BuildHalvingReduce},
    {K::kReduce, A::kTree, nullptr, SeveralRanks,
     [](const PlanArgs& a, Plan* p) {
       BuildTreeReduce(a.L, a.buf, a.count, a.root_pos, p, a.input);
       return absl::OkStatus();
     }},
    {K::kBroadcast, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildChainBroadcast(a.L, a.buf, a.count, a.root_pos, p, a.input);
       return absl::OkStatus();
     }},
    {K::kBroadcast, A::kTree, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildTreeBroadcast(a.L, a.buf, a.count, a.root_pos, p, a.input);
       return absl::OkStatus();
     }},
    {K::kAllGather, A::kRing, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) {
       PLEXUS_RETURN_IF_ERROR(Run(Shape::kRingAllGather, a, RingBlocks(a.L, a.count), p));
       if (a.own_block != nullptr) SendOwnBlockFrom(a, p);
       return absl::OkStatus();
     }},
    {K::kAllGather, A::kHalvingDoubling, PowerOfTwo, nullptr,
     [](const PlanArgs& a, Plan* p) {
       return Run(Shape::kDoubling, a, PositionBlocks(a.L, a.count), p);
     }},
    {K::kAllGather, A::kBruck, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) {
       return Run(Shape::kBruck, a, PositionBlocks(a.L, a.count), p);
     }},
    {K::kReduceScatter, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       return Run(Shape::kRingReduceScatter, a, RingBlocks(a.L, a.count), p, 1, a.input);
     }},
    {K::kReduceScatter, A::kHalvingDoubling, PowerOfTwo, Always,
     [](const PlanArgs& a, Plan* p) {
       return Run(Shape::kHalving, a, PositionBlocks(a.L, a.count), p, 1, a.input);
     }},
};

}  // namespace

const PlanBuilder* FindPlanBuilder(CollectiveKind kind, Algorithm algorithm, int n) {
  for (const PlanBuilder& s : kPlanBuilders) {
    if (s.kind == kind && s.algorithm == algorithm && (s.runs_at == nullptr || s.runs_at(n))) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace plexus::collectives::internal
