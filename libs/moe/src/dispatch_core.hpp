// The per-expert dispatch rule, shared verbatim by the CPU path and the CUDA kernel so that both
// produce identical plans. Plain C++ (no absl, no std containers) so nvcc compiles it cheaply.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PLEXUS_MOE_HD __host__ __device__
#else
#define PLEXUS_MOE_HD
#endif

namespace plexus::moe::internal {

// Scratch arrays of `num_ranks` entries each.
struct DispatchScratch {
  int* holders;        // ranks with residual capacity, ascending
  int64_t* residual;   // per holder
  int64_t* share;      // per holder, this sender's share
  int64_t* remainder;  // per holder, numerator mod total residual
  int* order;          // holder indices being ranked by remainder
};

// True when holder a's remainder ranks before b's: larger first, ties to the lower rank.
PLEXUS_MOE_HD inline bool RanksBefore(const int64_t* remainder, int a, int b) {
  return remainder[a] > remainder[b] || (remainder[a] == remainder[b] && a < b);
}

PLEXUS_MOE_HD inline void SiftDown(int* order, const int64_t* remainder, int start, int end) {
  // The heap's root is the worst-ranked entry, so the heap sort leaves the best-ranked first.
  int root = start;
  while (2 * root + 1 < end) {
    int child = 2 * root + 1;
    if (child + 1 < end && RanksBefore(remainder, order[child], order[child + 1])) ++child;
    if (!RanksBefore(remainder, order[root], order[child])) return;
    const int tmp = order[root];
    order[root] = order[child];
    order[child] = tmp;
    root = child;
  }
}

// Deterministic heap sort: best-ranked (largest remainder, lowest rank) first.
PLEXUS_MOE_HD inline void SortByRemainder(int* order, const int64_t* remainder, int count) {
  for (int start = count / 2 - 1; start >= 0; --start) SiftDown(order, remainder, start, count);
  for (int end = count - 1; end > 0; --end) {
    const int tmp = order[0];
    order[0] = order[end];
    order[end] = tmp;
    SiftDown(order, remainder, 0, end);
  }
}

// Dispatches one expert. tokens/replicas/capacity/local are that expert's rows over the ranks;
// emit(src, dst, count) is called once per positive remote flow, by ascending src then dst.
template <typename Emit>
PLEXUS_MOE_HD inline void DispatchOneExpert(int num_ranks, const int64_t* tokens,
                                            const int* replicas, int64_t* capacity, int64_t* local,
                                            const DispatchScratch& scratch, Emit& emit) {
  int64_t total_tokens = 0;
  int64_t total_replicas = 0;
  for (int j = 0; j < num_ranks; ++j) {
    total_tokens += tokens[j];
    total_replicas += replicas[j];
  }
  if (total_replicas == 0) {
    for (int j = 0; j < num_ranks; ++j) capacity[j] = local[j] = 0;
    return;
  }
  // Replica quotas: floor(t/r) each, one more for the first t mod r replicas in rank order.
  const int64_t quota = total_tokens / total_replicas;
  const int64_t extra = total_tokens % total_replicas;
  int64_t before = 0;
  int holders = 0;
  int64_t total_residual = 0;
  for (int j = 0; j < num_ranks; ++j) {
    int64_t bonus = extra - before;
    if (bonus < 0) bonus = 0;
    if (bonus > replicas[j]) bonus = replicas[j];
    before += replicas[j];
    capacity[j] = replicas[j] * quota + bonus;
    local[j] = tokens[j] < capacity[j] ? tokens[j] : capacity[j];
    if (capacity[j] > local[j]) {
      scratch.holders[holders] = j;
      scratch.residual[holders] = capacity[j] - local[j];
      total_residual += scratch.residual[holders];
      ++holders;
    }
  }
  for (int src = 0; src < num_ranks && holders > 0; ++src) {
    const int64_t overflow = tokens[src] - local[src];
    if (overflow == 0) continue;
    // Proportional to residual capacity: floor shares, then the largest remainders get one more.
    // overflow <= total_residual, so no share exceeds its holder's residual.
    int64_t assigned = 0;
    int ranked = 0;
    for (int h = 0; h < holders; ++h) {
      const int64_t numerator = overflow * scratch.residual[h];
      scratch.share[h] = numerator / total_residual;
      scratch.remainder[h] = numerator % total_residual;
      assigned += scratch.share[h];
      if (scratch.remainder[h] > 0) scratch.order[ranked++] = h;
    }
    int64_t leftover = overflow - assigned;  // < number of positive remainders
    SortByRemainder(scratch.order, scratch.remainder, ranked);
    for (int i = 0; i < ranked && leftover > 0; ++i, --leftover) ++scratch.share[scratch.order[i]];
    int kept = 0;
    for (int h = 0; h < holders; ++h) {
      if (scratch.share[h] > 0) {
        emit(src, scratch.holders[h], scratch.share[h]);
        scratch.residual[h] -= scratch.share[h];
      }
      if (scratch.residual[h] > 0) {  // drop filled holders, keeping rank order
        scratch.holders[kept] = scratch.holders[h];
        scratch.residual[kept] = scratch.residual[h];
        ++kept;
      }
    }
    holders = kept;
    total_residual -= overflow;
  }
}

}  // namespace plexus::moe::internal
