#include "plexus/aggregation/plan.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace plexus::aggregation {
namespace {

std::string Describe(const Plan& plan, int i) {
  const Step& s = plan.steps[i];
  return absl::StrCat("step ", i, " (", std::string(StepKindName(s.kind)), " at node ", s.node,
                      ", chunk ", s.chunk, ")");
}

// The sending step matched with every receive (-1 elsewhere).
absl::StatusOr<std::vector<int>> MatchReceives(const Plan& plan) {
  std::map<std::tuple<int, int, int>, std::deque<int>> sent;  // (src, dst, chunk) -> send steps
  std::vector<int> match(plan.steps.size(), -1);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kBroadcast) {
      for (int p : s.peers) sent[{s.node, p, s.chunk}].push_back(static_cast<int>(i));
    } else if (s.kind == StepKind::kReceive) {
      auto it = sent.find({s.peers[0], s.node, s.chunk});
      if (it == sent.end() || it->second.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(Describe(plan, static_cast<int>(i)),
                                                          ": no earlier send from node ",
                                                          s.peers[0], " matches this receive"));
      }
      match[i] = it->second.front();
      it->second.pop_front();
    }
  }
  for (const auto& [key, steps] : sent) {
    if (!steps.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(Describe(plan, steps.front()),
                                                        ": its message to node ", std::get<1>(key),
                                                        " is never received"));
    }
  }
  return match;
}

absl::Status CheckShape(const Plan& plan) {
  if (plan.nodes < 1) return absl::InvalidArgumentError("plan: no nodes");
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const std::string what = Describe(plan, static_cast<int>(i));
    if (s.node < 0 || s.node >= plan.nodes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": node outside [0, ", plan.nodes, ")"));
    }
    if (s.chunk < 0 || static_cast<size_t>(s.chunk) >= plan.chunks.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown chunk"));
    }
    const bool needs_one = s.kind == StepKind::kSend || s.kind == StepKind::kReceive;
    if (needs_one && s.peers.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": needs exactly one peer"));
    }
    if (s.kind == StepKind::kBroadcast && s.peers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": broadcast to nobody"));
    }
    for (int p : s.peers) {
      if (p < 0 || p >= plan.nodes || p == s.node) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad peer ", p));
      }
    }
    for (int a : s.after) {
      if (a < 0 || static_cast<size_t>(a) >= i) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": waits for step ", a, ", which is not an earlier step"));
      }
      if (plan.steps[a].node != s.node || plan.steps[a].chunk != s.chunk) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": waits for ", Describe(plan, a), " of another node or chunk"));
      }
    }
  }
  int64_t expect = 0;
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    if (plan.chunks[c].offset != expect || plan.chunks[c].elements < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: chunk ", c, " does not continue the buffer at element ", expect));
    }
    expect += plan.chunks[c].elements;
  }
  return absl::OkStatus();
}

// Contributions as a bit set plus the number of optimizer runs.
struct Symbol {
  std::vector<uint64_t> bits;
  int optimized = 0;
};

// Runs `plan` in step order with values of type V: ops.add(dst, src) (false: refused, with
// *why set), ops.optimize, ops.complete.
template <typename V, typename Ops>
absl::Status Run(const Plan& plan, const std::vector<int>& match,
                 std::vector<std::vector<V>>& value, Ops& ops) {
  std::map<std::pair<int, int>, V> message;  // (send step, peer) -> value
  std::vector<V> inbox(plan.steps.size());
  std::vector<char> consumed(plan.steps.size(), 0);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const std::string what = Describe(plan, static_cast<int>(i));
    V& mine = value[s.node][s.chunk];
    switch (s.kind) {
      case StepKind::kSend:
      case StepKind::kBroadcast:
        for (int p : s.peers) message[{static_cast<int>(i), p}] = mine;
        break;
      case StepKind::kReceive: {
        if (match[i] >= static_cast<int>(i)) {
          return absl::FailedPreconditionError(
              absl::StrCat(what, ": its send, ", Describe(plan, match[i]), ", comes after it"));
        }
        auto it = message.find({match[i], s.node});
        if (it == message.end()) {
          return absl::InternalError(absl::StrCat(what, ": its message is missing"));
        }
        if (s.install) {
          mine = std::move(it->second);
          consumed[i] = 1;
        } else {
          inbox[i] = std::move(it->second);
        }
        message.erase(it);
        break;
      }
      case StepKind::kAggregate:
        for (int a : s.after) {
          const Step& r = plan.steps[a];
          if (r.kind != StepKind::kReceive || r.install) continue;
          if (consumed[a]) {
            return absl::FailedPreconditionError(
                absl::StrCat(what, ": aggregates ", Describe(plan, a), " a second time"));
          }
          consumed[a] = 1;
          std::string why;
          if (!ops.Add(mine, inbox[a], &why)) {
            return absl::FailedPreconditionError(
                absl::StrCat(what, ": adding the message of ", Describe(plan, a), " ", why));
          }
        }
        break;
      case StepKind::kOptimize: {
        std::string why;
        if (!ops.Optimize(mine, &why)) {
          return absl::FailedPreconditionError(absl::StrCat(what, ": ", why));
        }
        break;
      }
    }
  }
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].kind == StepKind::kReceive && !consumed[i]) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(plan, static_cast<int>(i)), ": received but never aggregated"));
    }
  }
  return absl::OkStatus();
}

