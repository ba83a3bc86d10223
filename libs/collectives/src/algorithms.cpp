#include <algorithm>

#include "plan.hpp"

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

// Extra positions: before the core, the even position of each low pair sends its vector to the
// odd one, which reduces it (lower position first).
void FoldIn(const Layout& L, const Fold& f, uint8_t* buf, size_t count, Plan* plan) {
  const int pos = L.pos();
  if (pos >= 2 * f.rem) return;
  if (f.new_pos < 0) {
    SendAll(L, plan, buf, count, L.at(pos + 1), 0);
  } else {
    RecvAll(L, plan, buf, count, L.at(pos - 1), true, true, 0);
  }
}
// After the core, the odd position returns the result to its even partner.
void FoldOut(const Layout& L, const Fold& f, uint8_t* buf, size_t count, Plan* plan) {
  const int pos = L.pos();
  if (pos >= 2 * f.rem) return;
  if (f.new_pos < 0) {
    RecvAll(L, plan, buf, count, L.at(pos + 1), false, false, static_cast<int>(plan->sends.size()));
  } else {
    SendAll(L, plan, buf, count, L.at(pos - 1), static_cast<int>(plan->recvs.size()), true);
  }
}

// With `input`, the first step reads this rank's operand from input rather than buf.
void HalvingCore(const Layout& L, const Fold& f, uint8_t* buf, const std::vector<Block>& blocks,
                 Plan* plan, const uint8_t* input = nullptr) {
  const int np = f.new_pos;
  int lo = 0;
  int hi = f.p2;
  for (int mask = f.p2 / 2; mask >= 1; mask /= 2) {
    const int partner_np = np ^ mask;
    const int peer = f.Real(L, partner_np);
    const int mid = lo + (hi - lo) / 2;
    const bool keep_low = (np & mask) == 0;
    const int give_lo = keep_low ? mid : lo;
    const int give_hi = keep_low ? hi : mid;
    const int keep_lo = keep_low ? lo : mid;
    const int keep_hi = keep_low ? mid : hi;
    const int dep_prefix = static_cast<int>(plan->recvs.size());
    const uint8_t* operand = mask == f.p2 / 2 ? input : nullptr;  // first step only
    size_t k_global = 0;
    for (int b = give_lo; b < give_hi; ++b) {
      for (size_t k = 0; k < NumChunks(L, blocks[b].count); ++k, ++k_global) {
        AddSend(L, plan, operand != nullptr ? operand : buf, ChunkOf(L, blocks[b], k), peer,
                Channel(L, k_global), -1, dep_prefix);
      }
    }
    k_global = 0;
    for (int b = keep_lo; b < keep_hi; ++b) {
      for (size_t k = 0; k < NumChunks(L, blocks[b].count); ++k, ++k_global) {
        const Block c = ChunkOf(L, blocks[b], k);
        AddRecv(L, plan, buf, c, peer, Channel(L, k_global), true, partner_np < np);
        if (operand != nullptr) plan->recvs.back().local = operand + c.offset * L.esize;
      }
    }
    lo = keep_lo;
    hi = keep_hi;
  }
}

