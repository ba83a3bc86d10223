#include "plexus/moe/dispatch.hpp"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "dispatch_core.hpp"
#include "dispatch_internal.hpp"
#include "plexus/base/status.hpp"

namespace plexus::moe {
namespace internal {

absl::Status ValidateDispatchInput(const DispatchInput& input) {
  if (input.num_experts <= 0 || input.num_ranks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch needs positive experts and ranks (got ", input.num_experts,
                     " experts, ", input.num_ranks, " ranks)"));
  }
  const size_t cells = static_cast<size_t>(input.num_experts) * input.num_ranks;
  if (input.tokens.size() != cells || input.replicas.size() != cells) {
    return absl::InvalidArgumentError(
        absl::StrCat("token and replica matrices must have experts x ranks = ", cells,
                     " entries (got ", input.tokens.size(), " and ", input.replicas.size(), ")"));
  }
  for (int e = 0; e < input.num_experts; ++e) {
    int64_t tokens = 0;
    int64_t replicas = 0;
    for (int j = 0; j < input.num_ranks; ++j) {
      const size_t i = static_cast<size_t>(e) * input.num_ranks + j;
      if (input.tokens[i] < 0 || input.replicas[i] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("negative count for expert ", e, " on rank ",
                                                       j, " (tokens ", input.tokens[i],
                                                       ", replicas ", input.replicas[i], ")"));
      }
      tokens += input.tokens[i];
      replicas += input.replicas[i];
      if (tokens > kMaxTokensPerExpert) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert ", e, " has more than ", kMaxTokensPerExpert, " tokens"));
      }
    }
    if (tokens > 0 && replicas == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", e, " has ", tokens, " tokens but no replica on any rank; re-plan first"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

namespace {
struct CollectFlows {
  int expert;
  std::vector<TokenFlow>* flows;
  void operator()(int src, int dst, int64_t count) {
    flows->push_back(TokenFlow{expert, src, dst, count});
  }
};
}  // namespace

absl::StatusOr<DispatchPlan> ComputeDispatch(const DispatchInput& input) {
  PLEXUS_RETURN_IF_ERROR(internal::ValidateDispatchInput(input));
  const int n = input.num_ranks;
  DispatchPlan plan;
  plan.num_experts = input.num_experts;
  plan.num_ranks = n;
  plan.capacity.assign(input.tokens.size(), 0);
  plan.local.assign(input.tokens.size(), 0);
  std::vector<int> holders(n), order(n);
  std::vector<int64_t> residual(n), share(n), remainder(n);
  const internal::DispatchScratch scratch{holders.data(), residual.data(), share.data(),
                                          remainder.data(), order.data()};
  for (int e = 0; e < input.num_experts; ++e) {
    const size_t row = static_cast<size_t>(e) * n;
    CollectFlows emit{e, &plan.flows};
    internal::DispatchOneExpert(n, input.tokens.data() + row, input.replicas.data() + row,
                                plan.capacity.data() + row, plan.local.data() + row, scratch, emit);
  }
  std::sort(plan.flows.begin(), plan.flows.end(), [](const TokenFlow& a, const TokenFlow& b) {
    return std::tie(a.src, a.dst, a.expert) < std::tie(b.src, b.dst, b.expert);
  });
  return plan;
}

RankExchange ExtractRankExchange(const DispatchPlan& plan, int rank) {
  const int n = plan.num_ranks;
  RankExchange ex;
  ex.rank = rank;
  ex.local.resize(plan.num_experts);
  for (int e = 0; e < plan.num_experts; ++e) {
    ex.local[e] = plan.local[static_cast<size_t>(e) * n + rank];
    ex.processed += ex.local[e];
  }
  ex.send_counts.assign(n, 0);
  ex.recv_counts.assign(n, 0);
  for (const TokenFlow& f : plan.flows) {
    if (f.src == rank) {
      ex.sends.push_back(f);
      ex.send_counts[f.dst] += f.count;
    }
    if (f.dst == rank) {
      ex.receives.push_back(f);
      ex.recv_counts[f.src] += f.count;
      ex.processed += f.count;
    }
  }
  // Flows are sorted by (src, dst, expert): sends come out by (dst, expert) and receives by
  // (src, expert), the buffer layouts the offsets describe.
  ex.send_offsets.assign(n, 0);
  ex.recv_offsets.assign(n, 0);
  for (int j = 1; j < n; ++j) {
    ex.send_offsets[j] = ex.send_offsets[j - 1] + ex.send_counts[j - 1];
    ex.recv_offsets[j] = ex.recv_offsets[j - 1] + ex.recv_counts[j - 1];
  }
  return ex;
}

absl::StatusOr<RankExchange> ComputeRankExchange(const DispatchInput& input, int rank) {
  if (rank < 0 || rank >= input.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside [0, ", input.num_ranks, ")"));
  }
  PLEXUS_ASSIGN_OR_RETURN(DispatchPlan plan, ComputeDispatch(input));
  return ExtractRankExchange(plan, rank);
}

std::vector<int64_t> DenseFlows(const DispatchPlan& plan) {
  const size_t n = plan.num_ranks;
  const size_t experts = plan.num_experts;
  std::vector<int64_t> dense(experts * n * n, 0);
  for (size_t e = 0; e < experts; ++e) {
    for (size_t j = 0; j < n; ++j) dense[(e * n + j) * n + j] = plan.local[e * n + j];
  }
  for (const TokenFlow& f : plan.flows) {
    dense[(static_cast<size_t>(f.expert) * n + f.src) * n + f.dst] += f.count;
  }
  return dense;
}

}  // namespace plexus::moe