struct SymbolOps {
  int nodes;
  bool Add(Symbol& dst, const Symbol& src, std::string* why) {
    if (dst.optimized || src.optimized) {
      *why = "mixes an optimized value into a sum";
      return false;
    }
    for (size_t w = 0; w < dst.bits.size(); ++w) {
      if (dst.bits[w] & src.bits[w]) {
        *why = "counts a contribution twice";
        return false;
      }
      dst.bits[w] |= src.bits[w];
    }
    return true;
  }
  bool Complete(const Symbol& s) const {
    int count = 0;
    for (uint64_t w : s.bits) count += __builtin_popcountll(w);
    return count == nodes;
  }
  bool Optimize(Symbol& s, std::string* why) {
    if (s.optimized) {
      *why = "optimizes a second time";
      return false;
    }
    if (!Complete(s)) {
      *why = "optimizes a partial sum";
      return false;
    }
    s.optimized = 1;
    return true;
  }
};

struct FloatOps {
  float scale;
  bool Add(std::vector<float>& dst, const std::vector<float>& src, std::string*) {
    for (size_t k = 0; k < dst.size(); ++k) dst[k] += src[k];
    return true;
  }
  bool Optimize(std::vector<float>& v, std::string*) {
    for (float& x : v) x *= scale;
    return true;
  }
};

// Weighted LPT: items (sizes) into bins (weights); each to the bin with the least
// (load + size) / weight, ties to the lowest bin. Returns the bin of every item.
std::vector<int> WeightedLpt(const std::vector<int64_t>& sizes, const std::vector<double>& weight,
                             std::vector<double>& load) {
  std::vector<int> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
  std::vector<int> bin(sizes.size(), 0);
  for (int item : order) {
    int best = -1;
    double best_t = 0;
    for (size_t b = 0; b < weight.size(); ++b) {
      const double t = (load[b] + sizes[item]) / weight[b];
      if (best < 0 || t < best_t * (1 - 1e-12)) {
        best_t = t;
        best = static_cast<int>(b);
      }
    }
    bin[item] = best;
    load[best] += sizes[item];
  }
  return bin;
}

absl::Status CheckGroups(const std::vector<std::vector<int>>& groups, int* nodes) {
  int n = 0;
  for (const auto& g : groups) {
    if (g.empty()) return absl::InvalidArgumentError("2lha: an empty group");
    n += static_cast<int>(g.size());
  }
  if (n == 0) return absl::InvalidArgumentError("2lha: no groups");
  std::vector<char> seen(n, 0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (int u : groups[gi]) {
      if (u < 0 || u >= n || seen[u]) {
        return absl::InvalidArgumentError(
            absl::StrCat("2lha: group ", gi, " holds node ", u,
                         ", but the groups must partition the nodes 0..", n - 1, " (each once)"));
      }
      seen[u] = 1;
    }
  }
  *nodes = n;
  return absl::OkStatus();
}

}  // namespace

std::string_view StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kSend:
      return "send";
    case StepKind::kReceive:
      return "receive";
    case StepKind::kAggregate:
      return "aggregate";
    case StepKind::kOptimize:
      return "optimize";
    case StepKind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