void DoublingCore(const Layout& L, const Fold& f, uint8_t* buf, const std::vector<Block>& blocks,
                  Plan* plan) {
  const int np = f.new_pos;
  for (int mask = 1; mask < f.p2; mask *= 2) {
    const int partner_np = np ^ mask;
    const int peer = f.Real(L, partner_np);
    const int mine = np & ~(mask - 1);
    const int theirs = partner_np & ~(mask - 1);
    const int dep_prefix = static_cast<int>(plan->recvs.size());
    // The partner's blocks may have left this rank earlier (halving): wait for those sends.
    const int war_prefix = static_cast<int>(plan->sends.size());
    size_t k_global = 0;
    for (int b = mine; b < mine + mask; ++b) {
      for (size_t k = 0; k < NumChunks(L, blocks[b].count); ++k, ++k_global) {
        AddSend(L, plan, buf, ChunkOf(L, blocks[b], k), peer, Channel(L, k_global), -1, dep_prefix,
                true);
      }
    }
    k_global = 0;
    for (int b = theirs; b < theirs + mask; ++b) {
      for (size_t k = 0; k < NumChunks(L, blocks[b].count); ++k, ++k_global) {
        AddRecv(L, plan, buf, ChunkOf(L, blocks[b], k), peer, Channel(L, k_global), false, false,
                war_prefix);
      }
    }
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

Fold MakeFold(const Layout& L) {
  Fold f;
  while (f.p2 * 2 <= L.n) f.p2 *= 2;
  f.rem = L.n - f.p2;
  const int pos = L.pos();
  if (pos < 2 * f.rem) {
    f.new_pos = (pos % 2 == 0) ? -1 : pos / 2;
  } else {
    f.new_pos = pos - f.rem;
  }
  return f;
}

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

void BuildRing(const Layout& L, uint8_t* buf, const std::vector<Block>& segments,
               bool reduce_scatter, bool all_gather, Plan* plan, const uint8_t* input) {
  const int n = L.n;
  if (n == 1) return;
  const int p = L.pos();
  const int next = L.at(p + 1);
  const int prev = L.at(p - 1);
  auto seg = [&](int j) -> const Block& { return segments[((j % n) + n) % n]; };
  // rs_send[s][k] / recv indices per step and chunk, to chain dependencies chunk by chunk.
  std::vector<std::vector<int>> rs_send(n), last_recv(n);
  if (reduce_scatter) {
    for (int s = 0; s < n - 1; ++s) {
      const Block& out = seg(p - s);
      const Block& in = seg(p - s - 1);
      const size_t kn = std::max(NumChunks(L, out.count), NumChunks(L, in.count));
      rs_send[s].assign(kn, -1);
      std::vector<int> recvs(kn, -1);
      for (size_t k = 0; k < kn; ++k) {
        if (k < NumChunks(L, out.count)) {
          // Step s forwards what step s - 1 reduced (the same segment and chunk).
          const int dep = s > 0 && k < last_recv[s - 1].size() ? last_recv[s - 1][k] : -1;
          // Step 0 sends this rank's own, unreduced segment.
          const uint8_t* from = s == 0 && input != nullptr ? input : buf;
          rs_send[s][k] = AddSend(L, plan, from, ChunkOf(L, out, k), next, Channel(L, k), dep);
        }
        if (k < NumChunks(L, in.count)) {
          const Block c = ChunkOf(L, in, k);
          recvs[k] = AddRecv(L, plan, buf, c, prev, Channel(L, k), true);
          if (input != nullptr) plan->recvs.back().local = input + c.offset * L.esize;
        }
      }
      last_recv[s] = std::move(recvs);
    }
  }
  if (all_gather) {
    std::vector<int> prev_recvs = reduce_scatter ? last_recv[n - 2] : std::vector<int>{};
    for (int t = 0; t < n - 1; ++t) {
      const Block& out = seg(p + 1 - t);
      const Block& in = seg(p - t);
      const size_t kn = std::max(NumChunks(L, out.count), NumChunks(L, in.count));
      std::vector<int> recvs(kn, -1);
      for (size_t k = 0; k < kn; ++k) {
        if (k < NumChunks(L, out.count)) {
          const int dep = k < prev_recvs.size() ? prev_recvs[k] : -1;
          AddSend(L, plan, buf, ChunkOf(L, out, k), next, Channel(L, k), dep, 0, true);
        }
        if (k < NumChunks(L, in.count)) {
          // The reduce-scatter sent this segment at step t: the bytes must have left first.
          int war = 0;
          if (reduce_scatter && k < rs_send[t].size() && rs_send[t][k] >= 0) {
            war = rs_send[t][k] + 1;
          }
          recvs[k] =
              AddRecv(L, plan, buf, ChunkOf(L, in, k), prev, Channel(L, k), false, false, war);
        }
      }
      prev_recvs = std::move(recvs);
    }
  }
}

void BuildRecursiveDoubling(const Layout& L, uint8_t* buf, size_t count, Plan* plan,
                            const uint8_t* input) {
  if (L.n == 1 || count == 0) return;
  const Fold f = MakeFold(L);
  if (f.rem > 0) input = nullptr;  // callers pass input only for powers of two
  FoldIn(L, f, buf, count, plan);
  if (f.new_pos >= 0) {
    const Block all{0, count};
    const size_t kn = NumChunks(L, count);
    std::vector<int> prev(kn, -1);
    const int fold_prefix = static_cast<int>(plan->recvs.size());
    for (int mask = 1; mask < f.p2; mask *= 2) {
      const int partner_np = f.new_pos ^ mask;
      const int peer = f.Real(L, partner_np);
      const uint8_t* operand = mask == 1 ? input : nullptr;  // first step only
      std::vector<int> sends(kn);
      for (size_t k = 0; k < kn; ++k) {
        sends[k] = AddSend(L, plan, operand != nullptr ? operand : buf, ChunkOf(L, all, k), peer,
                           Channel(L, k), prev[k], fold_prefix);
      }
      for (size_t k = 0; k < kn; ++k) {
        // Reduce chunk k only once its outgoing copy has left (from the input, nothing to wait
        // for: the reduction writes buf, local op incoming).
        const Block c = ChunkOf(L, all, k);
        prev[k] = AddRecv(L, plan, buf, c, peer, Channel(L, k), true, partner_np < f.new_pos,
                          operand != nullptr ? 0 : sends[k] + 1);
        if (operand != nullptr) plan->recvs.back().local = operand + c.offset * L.esize;
      }
    }
  }
  FoldOut(L, f, buf, count, plan);
}

void BuildHalvingDoubling(const Layout& L, uint8_t* buf, size_t count, Plan* plan,
                          const uint8_t* input) {
  if (L.n == 1 || count == 0) return;
  const Fold f = MakeFold(L);
  if (f.rem > 0) input = nullptr;  // callers pass input only for powers of two
  FoldIn(L, f, buf, count, plan);
  if (f.new_pos >= 0) {
    const std::vector<Block> blocks = EvenBlocks(count, f.p2);
    HalvingCore(L, f, buf, blocks, plan, input);
    DoublingCore(L, f, buf, blocks, plan);
  }
  FoldOut(L, f, buf, count, plan);
}

void BuildHalving(const Layout& L, uint8_t* buf, const std::vector<Block>& blocks, Plan* plan,
                  const uint8_t* input) {
  if (L.n == 1) return;
  const Fold f = MakeFold(L);  // callers guarantee a power of two: no fold
  HalvingCore(L, f, buf, blocks, plan, input);
}

void BuildDoubling(const Layout& L, uint8_t* buf, const std::vector<Block>& blocks, Plan* plan) {
  if (L.n == 1) return;
  const Fold f = MakeFold(L);
  DoublingCore(L, f, buf, blocks, plan);
}

void BuildDoubleTreeAllReduce(const Layout& L, uint8_t* buf, size_t count, Plan* plan) {
  const int n = L.n;
  if (n == 1 || count == 0) return;
  const int pos = L.pos();
  // Tree 0 indexes positions directly, tree 1 mirrors them: the leaves of one (the upper half of
  // the indices) are the inner nodes of the other.
  auto index_of = [&](int tree, int p) { return tree == 0 ? p : n - 1 - p; };
  auto rank_of = [&](int tree, int i) { return L.at(tree == 0 ? i : n - 1 - i); };
  ForEachTreeChunk(L, count, [&](int tree, const Block& c, int channel) {
    const int i = index_of(tree, pos);
    int last_up = -1;
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < n; ++child) {
      last_up = AddRecv(L, plan, buf, c, rank_of(tree, child), channel, true);
    }
    int down_dep = last_up;
    if (i != 0) {
      const int parent = rank_of(tree, TreeParent(i));
      const int up = AddSend(L, plan, buf, c, parent, channel, last_up);
      down_dep = AddRecv(L, plan, buf, c, parent, channel, false, false, up + 1);
    }
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < n; ++child) {
      AddSend(L, plan, buf, c, rank_of(tree, child), channel, down_dep, 0, true);
    }
  });
}

void BuildTreeReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan) {
  if (L.n == 1 || count == 0) return;
  const RootedTrees trees{L, root_pos};
  ForEachTreeChunk(L, count, [&](int tree, const Block& c, int channel) {
    const int i = trees.IndexOf(tree, L.pos());
    int last_up = -1;
    for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
      last_up = AddRecv(L, plan, buf, c, trees.RankOf(tree, child), channel, true);
    }
    if (i != 0) AddSend(L, plan, buf, c, trees.RankOf(tree, TreeParent(i)), channel, last_up);
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

void BuildChainReduce(const Layout& L, uint8_t* buf, size_t count, int root_pos, Plan* plan) {
  const int n = L.n;
  if (n == 1 || count == 0) return;
  // The chain runs root+1 -> root+2 -> ... -> root+n-1 -> root.
  const int i = ((L.pos() - root_pos) % n + n) % n;
  const Block all{0, count};
  for (size_t k = 0; k < NumChunks(L, count); ++k) {
    const Block c = ChunkOf(L, all, k);
    if (i == 0) {
      AddRecv(L, plan, buf, c, L.at(root_pos + n - 1), Channel(L, k), true, true);
      continue;
    }
    int dep = -1;
    if (i > 1) dep = AddRecv(L, plan, buf, c, L.at(root_pos + i - 1), Channel(L, k), true, true);
    AddSend(L, plan, buf, c, L.at(root_pos + i + 1), Channel(L, k), dep);
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

// Bruck's allgather: in round d = 1, 2, 4, ... < n, position p sends the blocks of positions
// p .. p + m - 1 (m = min(d, n - d)), which it holds by then, to position p - d and receives those
// of p + d .. p + d + m - 1 from it: ceil(log2 n) rounds at any world size, the ring's bytes.
// Blocks go straight to their place in buf (no final rotation); a forwarded chunk leaves as soon
// as it arrived.
void BuildBruckAllGather(const Layout& L, uint8_t* buf, size_t count, Plan* plan) {
  const int n = L.n;
  const int pos = L.pos();
  const size_t chunks = NumChunks(L, count);
  // first_recv[j]: the first receive of the block of position pos + j (its chunks follow).
  std::vector<int> first_recv(n, -1);
  for (int d = 1; d < n; d *= 2) {
    const int m = std::min(d, n - d);
    const int to = L.at(pos - d);
    const int from = L.at(pos + d);
    size_t k_global = 0;
    for (int j = 0; j < m; ++j) {
      const Block b{static_cast<size_t>(L.at(pos + j)) * count, count};
      for (size_t k = 0; k < chunks; ++k, ++k_global) {
        // A forwarded chunk leaves once it arrived; this rank's own block at once.
        const int dep = j == 0 ? -1 : first_recv[j] + static_cast<int>(k);
        AddSend(L, plan, buf, ChunkOf(L, b, k), to, Channel(L, k_global), dep, 0, true);
      }
    }
    k_global = 0;
    for (int j = 0; j < m; ++j) {
      const Block b{static_cast<size_t>(L.at(pos + d + j)) * count, count};
      first_recv[d + j] = static_cast<int>(plan->recvs.size());
      for (size_t k = 0; k < chunks; ++k, ++k_global) {
        AddRecv(L, plan, buf, ChunkOf(L, b, k), from, Channel(L, k_global), false);
      }
    }
  }
}

bool PowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }
bool Always(int) { return true; }

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

using K = CollectiveKind;
using A = Algorithm;

const PlanBuilder kPlanBuilders[] = {
    {K::kAllReduce, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildRing(a.L, a.buf, EvenBlocks(a.count, a.L.n), true, true, p, a.input);
     }},
    {K::kAllReduce, A::kHalvingDoubling, nullptr, PowerOfTwo,
     [](const PlanArgs& a, Plan* p) { BuildHalvingDoubling(a.L, a.buf, a.count, p, a.input); }},
    {K::kAllReduce, A::kRecursiveDoubling, nullptr, PowerOfTwo,
     [](const PlanArgs& a, Plan* p) { BuildRecursiveDoubling(a.L, a.buf, a.count, p, a.input); }},
    {K::kAllReduce, A::kTree, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) { BuildDoubleTreeAllReduce(a.L, a.buf, a.count, p); }},
    {K::kReduce, A::kRing, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) { BuildChainReduce(a.L, a.buf, a.count, a.root_pos, p); }},
    {K::kReduce, A::kTree, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) { BuildTreeReduce(a.L, a.buf, a.count, a.root_pos, p); }},
    {K::kBroadcast, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildChainBroadcast(a.L, a.buf, a.count, a.root_pos, p, a.input);
     }},
    {K::kBroadcast, A::kTree, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildTreeBroadcast(a.L, a.buf, a.count, a.root_pos, p, a.input);
     }},
    {K::kAllGather, A::kRing, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) {
       BuildRing(a.L, a.buf, RingBlocks(a.L, a.count), false, true, p);
     }},
    {K::kAllGather, A::kHalvingDoubling, PowerOfTwo, nullptr,
     [](const PlanArgs& a, Plan* p) {
       BuildDoubling(a.L, a.buf, PositionBlocks(a.L, a.count), p);
     }},
    {K::kAllGather, A::kBruck, nullptr, nullptr,
     [](const PlanArgs& a, Plan* p) { BuildBruckAllGather(a.L, a.buf, a.count, p); }},
    {K::kReduceScatter, A::kRing, nullptr, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildRing(a.L, a.buf, RingBlocks(a.L, a.count), true, false, p, a.input);
     }},
    {K::kReduceScatter, A::kHalvingDoubling, PowerOfTwo, Always,
     [](const PlanArgs& a, Plan* p) {
       BuildHalving(a.L, a.buf, PositionBlocks(a.L, a.count), p, a.input);
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
