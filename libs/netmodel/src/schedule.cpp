// Collective schedules over positions (plexus/netmodel/schedule.hpp). The transfer order inside
// a round is part of the description: pricing adds rounds in order, and the simulator's event
// order follows the transfer indices.
#include "plexus/netmodel/schedule.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus::netmodel {
namespace {

absl::Status CheckSize(const std::string& what, int n, double bytes) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": n must be >= 1, got ", n));
  if (!(bytes >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bytes must be >= 0, got ", bytes));
  }
  return absl::OkStatus();
}

std::vector<int> After(int transfer) {
  return transfer >= 0 ? std::vector<int>{transfer} : std::vector<int>{};
}

// The pieces a transfer carries and what the receiver does with them.
struct Carries {
  int first = 0;
  int count = 0;
  bool combine = false;
};

int Add(Schedule& s, int src, int dst, double bytes, std::vector<int> after, int round,
        Carries c = {}) {
  s.transfers.push_back(
      {src, dst, bytes, std::move(after), -1, round, c.first, c.count, c.combine});
  return static_cast<int>(s.transfers.size()) - 1;
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

// The largest power of two <= n and its log2.
std::pair<int, int> PowerOfTwoBelow(int n) {
  int p2 = 1;
  int levels = 0;
  while (p2 * 2 <= n) {
    p2 *= 2;
    ++levels;
  }
  return {p2, levels};
}

// The fold of a non-power-of-two n: the first 2 * rem positions pair up, the even one of each
// pair handing its whole buffer to the odd one before the core and getting the result back
// after it. Core position np is position Real(np).
struct Fold {
  int p2 = 1, levels = 0, rem = 0;
  explicit Fold(int n) {
    std::tie(p2, levels) = PowerOfTwoBelow(n);
    rem = n - p2;
  }
  int Real(int np) const { return np < rem ? 2 * np + 1 : np + rem; }
  // Adds the fold-in round (round 0, when there is a fold); last_into[odd] = its transfer.
  void In(Schedule& s, double bytes, int pieces, std::vector<int>& last_into, int& round) const {
    if (rem == 0) return;
    for (int k = 0; k < rem; ++k) {
      last_into[2 * k + 1] = Add(s, 2 * k, 2 * k + 1, bytes, {}, round, {0, pieces, true});
    }
    ++round;
  }
  void Out(Schedule& s, double bytes, int pieces, const std::vector<int>& last_into,
           int round) const {
    for (int k = 0; k < rem; ++k) {
      Add(s, 2 * k + 1, 2 * k, bytes, After(last_into[2 * k + 1]), round, {0, pieces, false});
    }
  }
};

// The base-B exponent of n, or -1 when n is not a power of B.
int Exponent(int n, int base) {
  int digits = 0;
  int64_t power = 1;
  while (power < n) {
    power *= base;
    ++digits;
  }
  return power == n ? digits : -1;
}

// One in-order tree over indices i..j (positions shifted by `shift` mod n), edges parent ->
// child in depth-first order, each with its child's depth.
struct TreeEdge {
  int parent, child, depth;
};
void InOrderTree(int i, int j, int shift, int n, int depth, std::vector<TreeEdge>* edges) {
  const int m = (i + j) / 2;
  auto pos = [&](int index) { return ((index + shift) % n + n) % n; };
  for (auto [lo, hi] : {std::pair{i, m - 1}, std::pair{m + 1, j}}) {
    if (lo > hi) continue;
    edges->push_back({pos(m), pos((lo + hi) / 2), depth + 1});
    InOrderTree(lo, hi, shift, n, depth + 1, edges);
  }
}

}  // namespace

absl::StatusOr<Schedule> PlaceSchedule(Schedule schedule, std::span<const int> hosts) {
  const int n = static_cast<int>(hosts.size());
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    Transfer& t = schedule.transfers[i];
    if (t.src < 0 || t.src >= n || t.dst < 0 || t.dst >= n) {
      return absl::InvalidArgumentError(absl::StrCat(schedule.name, ": transfer ", i, " (", t.src,
                                                     " -> ", t.dst, ") names a position outside ",
                                                     "the ", n, " hosts"));
    }
    t.src = hosts[t.src];
    t.dst = hosts[t.dst];
  }
  return schedule;
}

