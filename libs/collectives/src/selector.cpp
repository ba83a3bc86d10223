#include "plexus/collectives/selector.hpp"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives {
namespace {

constexpr size_t kKiB = 1024;

// "*", "lo-hi", "lo-", "n"; the numbers in base::ParseBytes's forms (64K, 1MiB). `what` names
// the field in errors.
template <typename T>
absl::Status ParseRange(absl::string_view text, std::string_view what, T max, T* lo, T* hi) {
  if (text == "*") {
    *lo = 0;
    *hi = max;
    return absl::OkStatus();
  }
  const size_t dash = text.find('-');
  const absl::string_view first = dash == absl::string_view::npos ? text : text.substr(0, dash);
  PLEXUS_ASSIGN_OR_RETURN(const uint64_t a,
                          base::ParseBytes(std::string_view(first.data(), first.size()), what));
  uint64_t b = a;
  if (dash != absl::string_view::npos) {
    const absl::string_view second = text.substr(dash + 1);
    if (second.empty() || second == "*") {
      b = static_cast<uint64_t>(max);
    } else {
      PLEXUS_ASSIGN_OR_RETURN(
          b, base::ParseBytes(std::string_view(second.data(), second.size()), what));
    }
  }
  if (a > b || b > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " '", text, "' is empty or too large"));
  }
  *lo = static_cast<T>(a);
  *hi = static_cast<T>(b);
  return absl::OkStatus();
}

std::string RangeText(uint64_t lo, uint64_t hi, uint64_t max) {
  if (lo == 0 && hi == max) return "*";
  if (hi == max) return absl::StrCat(lo, "-");
  return absl::StrCat(lo, "-", hi);
}

}  // namespace

AlgorithmTable AlgorithmTable::Default(bool tcp) {
  constexpr int kAnyWorld = std::numeric_limits<int>::max();
  constexpr size_t kAnyBytes = std::numeric_limits<size_t>::max();
  using K = CollectiveKind;
  using A = Algorithm;
  std::vector<SelectorRule> rules({
      // Latency-bound allreduce: recursive doubling is log2(n) exchanges of the whole vector.
      {K::kAllReduce, 1, kAnyWorld, 0, 64 * kKiB - 1, A::kHalvingDoubling},
      {K::kAllReduce, 8, kAnyWorld, 64 * kKiB, 512 * kKiB - 1, A::kTree},
      {K::kAllReduce, 1, kAnyWorld, 64 * kKiB, kAnyBytes, A::kRing},
      {K::kBroadcast, 1, kAnyWorld, 0, 256 * kKiB - 1, A::kTree},
      {K::kBroadcast, 1, kAnyWorld, 256 * kKiB, kAnyBytes, A::kRing},
      {K::kReduce, 1, kAnyWorld, 0, 256 * kKiB - 1, A::kTree},
      {K::kReduce, 1, kAnyWorld, 256 * kKiB, kAnyBytes, A::kRing},
      // Small allgathers at world sizes that are not powers of two (halving-doubling needs one
      // there): Bruck's ceil(log2 n) rounds instead of the ring's n - 1, the same bytes.
      {K::kAllGather, 3, 3, 0, 64 * kKiB - 1, A::kBruck},
      {K::kAllGather, 5, 7, 0, 64 * kKiB - 1, A::kBruck},
      {K::kAllGather, 9, 15, 0, 64 * kKiB - 1, A::kBruck},
      {K::kAllGather, 17, 31, 0, 64 * kKiB - 1, A::kBruck},
      {K::kAllGather, 33, 63, 0, 64 * kKiB - 1, A::kBruck},
      {K::kAllGather, 1, kAnyWorld, 0, 64 * kKiB - 1, A::kHalvingDoubling},
      {K::kReduceScatter, 1, kAnyWorld, 0, 64 * kKiB - 1, A::kHalvingDoubling},
      {K::kBarrier, 1, kAnyWorld, 0, kAnyBytes, A::kHalvingDoubling},
  });
  if (tcp) {
    // 4 ranks over tcp (loopback, 4 ranks on 2 CPUs), each dependent step a round of system
    // calls and a peer to be scheduled: at 64-128 KiB whole-vector recursive doubling (2 steps,
    // 2 S bytes) beat halving-doubling (4 steps, 1.5 S); up to 8 MiB halving-doubling beat the
    // ring (6 steps, same bytes); from 16 MiB the ring was ahead. Over shm the ring stays ahead
    // from 64 KiB on a quiet machine. docs/collectives.md, "Selecting an algorithm"; the runs:
    // docs/measurements/collectives.md, "The last four short points (second pass)".
    rules.insert(
        rules.begin() + 1,
        {SelectorRule{K::kAllReduce, 4, 4, 64 * kKiB, 128 * kKiB - 1, A::kRecursiveDoubling},
         SelectorRule{K::kAllReduce, 4, 4, 128 * kKiB, 8 * kKiB * kKiB - 1, A::kHalvingDoubling}});
    // Broadcast, 4 ranks over tcp: the chain's 3 dependent hops (each a peer to be scheduled on
    // 2 CPUs) lost to the double tree's 2 at every size tried, 256 KiB to 16 MiB
    // (docs/measurements/collectives.md, "Broadcast over tcp and ReduceScatter without the
    // input copy").
    rules.insert(rules.begin(), SelectorRule{K::kBroadcast, 4, 4, 0, kAnyBytes, A::kTree});
    // Broadcast and Reduce, 2 ranks over tcp: the double tree cuts the vector into two halves,
    // two messages where the chain sends one; the chain took half the time from 8 B to 16 KiB
    // and was level from 64 KiB (docs/measurements/collectives.md, "Two ranks: one message, not
    // two halves").
    rules.insert(rules.begin(), {SelectorRule{K::kBroadcast, 2, 2, 0, kAnyBytes, A::kRing},
                                 SelectorRule{K::kReduce, 2, 2, 0, kAnyBytes, A::kRing}});
  } else {
    // 2 ranks not over tcp: from 4 KiB a Broadcast by the chain (one message) beat the tree by
    // mailbox (fragments of 2 KiB) and the double tree (two halves); from 8 KiB an AllGather by
    // the ring (one message each way) beat the mailbox exchange. Below, the mailbox wins
    // (docs/measurements/collectives.md, "Two ranks: one message, not two halves").
    rules.insert(rules.begin(),
                 {SelectorRule{K::kBroadcast, 2, 2, 4 * kKiB, kAnyBytes, A::kRing},
                  SelectorRule{K::kAllGather, 2, 2, 8 * kKiB, 64 * kKiB - 1, A::kRing}});
    // Reduce, 2 ranks not over tcp, 1 to 8 MiB: halving then a gather (each CPU reduces half
    // the vector) beat the chain, where the root's CPU reduces all of it (1 MiB 123 against
    // 198 us); the chain led again from 8 MiB (docs/measurements/collectives.md, "Two ranks: one
    // message, not two halves").
    rules.insert(rules.begin(), SelectorRule{K::kReduce, 2, 2, kKiB * kKiB, 8 * kKiB * kKiB - 1,
                                             A::kHalvingDoubling});
    // Reduce, 4 ranks over shm (4 ranks on 2 CPUs): from 1 to 8 MiB the pipelined double tree's
    // 2 dependent levels beat the ring's 6 steps, which also swung by 1.6x from one invocation
    // to the next at 1 MiB (313-349 against 372-584 us); the ring led at 256 KiB and 8 MiB
    // (docs/measurements/collectives.md, "Reduce with 4 processes over shm").
    rules.insert(rules.begin(),
                 SelectorRule{K::kReduce, 4, 4, kKiB * kKiB, 8 * kKiB * kKiB - 1, A::kTree});
  }
  return AlgorithmTable(std::move(rules));
}

