// Token dispatcher (Lazarus Algorithm 2): which rank processes which tokens of every expert, and
// the send/receive counts and offsets of one variable all-to-all without padding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::moe {

struct DispatchInput {
  int num_experts = 0;
  int num_ranks = 0;
  // tokens[e * num_ranks + j]: tokens that rank j's gate routed to expert e (>= 0).
  std::vector<int64_t> tokens;
  // replicas[e * num_ranks + j]: replicas of expert e held by rank j (>= 0), e.g.
  // Placement::ReplicaMatrix().
  std::vector<int> replicas;
};

// Per-expert totals above this are rejected (products of two must fit in int64).
inline constexpr int64_t kMaxTokensPerExpert = int64_t{1} << 31;

struct TokenFlow {
  int expert = 0;
  int src = 0;
  int dst = 0;
  int64_t count = 0;
};

// The whole cluster's dispatch; every rank computes the same one from the same input.
//
// Each replica of expert e gets floor(t_e/r_e) or one more token (the first t_e mod r_e replicas
// in rank order get one more), so rank j's capacity for e is the sum over its replicas. A rank
// keeps min(tokens, capacity) locally; each overflowing rank, in rank order, splits its overflow
// over the ranks with residual capacity in proportion to that residual, rounding by largest
// remainder (ties to the lower rank).
struct DispatchPlan {
  int num_experts = 0;
  int num_ranks = 0;
  std::vector<int64_t> capacity;  // [e * N + j]: tokens of e that rank j processes
  std::vector<int64_t> local;     // [e * N + j]: of them, tokens j routed itself
  std::vector<TokenFlow> flows;   // remote tokens, sorted by (src, dst, expert)
};

// InvalidArgument on bad shapes or negative counts; FailedPrecondition when an expert has tokens
// but no replica.
absl::StatusOr<DispatchPlan> ComputeDispatch(const DispatchInput& input);

// One rank's share of the all-to-all. The send buffer holds, for each destination in rank order,
// that destination's tokens grouped by expert in expert order; the receive buffer likewise by
// source. Counts and offsets are in tokens.
struct RankExchange {
  int rank = 0;
  std::vector<int64_t> local;                      // [e]: tokens kept on this rank
  std::vector<int64_t> send_counts, send_offsets;  // [dst]
  std::vector<int64_t> recv_counts, recv_offsets;  // [src]
  std::vector<TokenFlow> sends;                    // this rank's flows, by (dst, expert)
  std::vector<TokenFlow> receives;                 // flows into this rank, by (src, expert)
  int64_t processed = 0;                           // local + received tokens
};

// What `rank` computes for itself (it evaluates the same deterministic plan as every rank).
absl::StatusOr<RankExchange> ComputeRankExchange(const DispatchInput& input, int rank);
RankExchange ExtractRankExchange(const DispatchPlan& plan, int rank);

// Dense flows [(e * N + src) * N + dst] (local tokens on the diagonal): what the CUDA kernel
// returns, for comparison with the CPU plan.
std::vector<int64_t> DenseFlows(const DispatchPlan& plan);

// CUDA implementation: same rules, one thread per expert. Unavailable (with the reason) when
// Plexus was built without CUDA or no GPU is usable. Returns DenseFlows() of the plan.
bool CudaDispatchAvailable(std::string* why_not = nullptr);
absl::StatusOr<std::vector<int64_t>> ComputeDispatchDenseCuda(const DispatchInput& input);

}  // namespace plexus::moe