absl::StatusOr<Schedule> RingAllreduceSchedule(int n, double bytes, int slices, Phases phases) {
  if (absl::Status st = CheckSize("ring", n, bytes); !st.ok()) return st;
  if (slices < 1) return absl::InvalidArgumentError(absl::StrCat("ring: slices ", slices, " < 1"));
  Schedule s{"ring", {}, bytes, n * slices};
  const double piece = bytes / n / slices;
  const int first = phases == Phases::kAllGather ? n - 1 : 0;
  const int last = phases == Phases::kReduceScatter ? n - 1 : 2 * (n - 1);
  for (int slice = 0; slice < slices; ++slice) {
    std::vector<int> last_into(n, -1);  // the previous round's transfer into each position
    for (int step = first; step < last; ++step) {
      const bool reduce = step < n - 1;
      std::vector<int> now(n, -1);
      for (int r = 0; r < n; ++r) {
        const int carried = reduce ? Mod(r - step, n) : Mod(r + 1 - (step - (n - 1)), n);
        now[(r + 1) % n] = Add(s, r, (r + 1) % n, piece, After(last_into[r]), step - first,
                               {slice * n + carried, 1, reduce});
      }
      last_into = std::move(now);
    }
  }
  return s;
}

absl::StatusOr<Schedule> HalvingDoublingSchedule(int n, double bytes, HalvingOrder order,
                                                 Phases phases) {
  if (absl::Status st = CheckSize("halving_doubling", n, bytes); !st.ok()) return st;
  const Fold fold(n);
  if (phases != Phases::kAllReduce && fold.rem > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "halving_doubling: a reduce-scatter or all-gather alone needs a power of two, got n = ",
        n));
  }
  const int p2 = fold.p2;
  Schedule s{"halving_doubling", {}, bytes, p2};
  std::vector<int> last_into(n, -1);
  int round = 0;
  fold.In(s, bytes, p2, last_into, round);
  // The pieces [lo, hi) each core position holds reduced (halving) or gathered (doubling).
  std::vector<int> lo(p2, 0), hi(p2, p2);
  auto mask_of = [&](int k) { return order == HalvingOrder::kFarFirst ? p2 >> (k + 1) : 1 << k; };
  // Round k of the halving carries bytes / 2^(k+1), whichever partner it pairs.
  auto halve = [&](int k) {
    const int mask = mask_of(k);
    std::vector<int> now = last_into;
    const double piece = bytes / static_cast<double>(int64_t{2} << k);
    std::vector<int> new_lo = lo, new_hi = hi;
    for (int np = 0; np < p2; ++np) {
      const int mid = lo[np] + (hi[np] - lo[np]) / 2;
      const bool keep_low = (np & mask) == 0;
      const int give = keep_low ? mid : lo[np];  // the half the partner keeps
      const int from = fold.Real(np), to = fold.Real(np ^ mask);
      now[to] = Add(s, from, to, piece, After(last_into[from]), round,
                    {give, (hi[np] - lo[np]) / 2, true});
      (keep_low ? new_hi[np] : new_lo[np]) = mid;
    }
    lo = std::move(new_lo);
    hi = std::move(new_hi);
    last_into = std::move(now);
    ++round;
  };
  // Doubling undoes halving round k: every core position sends what it holds and gets the
  // partner's, the two ranges side by side.
  auto double_up = [&](int k) {
    const int mask = mask_of(k);
    std::vector<int> now = last_into;
    const double piece = bytes / static_cast<double>(int64_t{2} << k);
    std::vector<int> new_lo = lo, new_hi = hi;
    for (int np = 0; np < p2; ++np) {
      const int partner = np ^ mask;
      const int from = fold.Real(np), to = fold.Real(partner);
      now[to] =
          Add(s, from, to, piece, After(last_into[from]), round, {lo[np], hi[np] - lo[np], false});
      new_lo[partner] = std::min(lo[partner], lo[np]);
      new_hi[partner] = std::max(hi[partner], hi[np]);
    }
    lo = std::move(new_lo);
    hi = std::move(new_hi);
    last_into = std::move(now);
    ++round;
  };
  if (phases == Phases::kAllGather) {
    // Every core position starts with its own piece: where a far-first halving leaves it.
    for (int np = 0; np < p2; ++np) {
      for (int k = 0; k < fold.levels; ++k) {
        const int mask = mask_of(k);
        const int mid = lo[np] + (hi[np] - lo[np]) / 2;
        ((np & mask) == 0 ? hi[np] : lo[np]) = mid;
      }
    }
  } else {
    for (int k = 0; k < fold.levels; ++k) halve(k);
  }
  if (phases != Phases::kReduceScatter) {
    for (int k = fold.levels - 1; k >= 0; --k) double_up(k);
  }
  fold.Out(s, bytes, p2, last_into, round);
  return s;
}