absl::StatusOr<Plan> BuildTwoLevelPlan(const std::vector<std::vector<int>>& groups,
                                       int64_t elements, const TwoLevelOptions& options) {
  int n = 0;
  if (absl::Status s = CheckGroups(groups, &n); !s.ok()) return s;
  if (elements < 1 || options.chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat("2lha: elements (", elements,
                                                   ") and chunk_elements (", options.chunk_elements,
                                                   ") must be >= 1"));
  }
  std::vector<double> weight = options.node_weight;
  if (weight.empty()) weight.assign(n, 1.0);
  if (static_cast<int>(weight.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("2lha: node_weight has ", weight.size(), " entries for ", n, " nodes"));
  }
  for (int u = 0; u < n; ++u) {
    if (!std::isfinite(weight[u]) || weight[u] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("2lha: node ", u, " has weight ", weight[u], " (must be > 0)"));
    }
  }
  std::vector<PlanChunk> chunks;
  std::vector<int64_t> sizes;
  for (int64_t off = 0; off < elements; off += options.chunk_elements) {
    chunks.push_back({off, std::min(options.chunk_elements, elements - off), -1, {}});
    sizes.push_back(chunks.back().elements);
  }
  const int k = static_cast<int>(groups.size());
  std::vector<double> group_weight(k, 0);
  for (int g = 0; g < k; ++g) {
    for (int u : groups[g]) group_weight[g] += weight[u];
  }
  std::vector<double> group_load(k, 0);
  const std::vector<int> gm_group = WeightedLpt(sizes, group_weight, group_load);
  for (auto& c : chunks) c.lm.assign(k, -1);
  for (int g = 0; g < k; ++g) {
    std::vector<double> w;
    for (int u : groups[g]) w.push_back(weight[u]);
    std::vector<double> load(groups[g].size(), 0);
    // The chunks this group is GM for first, so that the GM role is spread over its members.
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<int64_t> part_sizes;
      std::vector<int> part;
      for (size_t c = 0; c < chunks.size(); ++c) {
        if ((gm_group[c] == g) == (pass == 0)) {
          part.push_back(static_cast<int>(c));
          part_sizes.push_back(sizes[c]);
        }
      }
      const std::vector<int> bin = WeightedLpt(part_sizes, w, load);
      for (size_t j = 0; j < part.size(); ++j) chunks[part[j]].lm[g] = groups[g][bin[j]];
    }
  }
  for (size_t c = 0; c < chunks.size(); ++c) chunks[c].gm = chunks[c].lm[gm_group[c]];
  return BuildTwoLevelPlanFromMasters(groups, std::move(chunks));
}