absl::StatusOr<AlgorithmTable> AlgorithmTable::Parse(std::string_view text) {
  std::vector<SelectorRule> rules;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm table line ", line_no, " ('", absl::StripAsciiWhitespace(line), "'): ", why,
          "; expected '<collective> <world range> <byte range> <algorithm>'"));
    };
    if (fields.size() != 4) return fail(absl::StrCat("has ", fields.size(), " fields, not 4"));
    SelectorRule rule;
    auto kind = ParseCollective(std::string_view(fields[0].data(), fields[0].size()));
    if (!kind.ok()) return fail(kind.status().message());
    rule.collective = *kind;
    if (absl::Status s = ParseRange<int>(fields[1], "world range", std::numeric_limits<int>::max(),
                                         &rule.world_min, &rule.world_max);
        !s.ok()) {
      return fail(s.message());
    }
    if (absl::Status s =
            ParseRange<size_t>(fields[2], "byte range", std::numeric_limits<size_t>::max(),
                               &rule.bytes_min, &rule.bytes_max);
        !s.ok()) {
      return fail(s.message());
    }
    auto algorithm = ParseAlgorithm(std::string_view(fields[3].data(), fields[3].size()));
    if (!algorithm.ok()) return fail(algorithm.status().message());
    if (*algorithm == Algorithm::kAuto) return fail("'auto' cannot be the result of a rule");
    rule.algorithm = *algorithm;
    rules.push_back(rule);
  }
  return AlgorithmTable(std::move(rules));
}

absl::StatusOr<AlgorithmTable> AlgorithmTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read algorithm table file '", path, "'"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto table = Parse(ss.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", std::string(table.status().message())));
  }
  return table;
}

Algorithm AlgorithmTable::Select(CollectiveKind collective, int world_size, size_t bytes) const {
  for (const SelectorRule& r : rules_) {
    if (r.collective == collective && world_size >= r.world_min && world_size <= r.world_max &&
        bytes >= r.bytes_min && bytes <= r.bytes_max) {
      return r.algorithm;
    }
  }
  return Algorithm::kRing;
}

std::string AlgorithmTable::ToString() const {
  std::string out;
  for (const SelectorRule& r : rules_) {
    absl::StrAppend(&out, std::string(CollectiveName(r.collective)), " ",
                    RangeText(r.world_min, r.world_max, std::numeric_limits<int>::max()), " ",
                    RangeText(r.bytes_min, r.bytes_max, std::numeric_limits<size_t>::max()), " ",
                    std::string(AlgorithmName(r.algorithm)), "\n");
  }
  return out;
}

absl::StatusOr<AlgorithmOverrides> AlgorithmOverrides::Parse(std::string_view text) {
  AlgorithmOverrides out;
  for (absl::string_view item : absl::StrSplit(absl::string_view(text.data(), text.size()),
                                               absl::ByAnyChar(",;"), absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t colon = item.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("algorithm override '", item,
                       "' needs the form <collective>:<algorithm>, e.g. "
                       "allreduce:ring"));
    }
    const absl::string_view name = item.substr(0, colon);
    const absl::string_view algo_name = item.substr(colon + 1);
    PLEXUS_ASSIGN_OR_RETURN(const Algorithm algorithm,
                            ParseAlgorithm(std::string_view(algo_name.data(), algo_name.size())));
    if (name == "*") {
      for (int k = 0; k < kNumCollectiveKinds; ++k) out.by_collective[k] = algorithm;
      continue;
    }
    PLEXUS_ASSIGN_OR_RETURN(const CollectiveKind kind,
                            ParseCollective(std::string_view(name.data(), name.size())));
    out.Set(kind, algorithm);
  }
  return out;
}

}  // namespace plexus::collectives