absl::StatusOr<Schedule> RecursiveDoublingSchedule(int n, double bytes) {
  if (absl::Status st = CheckSize("recursive_doubling", n, bytes); !st.ok()) return st;
  const Fold fold(n);
  Schedule s{"recursive_doubling", {}, bytes, 1};
  std::vector<int> last_into(n, -1);
  int round = 0;
  fold.In(s, bytes, 1, last_into, round);
  for (int mask = 1; mask < fold.p2; mask *= 2, ++round) {
    std::vector<int> now = last_into;
    for (int np = 0; np < fold.p2; ++np) {
      const int from = fold.Real(np), to = fold.Real(np ^ mask);
      now[to] = Add(s, from, to, bytes, After(last_into[from]), round, {0, 1, true});
    }
    last_into = std::move(now);
  }
  fold.Out(s, bytes, 1, last_into, round);
  return s;
}

absl::StatusOr<Schedule> BruckAllgatherSchedule(int n, double bytes) {
  if (absl::Status st = CheckSize("bruck", n, bytes); !st.ok()) return st;
  Schedule s{"bruck", {}, bytes, n};
  std::vector<std::vector<int>> into(n);  // every transfer into a position so far
  int round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    const int m = std::min(d, n - d);
    std::vector<std::vector<int>> now = into;
    for (int p = 0; p < n; ++p) {
      const int to = Mod(p - d, n);
      now[to].push_back(Add(s, p, to, m * bytes, into[p], round, {p, m, false}));
    }
    into = std::move(now);
  }
  return s;
}

absl::StatusOr<Schedule> DoubleBinaryTreeSchedule(int n, double bytes, bool reduce) {
  if (absl::Status st = CheckSize("double_binary_tree", n, bytes); !st.ok()) return st;
  Schedule s{"double_binary_tree", {}, bytes, 2};
  if (n < 2) return s;
  const double half = bytes / 2;
  std::vector<std::vector<TreeEdge>> trees(2);
  InOrderTree(0, n - 1, 0, n, 0, &trees[0]);
  InOrderTree(0, n - 1, -1, n, 0, &trees[1]);
  int depth = 0;
  for (const auto& tree : trees) {
    for (const TreeEdge& e : tree) depth = std::max(depth, e.depth);
  }
  for (int which = 0; which < 2; ++which) {
    const auto& tree = trees[which];
    // Reduce: deepest edges first; a child forwards once everything below it has arrived.
    std::vector<std::vector<int>> up_into(n);
    if (reduce) {
      for (int d = depth; d >= 1; --d) {
        for (const TreeEdge& e : tree) {
          if (e.depth != d) continue;
          up_into[e.parent].push_back(
              Add(s, e.child, e.parent, half, up_into[e.child], depth - d, {which, 1, true}));
        }
      }
    }
    // Broadcast in depth-first order: the root once reduced, every other node once it received.
    std::vector<int> down_into(n, -1);
    const int root = tree.front().parent;
    const int first_round = reduce ? depth : 0;
    for (const TreeEdge& e : tree) {
      std::vector<int> after = e.parent == root ? up_into[root] : After(down_into[e.parent]);
      down_into[e.child] = Add(s, e.parent, e.child, half, std::move(after),
                               first_round + e.depth - 1, {which, 1, false});
    }
  }
  return s;
}

