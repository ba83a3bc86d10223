#include <catch2/catch.hpp>
#include <random>

#include "plexus/moe/dispatch.hpp"

namespace plexus::moe {
namespace {

DispatchInput RandomInput(std::mt19937& rng, int experts, int ranks) {
  DispatchInput in;
  in.num_experts = experts;
  in.num_ranks = ranks;
  in.tokens.resize(static_cast<size_t>(experts) * ranks);
  in.replicas.resize(in.tokens.size());
  for (int e = 0; e < experts; ++e) {
    const int scale = 1 + rng() % 500;
    bool any = false;
    for (int j = 0; j < ranks; ++j) {
      in.tokens[e * ranks + j] = rng() % (scale + 1);
      in.replicas[e * ranks + j] = (rng() % 3 == 0) ? 1 + rng() % 2 : 0;
      any = any || in.replicas[e * ranks + j] > 0;
    }
    if (!any) in.replicas[e * ranks + rng() % ranks] = 1;
  }
  return in;
}

TEST_CASE("Dispatch keeps local tokens first and spreads overflow by residual", "[moe][dispatch]") {
  DispatchInput in{1, 3, {5, 0, 0}, {1, 1, 1}};
  absl::StatusOr<DispatchPlan> plan = ComputeDispatch(in);
  REQUIRE(plan.ok());
  // 5 tokens over 3 replicas: quotas 2, 2, 1 (the first 5 mod 3 replicas get one more).
  CHECK(plan->capacity == std::vector<int64_t>{2, 2, 1});
  CHECK(plan->local == std::vector<int64_t>{2, 0, 0});
  REQUIRE(plan->flows.size() == 2);
  CHECK(plan->flows[0].dst == 1);
  CHECK(plan->flows[0].count == 2);
  CHECK(plan->flows[1].dst == 2);
  CHECK(plan->flows[1].count == 1);
}

TEST_CASE("Dispatch rounds by largest remainder, ties to the lower rank", "[moe][dispatch]") {
  // Ranks 0 and 1 overflow 1 token each into ranks 2 and 3 (residual 1 each): rank 0's token
  // has shares 1/2 and 1/2, the tie goes to rank 2; rank 1's then goes to rank 3.
  DispatchInput in{1, 4, {2, 2, 0, 0}, {1, 1, 1, 1}};
  absl::StatusOr<DispatchPlan> plan = ComputeDispatch(in);
  REQUIRE(plan.ok());
  REQUIRE(plan->flows.size() == 2);
  CHECK((plan->flows[0].src == 0 && plan->flows[0].dst == 2));
  CHECK((plan->flows[1].src == 1 && plan->flows[1].dst == 3));
}

TEST_CASE("Dispatch properties hold on random inputs", "[moe][dispatch]") {
  std::mt19937 rng(99);
  for (int it = 0; it < 300; ++it) {
    const int experts = 1 + rng() % 12;
    const int ranks = 1 + rng() % 16;
    const DispatchInput in = RandomInput(rng, experts, ranks);
    absl::StatusOr<DispatchPlan> plan = ComputeDispatch(in);
    REQUIRE(plan.ok());
    std::vector<int64_t> sent(in.tokens.size(), 0), received(in.tokens.size(), 0);
    for (const TokenFlow& f : plan->flows) {
      CHECK(f.src != f.dst);
      CHECK(f.count > 0);
      sent[f.expert * ranks + f.src] += f.count;
      received[f.expert * ranks + f.dst] += f.count;
    }
    for (int e = 0; e < experts; ++e) {
      int64_t t = 0, r = 0, processed = 0;
      for (int j = 0; j < ranks; ++j) {
        t += in.tokens[e * ranks + j];
        r += in.replicas[e * ranks + j];
      }
      for (int j = 0; j < ranks; ++j) {
        const size_t i = e * ranks + j;
        // Tokens conserved per source, local first, capacity filled exactly.
        CHECK(plan->local[i] + sent[i] == in.tokens[i]);
        CHECK(plan->local[i] == std::min(in.tokens[i], plan->capacity[i]));
        CHECK(plan->local[i] + received[i] == plan->capacity[i]);
        if (sent[i] > 0) CHECK(received[i] == 0);
        // Each replica within 1 of t/r.
        CHECK(plan->capacity[i] >= in.replicas[i] * (t / r));
        CHECK(plan->capacity[i] <= in.replicas[i] * ((t + r - 1) / r));
        processed += plan->capacity[i];
      }
      CHECK(processed == t);
    }
    // What every rank computes for itself agrees pairwise.
    std::vector<RankExchange> views;
    for (int j = 0; j < ranks; ++j) {
      absl::StatusOr<RankExchange> view = ComputeRankExchange(in, j);
      REQUIRE(view.ok());
      views.push_back(*std::move(view));
    }
    for (int i = 0; i < ranks; ++i) {
      int64_t offset = 0;
      for (int j = 0; j < ranks; ++j) {
        CHECK(views[i].send_counts[j] == views[j].recv_counts[i]);
        CHECK(views[i].send_offsets[j] == offset);
        offset += views[i].send_counts[j];
        std::vector<std::pair<int, int64_t>> out, in_j;
        for (const TokenFlow& f : views[i].sends) {
          if (f.dst == j) out.emplace_back(f.expert, f.count);
        }
        for (const TokenFlow& f : views[j].receives) {
          if (f.src == i) in_j.emplace_back(f.expert, f.count);
        }
        CHECK(out == in_j);  // same experts in the same buffer order
      }
    }
  }
}

TEST_CASE("Dispatch rejects bad input", "[moe][dispatch]") {
  CHECK(ComputeDispatch(DispatchInput{0, 2, {}, {}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ComputeDispatch(DispatchInput{1, 2, {1}, {1, 1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ComputeDispatch(DispatchInput{1, 2, {1, -1}, {1, 1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ComputeDispatch(DispatchInput{1, 2, {1, 1}, {1, -1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  absl::Status orphan = ComputeDispatch(DispatchInput{1, 2, {3, 1}, {0, 0}}).status();
  CHECK(orphan.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(orphan.message()).find("no replica") != std::string::npos);
  CHECK(ComputeRankExchange(DispatchInput{1, 2, {1, 1}, {1, 1}}, 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ComputeDispatch(DispatchInput{1, 1, {kMaxTokensPerExpert + 1}, {1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace plexus::moe