absl::StatusOr<Plan> BuildTwoLevelPlanFromMasters(const std::vector<std::vector<int>>& groups,
                                                  std::vector<PlanChunk> chunks) {
  int n = 0;
  if (absl::Status s = CheckGroups(groups, &n); !s.ok()) return s;
  const int k = static_cast<int>(groups.size());
  std::vector<int> group_of(n);
  for (int g = 0; g < k; ++g) {
    for (int u : groups[g]) group_of[u] = g;
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (static_cast<int>(chunks[c].lm.size()) != k) {
      return absl::InvalidArgumentError(
          absl::StrCat("2lha: chunk ", c, " has ", chunks[c].lm.size(), " LMs for ", k, " groups"));
    }
    for (int g = 0; g < k; ++g) {
      const int lm = chunks[c].lm[g];
      if (lm < 0 || lm >= n || group_of[lm] != g) {
        return absl::InvalidArgumentError(
            absl::StrCat("2lha: chunk ", c, ": LM ", lm, " is not a member of group ", g));
      }
    }
    const int gm = chunks[c].gm;
    if (gm < 0 || gm >= n || chunks[c].lm[group_of[gm]] != gm) {
      return absl::InvalidArgumentError(
          absl::StrCat("2lha: chunk ", c, ": GM ", gm, " is not one of its LMs"));
    }
  }
  Plan plan;
  plan.nodes = n;
  plan.groups = groups;
  plan.chunks = std::move(chunks);
  auto& steps = plan.steps;
  auto add = [&](StepKind kind, int node, int chunk, std::vector<int> peers, std::vector<int> after,
                 bool install = false) {
    steps.push_back({kind, node, chunk, std::move(peers), std::move(after), install});
    return static_cast<int>(steps.size()) - 1;
  };
  const int nc = static_cast<int>(plan.chunks.size());
  // Phase by phase over all chunks, so that the step order is a topological order and every
  // node sends and receives its chunks in the same order.
  std::vector<std::vector<int>> local_sum(nc, std::vector<int>(k, -1));
  for (int c = 0; c < nc; ++c) {  // 1: members -> LM
    for (int g = 0; g < k; ++g) {
      for (int u : groups[g]) {
        if (u != plan.chunks[c].lm[g]) add(StepKind::kSend, u, c, {plan.chunks[c].lm[g]}, {});
      }
    }
  }
  for (int c = 0; c < nc; ++c) {
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      std::vector<int> received;
      for (int u : groups[g]) {
        if (u != lm) received.push_back(add(StepKind::kReceive, lm, c, {u}, {}));
      }
      if (!received.empty()) local_sum[c][g] = add(StepKind::kAggregate, lm, c, {}, received);
    }
  }
  auto only = [](int step) { return step < 0 ? std::vector<int>{} : std::vector<int>{step}; };
  std::vector<int> optimized(nc, -1);
  for (int c = 0; c < nc; ++c) {  // 2: LMs -> GM
    const int gm = plan.chunks[c].gm;
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      if (lm != gm) add(StepKind::kSend, lm, c, {gm}, only(local_sum[c][g]));
    }
  }
  for (int c = 0; c < nc; ++c) {
    const int gm = plan.chunks[c].gm;
    std::vector<int> after = only(local_sum[c][group_of[gm]]);
    bool any = false;
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      if (lm != gm) {
        after.push_back(add(StepKind::kReceive, gm, c, {lm}, {}));
        any = true;
      }
    }
    int sum = any ? add(StepKind::kAggregate, gm, c, {}, after) : local_sum[c][group_of[gm]];
    optimized[c] = add(StepKind::kOptimize, gm, c, {}, only(sum));
  }
  std::vector<std::vector<int>> result_at(nc, std::vector<int>(k, -1));
  for (int c = 0; c < nc; ++c) {  // 3: GM -> LMs
    const int gm = plan.chunks[c].gm;
    std::vector<int> lms;
    for (int g = 0; g < k; ++g) {
      if (plan.chunks[c].lm[g] != gm) lms.push_back(plan.chunks[c].lm[g]);
    }
    if (!lms.empty()) add(StepKind::kBroadcast, gm, c, lms, {optimized[c]});
    result_at[c][group_of[gm]] = optimized[c];
  }
  for (int c = 0; c < nc; ++c) {
    const int gm = plan.chunks[c].gm;
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      if (lm != gm) result_at[c][g] = add(StepKind::kReceive, lm, c, {gm}, {}, true);
    }
  }
  for (int c = 0; c < nc; ++c) {  // 4: LMs -> members
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      std::vector<int> members;
      for (int u : groups[g]) {
        if (u != lm) members.push_back(u);
      }
      if (!members.empty()) add(StepKind::kBroadcast, lm, c, members, {result_at[c][g]});
    }
  }
  for (int c = 0; c < nc; ++c) {
    for (int g = 0; g < k; ++g) {
      const int lm = plan.chunks[c].lm[g];
      for (int u : groups[g]) {
        if (u != lm) add(StepKind::kReceive, u, c, {lm}, {}, true);
      }
    }
  }
  return plan;
}