absl::StatusOr<Schedule> BCubeSchedule(int n, double bytes, int base) {
  if (absl::Status st = CheckSize("bcube", n, bytes); !st.ok()) return st;
  if (base < 2) {
    return absl::InvalidArgumentError(absl::StrCat("bcube base must be >= 2, got ", base));
  }
  const int digits = Exponent(n, base);
  if (digits < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bcube: n must be a power of its base ", base, "; got n = ", n));
  }
  Schedule s{"bcube", {}, bytes};
  // Round d's pairs and size; the all-gather repeats the reduce-scatter's rounds backwards.
  std::vector<double> size(digits);
  double b = bytes;
  for (int d = 0; d < digits; ++d) size[d] = b /= base;
  std::vector<std::vector<int>> last_into(n);
  auto exchange = [&](int d, int round) {
    int64_t stride = 1;
    for (int k = 0; k < d; ++k) stride *= base;
    std::vector<std::vector<int>> now(n);
    for (int p = 0; p < n; ++p) {
      const int digit = static_cast<int>((p / stride) % base);
      for (int v = 0; v < base; ++v) {
        if (v == digit) continue;
        const int to = static_cast<int>(p + (v - digit) * stride);
        now[to].push_back(Add(s, p, to, size[d], last_into[p], round));
      }
    }
    last_into = std::move(now);
  };
  for (int d = 0; d < digits; ++d) exchange(d, d);
  for (int d = digits - 1; d >= 0; --d) exchange(d, 2 * digits - 1 - d);
  return s;
}

absl::StatusOr<Schedule> ShardedPsSchedule(int n, double bytes) {
  if (absl::Status st = CheckSize("sharded ps", n, bytes); !st.ok()) return st;
  Schedule s{"sharded ps", {}, bytes, n};
  const double shard = bytes / n;
  std::vector<std::vector<int>> into(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) into[j].push_back(Add(s, i, j, shard, {}, 0, {j, 1, true}));
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) {
      if (i != j) Add(s, j, i, shard, into[j], 1, {j, 1, false});
    }
  }
  return s;
}

absl::StatusOr<Schedule> RingChunkedSchedule(int n, double bytes, int chunks) {
  if (absl::Status st = CheckSize("ring-chunked", n, bytes); !st.ok()) return st;
  if (chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring-chunked: chunks ", chunks, " < 1"));
  }
  Schedule s{"ring-chunked", {}, bytes};
  if (n == 1) return s;
  const double piece = bytes / chunks;
  for (int c = 0; c < chunks; ++c) {
    int prev = -1;
    int round = 0;
    auto hop = [&](int from, int to) { prev = Add(s, from, to, piece, After(prev), round++); };
    for (int h = 0; h < n; ++h) hop(h, (h + 1) % n);  // reduce, back to position 0
    for (int h = 0; h + 1 < n; ++h) hop(h, h + 1);    // broadcast
  }
  return s;
}

absl::StatusOr<Schedule> FanoutTreeSchedule(int n, double bytes, int fanout) {
  if (absl::Status st = CheckSize("tree", n, bytes); !st.ok()) return st;
  if (fanout < 2) return absl::InvalidArgumentError(absl::StrCat("tree: fan-out ", fanout, " < 2"));
  const int depth = Exponent(n, fanout);
  if (depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree: ", n, " ranks is not a power of the fan-out ", fanout));
  }
  Schedule s{absl::StrCat("tree (fan-out ", fanout, ")"), {}, bytes};
  // last_into_up[r]: the up transfers into position r at the level just built.
  int64_t stride = 1;
  std::vector<std::vector<int>> last_into_up(n);
  for (int level = 1; level <= depth; ++level) {
    std::vector<std::vector<int>> next(n);
    const int64_t group = stride * fanout;
    for (int r = 0; r < n; r += static_cast<int>(stride)) {
      const int parent = static_cast<int>(r - r % group);
      next[parent].push_back(Add(s, r, parent, bytes, last_into_up[r], level - 1));
    }
    last_into_up = std::move(next);
    stride = group;
  }
  // Down: level d .. 1; a parent forwards once the result reached it.
  std::vector<int> result_at(n, -1);
  stride /= fanout;
  for (int level = depth; level >= 1; --level) {
    const int64_t group = stride * fanout;
    std::vector<int> next = result_at;
    for (int r = 0; r < n; r += static_cast<int>(stride)) {
      const int parent = static_cast<int>(r - r % group);
      std::vector<int> after = level == depth ? last_into_up[parent] : After(result_at[parent]);
      next[r] = Add(s, parent, r, bytes, std::move(after), 2 * depth - level);
    }
    result_at = std::move(next);
    stride /= fanout;
  }
  return s;
}

}  // namespace plexus::netmodel
