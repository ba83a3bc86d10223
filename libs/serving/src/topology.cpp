// The static view of a plan (topology.hpp) and the runtime's own checks.
#include "topology.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/status.hpp"

namespace plexus::serving::internal {

using placement::OperatorKind;
using placement::Position;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr double kMaxRatio = 1024;
// Counts are floors of id * ratio: a ratio given as 3 or 0.3 in JSON must count as exactly that.
constexpr double kRatioSlack = 1e-9;
// Parts are numbers in mixed radix: the product of the radices along a chain must fit.
constexpr uint64_t kMaxPartsPerRequest = uint64_t{1} << 32;

}  // namespace

uint64_t Topology::Count(int edge, uint64_t id) const {
  const double r = ratio[edge];
  if (r == 1) return 1;
  const auto at = [r](uint64_t i) {
    return static_cast<uint64_t>(std::floor(static_cast<double>(i) * r + kRatioSlack));
  };
  return at(id + 1) - at(id);
}

uint64_t Topology::Parts(int op, size_t mask_index, uint64_t id) const {
  uint64_t parts = 1;
  for (int e : chains[op][mask_index]) parts *= Count(e, id);
  return parts;
}

std::vector<uint64_t> Topology::Descendants(int op, size_t mask_index, size_t crossed, uint64_t id,
                                            uint64_t part) const {
  std::vector<uint64_t> out = {part};
  const std::vector<int>& chain = chains[op][mask_index];
  for (size_t c = crossed; c < chain.size(); ++c) {
    const uint64_t count = Count(chain[c], id);
    std::vector<uint64_t> next;
    next.reserve(out.size() * count);
    for (uint64_t p : out) {
      for (uint64_t k = 0; k < count; ++k) next.push_back(p * radix[chain[c]] + k);
    }
    out = std::move(next);
  }
  return out;
}

int Topology::MaskIndex(int op, uint64_t mask) const {
  const auto at = std::find(masks[op].begin(), masks[op].end(), mask);
  return at == masks[op].end() ? -1 : static_cast<int>(at - masks[op].begin());
}

Position Topology::From(int edge, int from_worker) const {
  if (from_worker >= 0) return placement::WorkerPosition(problem, from_worker);
  return placement::SourcePosition(problem, problem.edges[edge].from);
}

double Topology::LinkDelayS(Position a, Position b, size_t bytes) const {
  const placement::Link* link = placement::LinkBetween(problem, a, b);
  if (link == nullptr) return 0;
  double delay = link->latency_ms / 1000.0;
  if (link->bandwidth_gbps > 0)
    delay += static_cast<double>(bytes) * 8 / (link->bandwidth_gbps * 1e9);
  return delay;
}

