#include "cost_model.hpp"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

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

namespace internal {
namespace {

// Ring (seed: C_r = sum_i c_{i,i-1}(S)): position i sends to i + 1.
void RingGroups(int n, double bytes, CostStructure* s) {
  if (n < 2) return;
  for (int i = 0; i < n; ++i) s->groups.push_back({{i, (i + 1) % n, bytes}});
}

// Halving-doubling as the communicator runs it (src/algorithms.cpp): over the largest power of
// two p2 <= n, the first 2 * (n - p2) positions fold in pairwise (even -> odd, whole buffer);
// recursive halving with partners np ^ mask, mask = p2/2 .. 1, carrying bytes * mask / p2; then
// recursive doubling, mask = 1 .. p2/2; then the fold out (odd -> even). Each step is a round
// whose cost is its slowest transfer (seed: C_hd = sum over rounds of the max over pairs).
void HalvingDoublingGroups(int n, double bytes, CostStructure* s) {
  if (n < 2) return;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  auto real = [&](int np) { return np < rem ? 2 * np + 1 : np + rem; };
  if (rem > 0) {
    std::vector<Transfer> fold;
    for (int k = 0; k < rem; ++k) fold.push_back({2 * k, 2 * k + 1, bytes});
    s->groups.push_back(std::move(fold));
  }
  auto round = [&](int mask) {
    std::vector<Transfer> g;
    const double b = bytes * mask / p2;
    for (int np = 0; np < p2; ++np) g.push_back({real(np), real(np ^ mask), b});
    s->groups.push_back(std::move(g));
  };
  for (int mask = p2 / 2; mask >= 1; mask /= 2) round(mask);
  for (int mask = 1; mask < p2; mask *= 2) round(mask);
  if (rem > 0) {
    std::vector<Transfer> fold;
    for (int k = 0; k < rem; ++k) fold.push_back({2 * k + 1, 2 * k, bytes});
    s->groups.push_back(std::move(fold));
  }
}

// Double binary tree (seed: C_dbt = T(0, n-1, S)): an in-order tree over indices i..j rooted at
// (i+j)/2 whose children are the roots of [i, m-1] and [m+1, j] (the printed child indices are
// garbled in the seed; this is their evident meaning), each edge carrying half of the buffer; the
// second tree is the first with every index decremented (mod n). The cost is the most expensive
// root-to-leaf path of either tree.
void TreePaths(int i, int j, int shift, int n, double bytes, std::vector<Transfer>* path,
               CostStructure* s) {
  const int m = (i + j) / 2;
  auto pos = [&](int index) { return ((index + shift) % n + n) % n; };
  bool leaf = true;
  for (auto [lo, hi] : {std::pair{i, m - 1}, std::pair{m + 1, j}}) {
    if (lo > hi) continue;
    leaf = false;
    path->push_back({pos(m), pos((lo + hi) / 2), bytes});
    TreePaths(lo, hi, shift, n, bytes, path, s);
    path->pop_back();
  }
  if (leaf && !path->empty()) s->groups.push_back(*path);
}

absl::Status BCubeGroups(int n, double bytes, int base, CostStructure* s) {
  if (base < 2)
    return absl::InvalidArgumentError(absl::StrCat("bcube base must be >= 2, got ", base));
  int digits = 0;
  int64_t power = 1;
  while (power < n) {
    power *= base;
    ++digits;
  }
  if (power != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the bcube cost model needs n to be a power of its base ", base, "; got n = ", n));
  }
  // Seed: C_b = sum_i MAX_j MAX_k c_{j, j + k B^i}(S / B^{i+1}): in round i every position
  // exchanges S / B^{i+1} with the B - 1 positions that differ from it in base-B digit i. The
  // reduce-scatter rounds, then the all-gather rounds in reverse (an allreduce runs both).
  std::vector<std::vector<Transfer>> rounds;
  int64_t stride = 1;
  double b = bytes;
  for (int d = 0; d < digits; ++d, stride *= base) {
    b /= base;
    std::vector<Transfer> g;
    for (int p = 0; p < n; ++p) {
      const int digit = static_cast<int>((p / stride) % base);
      for (int v = 0; v < base; ++v) {
        if (v == digit) continue;
        g.push_back({p, static_cast<int>(p + (v - digit) * stride), b});
      }
    }
    rounds.push_back(std::move(g));
  }
  for (const auto& r : rounds) s->groups.push_back(r);
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) s->groups.push_back(*it);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostStructure> BuildCostStructure(int n, const CostOptions& options) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("cost model: n must be >= 1, got ", n));
  if (!(options.bytes >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost model: bytes must be >= 0, got ", options.bytes));
  }
  CostStructure s;
  s.n = n;
  switch (options.model) {
    case CostModel::kRing:
      RingGroups(n, options.bytes, &s);
      break;
    case CostModel::kHalvingDoubling:
      HalvingDoublingGroups(n, options.bytes, &s);
      break;
    case CostModel::kDoubleBinaryTree: {
      s.max_of_sums = true;
      std::vector<Transfer> path;
      if (n >= 2) {
        TreePaths(0, n - 1, 0, n, options.bytes / 2, &path, &s);
        TreePaths(0, n - 1, -1, n, options.bytes / 2, &path, &s);
      }
      break;
    }
    case CostModel::kBCube: {
      auto status = BCubeGroups(n, options.bytes, options.bcube_base, &s);
      if (!status.ok()) return status;
      break;
    }
  }
  return s;
}

}  // namespace internal
}  // namespace plexus::netmodel
