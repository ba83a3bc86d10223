#include "cost_model.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::netmodel {

std::string_view CostModelName(CostModel model) {
  switch (model) {
    case CostModel::kRing:
      return "ring";
    case CostModel::kHalvingDoubling:
      return "halving_doubling";
    case CostModel::kDoubleBinaryTree:
      return "double_binary_tree";
    case CostModel::kBCube:
      return "bcube";
  }
  return "?";
}

absl::StatusOr<CostModel> ParseCostModel(std::string_view name) {
  // Hyphens are accepted for underscores, as the communicator's algorithm names are.
  std::string s = absl::AsciiStrToLower(std::string(name));
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  if (s == "ring") return CostModel::kRing;
  if (s == "halving_doubling" || s == "hd") return CostModel::kHalvingDoubling;
  if (s == "double_binary_tree" || s == "dbt") return CostModel::kDoubleBinaryTree;
  if (s == "bcube") return CostModel::kBCube;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cost model '", std::string(name),
                   "' (expected ring, halving_doubling, double_binary_tree, bcube)"));
}

Pricing CostModelPricing(CostModel model) {
  switch (model) {
    case CostModel::kRing:
      return Pricing::kLinks;
    case CostModel::kDoubleBinaryTree:
      return Pricing::kChains;
    case CostModel::kHalvingDoubling:
    case CostModel::kBCube:
      break;
  }
  return Pricing::kRounds;
}

absl::StatusOr<Schedule> CostModelSchedule(int n, const CostOptions& options) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("cost model: n must be >= 1, got ", n));
  if (!(options.bytes >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost model: bytes must be >= 0, got ", options.bytes));
  }
  switch (options.model) {
    case CostModel::kRing:
      return RingAllreduceSchedule(n, options.bytes);
    case CostModel::kHalvingDoubling:
      return HalvingDoublingSchedule(n, options.bytes, HalvingOrder::kFarFirst);
    case CostModel::kDoubleBinaryTree:
      // The seed prices the trees by their broadcast (the reduce mirrors it): the dearest
      // root-to-leaf path.
      return DoubleBinaryTreeSchedule(n, options.bytes, /*reduce=*/false);
    case CostModel::kBCube:
      return BCubeSchedule(n, options.bytes, options.bcube_base);
  }
  return absl::InvalidArgumentError("cost model: unknown model");
}

namespace internal {
namespace {

// Chains enumerated beyond this many transfers in all are refused (dense DAGs explode).
constexpr size_t kMaxChainTransfers = size_t{1} << 24;

CostStructure RoundGroups(const Schedule& schedule) {
  CostStructure s;
  int rounds = 0;
  for (const Transfer& t : schedule.transfers) rounds = std::max(rounds, t.round + 1);
  std::vector<std::vector<PricedTransfer>> by_round(rounds);
  for (const Transfer& t : schedule.transfers) {
    if (t.src != t.dst) by_round[t.round].push_back({t.src, t.dst, t.bytes});
  }
  for (auto& group : by_round) {
    if (!group.empty()) s.groups.push_back(std::move(group));
  }
  return s;
}

CostStructure LinkGroups(const Schedule& schedule) {
  CostStructure s;
  absl::flat_hash_set<std::pair<int, int>> seen;
  for (const Transfer& t : schedule.transfers) {
    if (t.src != t.dst && seen.insert({t.src, t.dst}).second) {
      s.groups.push_back({{t.src, t.dst, schedule.bytes}});
    }
  }
  return s;
}

absl::StatusOr<CostStructure> ChainGroups(const Schedule& schedule) {
  CostStructure s;
  s.max_of_sums = true;
  const int count = static_cast<int>(schedule.transfers.size());
  std::vector<std::vector<int>> next(count);
  for (int i = 0; i < count; ++i) {
    for (int d : schedule.transfers[i].after) next[d].push_back(i);
  }
  size_t total = 0;
  std::vector<PricedTransfer> chain;
  // Depth-first from every transfer that waits for none; a group per chain ending in a transfer
  // nothing waits for.
  auto walk = [&](auto&& self, int i) -> bool {
    const Transfer& t = schedule.transfers[i];
    const bool local = t.src == t.dst;
    if (!local) chain.push_back({t.src, t.dst, t.bytes});
    if (next[i].empty()) {
      total += chain.size();
      if (total > kMaxChainTransfers) return false;
      if (!chain.empty()) s.groups.push_back(chain);
    }
    for (int j : next[i]) {
      if (!self(self, j)) return false;
    }
    if (!local) chain.pop_back();
    return true;
  };
  for (int i = 0; i < count; ++i) {
    if (!schedule.transfers[i].after.empty()) continue;
    if (!walk(walk, i)) {
      return absl::InvalidArgumentError(
          absl::StrCat(schedule.name, ": more than ", kMaxChainTransfers,
                       " transfers on its dependency chains; price it by rounds or links instead"));
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<CostStructure> PriceStructure(const Schedule& schedule, Pricing pricing) {
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    if (t.round < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(schedule.name, ": transfer ", i, " has round ", t.round, " < 0"));
    }
    for (int d : t.after) {
      if (d < 0 || static_cast<size_t>(d) >= i) {
        return absl::InvalidArgumentError(absl::StrCat(
            schedule.name, ": transfer ", i, " depends on ", d, ", which is not an earlier one"));
      }
    }
  }
  switch (pricing) {
    case Pricing::kRounds:
      return RoundGroups(schedule);
    case Pricing::kLinks:
      return LinkGroups(schedule);
    case Pricing::kChains:
      return ChainGroups(schedule);
  }
  return absl::InvalidArgumentError("unknown pricing");
}

absl::StatusOr<CostStructure> BuildCostStructure(int n, const CostOptions& options) {
  PLEXUS_ASSIGN_OR_RETURN(Schedule schedule, CostModelSchedule(n, options));
  return PriceStructure(schedule, CostModelPricing(options.model));
}

}  // namespace internal

absl::StatusOr<double> PriceSchedule(const Schedule& schedule, Pricing pricing,
                                     const CostMatrix& matrix, const std::vector<int>& order) {
  PLEXUS_RETURN_IF_ERROR(matrix.Validate());
  const int n = static_cast<int>(order.size());
  for (int p = 0; p < n; ++p) {
    if (order[p] < 0 || order[p] >= matrix.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "order[", p, "] = ", order[p], " is not a node of the ", matrix.n, "-node cost matrix"));
    }
  }
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    if (t.src < 0 || t.src >= n || t.dst < 0 || t.dst >= n) {
      return absl::InvalidArgumentError(absl::StrCat(schedule.name, ": transfer ", i, " (", t.src,
                                                     " -> ", t.dst, ") names a position outside ",
                                                     "the order's ", n));
    }
  }
  PLEXUS_ASSIGN_OR_RETURN(internal::CostStructure s, internal::PriceStructure(schedule, pricing));
  return internal::EvaluateOrder(s, matrix, order);
}

}  // namespace plexus::netmodel