namespace {

std::string EdgeName(const placement::Problem& p, int e) {
  return absl::StrFormat("workflow.edges[%d] (%s -> %s)", e, p.operators[p.edges[e].from].name,
                         p.operators[p.edges[e].to].name);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Topology>> BuildTopology(const placement::Problem& problem,
                                                              const placement::Plan& plan,
                                                              const ServeOptions& options) {
  auto t = std::make_shared<Topology>();
  t->problem = problem;
  t->plan = plan;
  PLEXUS_RETURN_IF_ERROR(placement::EvaluatePlan(t->problem, t->plan));
  const placement::Problem& p = t->problem;
  const size_t n = p.operators.size();
  t->ratio.assign(p.edges.size(), 1);
  t->radix.assign(p.edges.size(), 1);
  for (size_t e = 0; e < p.edges.size(); ++e) {
    const double r = p.edges[e].rate_ratio;
    if (r == 1) continue;
    if (!(r > 0) || r > kMaxRatio) {
      return absl::UnimplementedError(absl::StrCat(EdgeName(p, static_cast<int>(e)),
                                                   ": rate_ratio ", r,
                                                   " is not served (the runtime serves ratios in "
                                                   "(0, ",
                                                   kMaxRatio, "])"));
    }
    t->ratio[e] = r;
    t->radix[e] = static_cast<uint64_t>(std::ceil(r - kRatioSlack));
  }
  for (const auto& [name, fn] : options.operators) {
    const int op = p.FindOperator(name);
    if (op < 0 || p.operators[op].kind == OperatorKind::kSource) {
      return absl::InvalidArgumentError(absl::StrCat("ServeOptions::operators: '", name,
                                                     "' is not a (non-source) operator of '",
                                                     p.name, "'"));
    }
    if (!fn)
      return absl::InvalidArgumentError(
          absl::StrCat("ServeOptions::operators: '", name, "' has an empty function"));
  }
  t->source_index.assign(n, -1);
  for (size_t op = 0; op < n; ++op) {
    if (p.operators[op].kind != OperatorKind::kSource) continue;
    if (t->sources.size() == 64) {
      return absl::UnimplementedError(
          absl::StrCat("workflow.operators[", op, "] (", p.operators[op].name,
                       "): the serving runtime serves at most 64 "
                       "sources (a request's sources are a 64-bit mask)"));
    }
    t->source_index[op] = static_cast<int>(t->sources.size());
    t->sources.push_back(static_cast<int>(op));
  }
  t->join.assign(n, false);
  t->sink.assign(n, false);
  t->masks.assign(n, {});
  t->chains.assign(n, {});
  for (int op : p.topological_order) {
    const auto& o = p.operators[op];
    t->join[op] = o.combine == placement::Combine::kJoin && p.in_edges[op].size() > 1;
    t->sink[op] = o.kind != OperatorKind::kSource && p.out_edges[op].empty();
    if (o.kind == OperatorKind::kSource) {
      t->masks[op] = {uint64_t{1} << t->source_index[op]};
      t->chains[op] = {{}};
      continue;
    }
    if (t->join[op]) {
      uint64_t mask = 0;
      for (int e : p.in_edges[op]) {
        const int from = p.edges[e].from;
        const auto& parent = t->masks[from];
        if (parent.size() != 1) {
          return absl::UnimplementedError(
              absl::StrCat(EdgeName(p, e), ": the join '", o.name,
                           "' takes an input that is a union of requests from different sources; "
                           "the serving runtime joins inputs of one request id only"));
        }
        if (t->ratio[e] != 1 || !t->chains[from][0].empty()) {
          return absl::UnimplementedError(absl::StrCat(
              EdgeName(p, e), ": the join '", o.name,
              "' takes an input with several messages per request (an edge with rate_ratio != 1 "
              "on the way); the serving runtime joins one message per request and input"));
        }
        mask |= parent[0];
      }
      t->masks[op] = {mask};
      t->chains[op] = {{}};
      continue;
    }
    for (int e : p.in_edges[op]) {
      const int from = p.edges[e].from;
      for (size_t i = 0; i < t->masks[from].size(); ++i) {
        const uint64_t m = t->masks[from][i];
        std::vector<int> chain = t->chains[from][i];
        if (t->ratio[e] != 1) chain.push_back(static_cast<int>(e));
        uint64_t parts = 1;
        for (int c : chain) {
          parts *= t->radix[c];
          if (parts > kMaxPartsPerRequest) {
            return absl::UnimplementedError(absl::StrCat(
                EdgeName(p, e), ": a request would become more than ", kMaxPartsPerRequest,
                " messages at '", o.name, "' (the product of the rate_ratios on its way)"));
          }
        }
        t->max_parts = std::max(t->max_parts, parts);
        const auto at = std::find(t->masks[op].begin(), t->masks[op].end(), m);
        if (at == t->masks[op].end()) {
          t->masks[op].push_back(m);
          t->chains[op].push_back(std::move(chain));
        } else if (t->chains[op][at - t->masks[op].begin()] != chain) {
          return absl::UnimplementedError(absl::StrCat(
              EdgeName(p, e), ": '", o.name,
              "' receives one source's requests along two paths with different rate_ratios; "
              "the serving runtime cannot tell their messages apart"));
        }
      }
    }
  }
  t->reaches.assign(n, std::vector<bool>(n, false));
  for (auto it = p.topological_order.rbegin(); it != p.topological_order.rend(); ++it) {
    const int op = *it;
    t->reaches[op][op] = true;
    for (int e : p.out_edges[op]) {
      for (size_t b = 0; b < n; ++b) {
        if (t->reaches[p.edges[e].to][b]) t->reaches[op][b] = true;
      }
    }
  }
  t->op_workers.assign(n, {});
  t->op_shares.assign(n, {});
  t->op_costs.assign(n, {});
  t->worker_ops.assign(p.workers.size(), {});
  t->servers.assign(p.workers.size(), 1);
  t->fit.assign(n, std::vector<placement::ServiceTime>(p.workers.size()));
  for (size_t w = 0; w < p.workers.size(); ++w) {
    const placement::Tier& tier = p.tiers[p.workers[w].tier];
    t->servers[w] = tier.replicated ? tier.locations : 1;
  }
  for (size_t op = 0; op < n; ++op) {
    for (const placement::WorkerShare& ws : t->plan.workers[op]) {
      if (ws.share <= 0) continue;
      t->op_workers[op].push_back(ws.worker);
      t->op_shares[op].push_back(ws.share);
      t->worker_ops[ws.worker].push_back(static_cast<int>(op));
      const auto& profile = p.latency[op][t->plan.variant[op]][p.workers[ws.worker].type];
      const placement::ServiceTime fit = placement::ServiceTime::Fit(*profile);
      t->fit[op][ws.worker] = fit;
      // The log-normal's mean, shared by the worker's servers; positive for any fit.
      t->op_costs[op].push_back(
          std::max(1e-12, std::exp(fit.mu + fit.sigma * fit.sigma / 2) / t->servers[ws.worker]));
    }
    if (p.operators[op].kind != OperatorKind::kSource && t->op_workers[op].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: operator '", p.operators[op].name,
                                                     "' has no worker with a positive share"));
    }
  }
  for (size_t op = 0; op < n; ++op) t->by_id.emplace_back(t->op_shares[op]);
  t->edge_payload.resize(p.edges.size());
  for (size_t e = 0; e < p.edges.size(); ++e) {
    const auto& edge = p.edges[e];
    const double bytes = placement::BytesPerKb(p) * placement::MessageKb(p, static_cast<int>(e),
                                                                         t->plan.variant[edge.from],
                                                                         t->plan.variant[edge.to]);
    std::string& payload = t->edge_payload[e];
    payload.resize(static_cast<size_t>(std::llround(std::max(0.0, bytes))));
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i & 0xff);
  }
  for (size_t i = 0; i < options.failures.size(); ++i) {
    const WorkerFailure& f = options.failures[i];
    const int w = p.FindWorker(f.worker);
    if (w < 0 || !t->Serves(w)) {
      return absl::InvalidArgumentError(absl::StrCat("ServeOptions::failures[", i, "]: '", f.worker,
                                                     "' is not a worker that serves in the plan"));
    }
    if (!(f.at_s >= 0) || !(f.at_s < options.duration_s)) {
      return absl::InvalidArgumentError(absl::StrCat("ServeOptions::failures[", i, "] ('", f.worker,
                                                     "'): at_s ", f.at_s,
                                                     " is not within [0, duration_s)"));
    }
  }
  return std::shared_ptr<const Topology>(std::move(t));
}

}  // namespace plexus::serving::internal
