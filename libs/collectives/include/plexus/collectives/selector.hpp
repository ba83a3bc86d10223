// The algorithm selector: a tunable table of (collective, world sizes, message sizes) ->
// algorithm rules, plus the overrides that take precedence over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/collectives/types.hpp"

namespace plexus::collectives {

// One row of the table: applies to `collective` when world_min <= world size <= world_max and
// bytes_min <= message bytes <= bytes_max. "Message bytes" is the size of one rank's full buffer
// (count * element size; for AllGather the gathered output).
struct SelectorRule {
  CollectiveKind collective = CollectiveKind::kAllReduce;
  int world_min = 1;
  int world_max = std::numeric_limits<int>::max();
  size_t bytes_min = 0;
  size_t bytes_max = std::numeric_limits<size_t>::max();
  Algorithm algorithm = Algorithm::kRing;
};

// Rules are tried in order; the first match wins. Collectives without a matching rule use kRing
// (AllToAll/AllToAllV/SendRecv ignore the algorithm: they are pairwise exchanges).
//
// Text form (PLEXUS_COLL_TABLE=<file>, AlgorithmTable::Parse): one rule per line,
//   <collective> <world range> <byte range> <algorithm>
// where a range is "lo-hi", "lo-" (no upper bound), a single number or "*", numbers may carry
// K/M/G or KiB/MiB/GiB suffixes (powers of 1024; base::ParseBytes), and '#' starts a comment.
// Example:
//   allreduce  2-*   0-64K   halving_doubling
//   allreduce  *     64K-    ring
class AlgorithmTable {
 public:
  // The built-in table, tuned on a 2-core VM for tcp and shm (docs/collectives.md). With
  // `tcp` (some pair of ranks talks over tcp) 4 ranks take halving-doubling from 64 to 512 KiB,
  // where its 4 dependent steps beat the ring's 6; over shm the ring stays ahead there.
  static AlgorithmTable Default(bool tcp = false);
  // Parses the text form; InvalidArgument naming the line and the bad field.
  static absl::StatusOr<AlgorithmTable> Parse(std::string_view text);
  // Reads and parses a table file.
  static absl::StatusOr<AlgorithmTable> Load(const std::string& path);

  AlgorithmTable() = default;
  explicit AlgorithmTable(std::vector<SelectorRule> rules) : rules_(std::move(rules)) {}

  // The algorithm of the first matching rule (kRing when none matches). Never kAuto.
  Algorithm Select(CollectiveKind collective, int world_size, size_t bytes) const;
  const std::vector<SelectorRule>& rules() const { return rules_; }
  // The table in its text form (Parse(ToString()) gives the same rules).
  std::string ToString() const;

 private:
  std::vector<SelectorRule> rules_;
};

// Per-collective algorithm overrides, from PLEXUS_COLL_ALGO-style text:
// "allreduce:ring,broadcast:tree" (',' or ';' separated; "*:<algorithm>" applies to all).
// Entries are kAuto where nothing is forced.
struct AlgorithmOverrides {
  Algorithm by_collective[kNumCollectiveKinds] = {};
  static absl::StatusOr<AlgorithmOverrides> Parse(std::string_view text);
  Algorithm Get(CollectiveKind kind) const { return by_collective[static_cast<int>(kind)]; }
  void Set(CollectiveKind kind, Algorithm algorithm) {
    by_collective[static_cast<int>(kind)] = algorithm;
  }
};

}  // namespace plexus::collectives