absl::Status VerifyPlan(const Plan& plan) {
  if (absl::Status s = CheckShape(plan); !s.ok()) return s;
  absl::StatusOr<std::vector<int>> match = MatchReceives(plan);
  if (!match.ok()) return match.status();
  const size_t words = (plan.nodes + 63) / 64;
  std::vector<std::vector<Symbol>> value(plan.nodes, std::vector<Symbol>(plan.chunks.size()));
  for (int u = 0; u < plan.nodes; ++u) {
    for (auto& v : value[u]) {
      v.bits.assign(words, 0);
      v.bits[u / 64] |= uint64_t{1} << (u % 64);
    }
  }
  SymbolOps ops{plan.nodes};
  if (absl::Status s = Run(plan, *match, value, ops); !s.ok()) return s;
  for (int u = 0; u < plan.nodes; ++u) {
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      if (!ops.Complete(value[u][c])) {
        return absl::FailedPreconditionError(
            absl::StrCat("plan: node ", u, " ends chunk ", c, " without every contribution"));
      }
      if (value[u][c].optimized != 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("plan: node ", u, " ends chunk ", c, " not optimized"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> EvaluatePlan(
    const Plan& plan, const std::vector<std::vector<float>>& inputs, float scale) {
  if (absl::Status s = VerifyPlan(plan); !s.ok()) return s;
  const int64_t total =
      plan.chunks.empty() ? 0 : plan.chunks.back().offset + plan.chunks.back().elements;
  if (static_cast<int>(inputs.size()) != plan.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluate: ", inputs.size(), " inputs for ", plan.nodes, " nodes"));
  }
  std::vector<std::vector<std::vector<float>>> value(plan.nodes);
  for (int u = 0; u < plan.nodes; ++u) {
    if (static_cast<int64_t>(inputs[u].size()) != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluate: node ", u, " has ", inputs[u].size(), " values, the plan ", total));
    }
    for (const PlanChunk& c : plan.chunks) {
      value[u].emplace_back(inputs[u].begin() + c.offset,
                            inputs[u].begin() + c.offset + c.elements);
    }
  }
  absl::StatusOr<std::vector<int>> match = MatchReceives(plan);
  FloatOps ops{scale};
  if (absl::Status s = Run(plan, *match, value, ops); !s.ok()) return s;
  std::vector<std::vector<float>> out(plan.nodes);
  for (int u = 0; u < plan.nodes; ++u) {
    for (auto& v : value[u]) out[u].insert(out[u].end(), v.begin(), v.end());
  }
  return out;
}

std::vector<int> CommunicationRounds(const Plan& plan) {
  absl::StatusOr<std::vector<int>> match = MatchReceives(plan);
  std::vector<int> level(plan.steps.size(), 0);
  std::vector<int> rounds(plan.steps.size(), 0);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    int before = 0;
    for (int a : s.after) before = std::max(before, level[a]);
    if (s.kind == StepKind::kSend || s.kind == StepKind::kBroadcast) {
      level[i] = rounds[i] = before + 1;
    } else if (s.kind == StepKind::kReceive) {
      level[i] = rounds[i] = match.ok() && (*match)[i] >= 0 ? level[(*match)[i]] : 0;
    } else {
      level[i] = before;
    }
  }
  return rounds;
}

absl::StatusOr<netmodel::sim::Schedule> PlanToSchedule(const Plan& plan, std::span<const int> hosts,
                                                       double element_bytes,
                                                       bool fifo_connections) {
  if (absl::Status s = VerifyPlan(plan); !s.ok()) return s;
  if (static_cast<int>(hosts.size()) != plan.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan schedule: ", hosts.size(), " hosts for ", plan.nodes, " nodes"));
  }
  absl::StatusOr<std::vector<int>> match = MatchReceives(plan);
  netmodel::sim::Schedule schedule{"2-level hierarchical", {}};
  std::vector<std::vector<int>> needs(plan.steps.size());  // transfers done before the step
  std::map<std::pair<int, int>, int> transfer_of;          // (send step, peer) -> transfer
  std::map<std::pair<int, int>, int> last_on;  // (node, peer) -> 1 + its latest transfer
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    std::vector<int> deps;
    for (int a : s.after) deps.insert(deps.end(), needs[a].begin(), needs[a].end());
    if (s.kind == StepKind::kReceive) deps.push_back(transfer_of.at({(*match)[i], s.node}));
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    if (s.kind == StepKind::kSend || s.kind == StepKind::kBroadcast) {
      for (int p : s.peers) {
        std::vector<int> after = deps;
        int& previous = last_on[{s.node, p}];
        if (fifo_connections && previous > 0) after.push_back(previous - 1);
        schedule.transfers.push_back(
            {hosts[s.node], hosts[p], plan.chunks[s.chunk].elements * element_bytes, after});
        previous = static_cast<int>(schedule.transfers.size());
        transfer_of[{static_cast<int>(i), p}] = static_cast<int>(schedule.transfers.size()) - 1;
      }
    }
    needs[i] = std::move(deps);
  }
  return schedule;
}

}  // namespace plexus::aggregation
