#include "plexus/netmodel/flow_schedules.hpp"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace plexus::netmodel::sim {
namespace {

absl::Status CheckRanks(const std::string& what, std::span<const int> hosts, double bytes) {
  if (hosts.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no ranks"));
  if (!std::isfinite(bytes) || bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer bytes ", bytes, " must be >= 0"));
  }
  std::set<int> seen;
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", r, " has a negative host ", hosts[r]));
    }
    if (!seen.insert(hosts[r]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", r, " reuses host ", hosts[r], " (one rank per host)"));
    }
  }
  return absl::OkStatus();
}

int Add(Schedule& s, int src, int dst, double bytes, std::vector<int> after) {
  s.transfers.push_back({src, dst, bytes, std::move(after)});
  return static_cast<int>(s.transfers.size()) - 1;
}

}  // namespace

absl::StatusOr<Schedule> ShardedPsSchedule(std::span<const int> hosts, double bytes) {
  if (absl::Status st = CheckRanks("sharded ps", hosts, bytes); !st.ok()) return st;
  const int p = static_cast<int>(hosts.size());
  Schedule s{"sharded ps", {}};
  const double shard = bytes / p;
  std::vector<std::vector<int>> into(p);
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j) {
      if (i != j) into[j].push_back(Add(s, hosts[i], hosts[j], shard, {}));
    }
  }
  for (int j = 0; j < p; ++j) {
    for (int i = 0; i < p; ++i) {
      if (i != j) Add(s, hosts[j], hosts[i], shard, into[j]);
    }
  }
  return s;
}

absl::StatusOr<Schedule> RingSchedule(std::span<const int> hosts, double bytes, int slices) {
  if (absl::Status st = CheckRanks("ring", hosts, bytes); !st.ok()) return st;
  if (slices < 1) return absl::InvalidArgumentError(absl::StrCat("ring: slices ", slices, " < 1"));
  const int p = static_cast<int>(hosts.size());
  Schedule s{"ring", {}};
  const double piece = bytes / p / slices;
  for (int slice = 0; slice < slices; ++slice) {
    std::vector<int> last_into(p, -1);  // the previous step's transfer into each rank
    for (int step = 0; step < 2 * (p - 1); ++step) {
      std::vector<int> now(p, -1);
      for (int r = 0; r < p; ++r) {
        std::vector<int> after;
        if (last_into[r] >= 0) after.push_back(last_into[r]);
        now[(r + 1) % p] = Add(s, hosts[r], hosts[(r + 1) % p], piece, std::move(after));
      }
      last_into = now;
    }
  }
  return s;
}

absl::StatusOr<Schedule> RingChunkedSchedule(std::span<const int> hosts, double bytes, int chunks) {
  if (absl::Status st = CheckRanks("ring-chunked", hosts, bytes); !st.ok()) return st;
  if (chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring-chunked: chunks ", chunks, " < 1"));
  }
  const int p = static_cast<int>(hosts.size());
  Schedule s{"ring-chunked", {}};
  if (p == 1) return s;
  const double piece = bytes / chunks;
  for (int c = 0; c < chunks; ++c) {
    int prev = -1;
    auto hop = [&](int from, int to) {
      std::vector<int> after;
      if (prev >= 0) after.push_back(prev);
      prev = Add(s, hosts[from], hosts[to], piece, std::move(after));
    };
    for (int h = 0; h < p; ++h) hop(h, (h + 1) % p);  // reduce, back to rank 0
    for (int h = 0; h + 1 < p; ++h) hop(h, h + 1);    // broadcast
  }
  return s;
}

absl::StatusOr<Schedule> HalvingDoublingSchedule(std::span<const int> hosts, double bytes) {
  if (absl::Status st = CheckRanks("halving_doubling", hosts, bytes); !st.ok()) return st;
  const int p = static_cast<int>(hosts.size());
  if ((p & (p - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("halving-doubling: ", p, " ranks is not a power of two"));
  }
  int levels = 0;
  while ((1 << levels) < p) ++levels;
  Schedule s{"halving_doubling", {}};
  std::vector<int> last_into(p, -1);
  auto round = [&](int i) {
    std::vector<int> now(p, -1);
    for (int r = 0; r < p; ++r) {
      const int partner = r ^ (1 << i);
      std::vector<int> after;
      if (last_into[r] >= 0) after.push_back(last_into[r]);
      now[partner] = Add(s, hosts[r], hosts[partner], bytes / (1 << (i + 1)), std::move(after));
    }
    last_into = now;
  };
  for (int i = 0; i < levels; ++i) round(i);       // reduce-scatter
  for (int i = levels - 1; i >= 0; --i) round(i);  // allgather
  return s;
}

absl::StatusOr<Schedule> TreeSchedule(std::span<const int> hosts, double bytes, int fanout) {
  if (absl::Status st = CheckRanks("tree", hosts, bytes); !st.ok()) return st;
  const int p = static_cast<int>(hosts.size());
  if (fanout < 2) return absl::InvalidArgumentError(absl::StrCat("tree: fan-out ", fanout, " < 2"));
  int depth = 0;
  int64_t span = 1;
  while (span < p) {
    span *= fanout;
    ++depth;
  }
  if (span != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree: ", p, " ranks is not a power of the fan-out ", fanout));
  }
  Schedule s{absl::StrCat("tree (fan-out ", fanout, ")"), {}};
  // last_into_up[r]: the up transfers into rank r at the level just built.
  int64_t stride = 1;
  std::vector<std::vector<int>> last_into_up(p);
  for (int level = 1; level <= depth; ++level) {
    std::vector<std::vector<int>> next(p);
    const int64_t group = stride * fanout;
    for (int r = 0; r < p; r += static_cast<int>(stride)) {
      const int parent = static_cast<int>(r - r % group);
      next[parent].push_back(Add(s, hosts[r], hosts[parent], bytes, last_into_up[r]));
    }
    last_into_up = std::move(next);
    stride = group;
  }
  // Down: level d .. 1; a parent forwards once the result reached it.
  std::vector<int> result_at(p, -1);
  stride = span / fanout;
  for (int level = depth; level >= 1; --level) {
    const int64_t group = stride * fanout;
    std::vector<int> next = result_at;
    for (int r = 0; r < p; r += static_cast<int>(stride)) {
      const int parent = static_cast<int>(r - r % group);
      std::vector<int> after =
          level == depth ? last_into_up[parent] : std::vector<int>{result_at[parent]};
      next[r] = Add(s, hosts[parent], hosts[r], bytes, std::move(after));
    }
    result_at = std::move(next);
    stride /= fanout;
  }
  return s;
}

}  // namespace plexus::netmodel::sim
