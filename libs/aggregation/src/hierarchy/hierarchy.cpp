#include "plexus/aggregation/hierarchy.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/aggregation/plan.hpp"
#include "plexus/netmodel/flow_schedules.hpp"

namespace plexus::aggregation {
namespace {

namespace sim = netmodel::sim;

bool Positive(double v) { return std::isfinite(v) && v > 0; }

absl::Status CheckLayout(const PboxLayout& layout, double bytes) {
  if (layout.workers.empty() || layout.workers.size() != layout.pbox.size()) {
    return absl::InvalidArgumentError(absl::StrCat("pbox layout: ", layout.workers.size(),
                                                   " racks of workers and ", layout.pbox.size(),
                                                   " boxes (need one box per rack, >= 1 rack)"));
  }
  for (size_t r = 0; r < layout.workers.size(); ++r) {
    if (layout.workers[r].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("pbox layout: rack ", r, " has no workers"));
    }
  }
  if (!std::isfinite(bytes) || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pbox: buffer bytes ", bytes, " must be >= 0"));
  }
  return absl::OkStatus();
}

Table41Row Row(std::string name, std::string rounds, std::string bytes, std::string cross,
               double seed_rounds, double seed_bytes, double seed_cross) {
  Table41Row row;
  row.name = std::move(name);
  row.rounds_formula = std::move(rounds);
  row.bytes_formula = std::move(bytes);
  row.cross_rack_formula = std::move(cross);
  row.seed_rounds = seed_rounds;
  row.seed_bytes = seed_bytes;
  row.seed_cross_rack_bytes = seed_cross;
  return row;
}

int Add(sim::Schedule& s, int src, int dst, double bytes, std::vector<int> after) {
  s.transfers.push_back({src, dst, bytes, std::move(after)});
  return static_cast<int>(s.transfers.size()) - 1;
}

}  // namespace

absl::StatusOr<HierarchyChoice> ChooseHierarchy(const HierarchyModel& m) {
  if (m.workers_per_rack < 1 || m.racks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("hierarchy: workers_per_rack (",
                                                   m.workers_per_rack, ") and racks (", m.racks,
                                                   ") must be >= 1"));
  }
  if (!Positive(m.pbox_bytes_per_s) || !Positive(m.core_bytes_per_s) ||
      !Positive(m.worker_bytes_per_s)) {
    return absl::InvalidArgumentError(
        "hierarchy: pbox, core and worker bandwidths must be finite and > 0");
  }
  const double n = m.workers_per_rack;
  const double r = m.racks;
  HierarchyChoice c;
  c.flat_s_per_byte = n * (r - 1) / (r * m.core_bytes_per_s);
  c.local_s_per_byte = std::max(n / m.pbox_bytes_per_s, 1 / m.worker_bytes_per_s);
  const double bottleneck = std::min(m.pbox_bytes_per_s, m.core_bytes_per_s);
  c.cross_s_per_byte = (r - 1) / (r * bottleneck);
  const double hier = c.local_s_per_byte + c.cross_s_per_byte;
  c.use_hierarchy = c.flat_s_per_byte > hier;
  c.explanation = absl::StrFormat(
      "N(R-1)/(R B_Core) = %.4g s/GB %s max(N/B_PBox, 1/B_Wkr) + C = %.4g + %.4g = %.4g s/GB "
      "(C by %s): %s",
      c.flat_s_per_byte * 1e9, c.use_hierarchy ? ">" : "<=", c.local_s_per_byte * 1e9,
      c.cross_s_per_byte * 1e9, hier * 1e9,
      m.cross == CrossRack::kShardedPs ? "sharded PS" : "ring of racks",
      c.use_hierarchy ? "the hierarchy pays" : "flat sharding is as fast");
  return c;
}

PboxLayout RackPboxLayout(int racks, int workers_per_rack) {
  PboxLayout layout;
  for (int r = 0; r < racks; ++r) {
    std::vector<int> w;
    for (int i = 0; i < workers_per_rack; ++i) w.push_back(r * (workers_per_rack + 1) + i);
    layout.workers.push_back(std::move(w));
    layout.pbox.push_back(r * (workers_per_rack + 1) + workers_per_rack);
  }
  return layout;
}

absl::StatusOr<sim::Schedule> PboxFlatSchedule(const PboxLayout& layout, double bytes) {
  if (absl::Status s = CheckLayout(layout, bytes); !s.ok()) return s;
  const int racks = static_cast<int>(layout.pbox.size());
  sim::Schedule s{"pbox sharded (flat)", {}};
  std::vector<std::vector<int>> into(racks);
  for (const auto& rack : layout.workers) {
    for (int w : rack) {
      for (int b = 0; b < racks; ++b)
        into[b].push_back(Add(s, w, layout.pbox[b], bytes / racks, {}));
    }
  }
  for (int b = 0; b < racks; ++b) {
    for (const auto& rack : layout.workers) {
      for (int w : rack) Add(s, layout.pbox[b], w, bytes / racks, into[b]);
    }
  }
  return s;
}

absl::StatusOr<sim::Schedule> PboxHierarchicalSchedule(const PboxLayout& layout, double bytes,
                                                       CrossRack cross) {
  if (absl::Status s = CheckLayout(layout, bytes); !s.ok()) return s;
  const int racks = static_cast<int>(layout.pbox.size());
  sim::Schedule s{cross == CrossRack::kShardedPs ? "pbox hierarchical (sharded across racks)"
                                                 : "pbox hierarchical (ring across racks)",
                  {}};
  std::vector<std::vector<int>> local(racks);
  for (int r = 0; r < racks; ++r) {
    for (int w : layout.workers[r]) local[r].push_back(Add(s, w, layout.pbox[r], bytes, {}));
  }
  // ready[r]: the transfers after which box r holds the global sum.
  std::vector<std::vector<int>> ready(racks);
  if (racks == 1) {
    ready[0] = local[0];
  } else if (cross == CrossRack::kShardedPs) {
    std::vector<std::vector<int>> into(racks);
    for (int a = 0; a < racks; ++a) {
      for (int b = 0; b < racks; ++b) {
        if (a != b)
          into[b].push_back(Add(s, layout.pbox[a], layout.pbox[b], bytes / racks, local[a]));
      }
    }
    std::vector<std::vector<int>> back(racks);
    for (int b = 0; b < racks; ++b) {
      std::vector<int> after = into[b];
      after.insert(after.end(), local[b].begin(), local[b].end());
      for (int a = 0; a < racks; ++a) {
        if (a != b) back[a].push_back(Add(s, layout.pbox[b], layout.pbox[a], bytes / racks, after));
      }
    }
    for (int a = 0; a < racks; ++a) {
      ready[a] = back[a];
      ready[a].insert(ready[a].end(), into[a].begin(), into[a].end());
    }
  } else {
    // Ring allreduce among the boxes (S/R per step): a box sends once its rack's sum is in and
    // the previous step's piece has arrived; it holds the result once every piece has.
    std::vector<int> into(racks, -1);
    for (int r = 0; r < racks; ++r) ready[r] = local[r];
    for (int step = 0; step < 2 * (racks - 1); ++step) {
      std::vector<int> now(racks, -1);
      for (int r = 0; r < racks; ++r) {
        std::vector<int> after = local[r];
        if (into[r] >= 0) after.push_back(into[r]);
        const int next = (r + 1) % racks;
        now[next] = Add(s, layout.pbox[r], layout.pbox[next], bytes / racks, std::move(after));
        ready[next].push_back(now[next]);
      }
      into = std::move(now);
    }
  }
  for (int r = 0; r < racks; ++r) {
    for (int w : layout.workers[r]) Add(s, layout.pbox[r], w, bytes, ready[r]);
  }
  return s;
}

absl::StatusOr<std::vector<Table41Row>> ReproduceTable41(int n, int c, double s) {
  if (n < 1 || c < 2 || !Positive(s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table 4.1: needs N >= 1 nodes per rack, C >= 2 racks and S > 0 bytes (got N=", n,
        ", C=", c, ", S=", s, ")"));
  }
  const int p = n * c;
  std::vector<int> hosts(p);
  std::iota(hosts.begin(), hosts.end(), 0);
  std::vector<int> rack_of(p);
  for (int h = 0; h < p; ++h) rack_of[h] = h / n;
  const double N = n, C = c;
  std::vector<Table41Row> rows;
  auto measure = [&](Table41Row row, const absl::StatusOr<sim::Schedule>& schedule) {
    if (schedule.ok()) {
      row.measured = sim::Count(*schedule, rack_of);
    } else {
      row.available = false;
      row.note = std::string(schedule.status().message());
    }
    rows.push_back(std::move(row));
  };
  {
    Table41Row row = Row("PS (fully sharded)", "2", "2(NC-1)S", "2N(C-1)S", 2, 2 * (N * C - 1) * s,
                         2 * N * (C - 1) * s);
    measure(std::move(row), sim::ShardedPsSchedule(hosts, s));
  }
  {
    Table41Row row = Row("Halving doubling", "2 log2 NC", "2NCS", "2C(N-1)/N S",
                         2 * std::log2(N * C), 2 * N * C * s, 2 * C * (N - 1) / N * s);
    row.note =
        "wire bytes are 2(NC-1)S: each rank sends S/2 + S/4 + ... + S/NC per phase, the seed "
        "rounds that up to S; cross-rack bytes, neighbours first, are 2(C-1)S, which equals the "
        "seed's 2C(N-1)/N S only when N = C";
    measure(std::move(row), sim::HalvingDoublingSchedule(hosts, s));
  }
  {
    Table41Row row = Row("Ring-Chunked", "2NC-1", "(2NC-1)S", "(2C-1)S", 2 * N * C - 1,
                         (2 * N * C - 1) * s, (2 * C - 1) * s);
    measure(std::move(row), sim::RingChunkedSchedule(hosts, s));
  }
  {
    const double depth = std::log(N) / std::log(C) + 1;
    Table41Row row =
        Row("Tree (fan out = C)", "2(log_C N + 1)", "~2C(CN-1)/(C-1) S", "~2C(N-1)/(C-1) S",
            2 * depth, 2 * C * (C * N - 1) / (C - 1) * s, 2 * C * (N - 1) / (C - 1) * s);
    row.note =
        "the seed's bytes count every tree edge, a parent's edge to itself included (logical "
        "bytes here); the wire carries 2(NC-1)S. With racks as subtrees only the top level "
        "crosses racks: 2(C-1)S";
    measure(std::move(row), sim::TreeSchedule(hosts, s, c));
  }
  {
    Table41Row row = Row("2-level hierarchical", "4", "2S(NC-1)", "2(C-1)S", 4, 2 * s * (N * C - 1),
                         2 * (C - 1) * s);
    std::vector<std::vector<int>> groups(c);
    for (int h = 0; h < p; ++h) groups[h / n].push_back(h);
    // N chunks of one element each, one element standing for S/N bytes.
    absl::StatusOr<Plan> plan = BuildTwoLevelPlan(groups, n, {.chunk_elements = 1});
    if (!plan.ok()) return plan.status();
    measure(std::move(row), PlanToSchedule(*plan, hosts, s / n, /*fifo_connections=*/false));
  }
  return rows;
}

std::string FormatTable41(const std::vector<Table41Row>& rows, int n, int c, double s) {
  std::string out = absl::StrFormat(
      "Table 4.1: allreduce of S = %.4g bytes per node, NC = %d nodes on C = %d racks of N = "
      "%d (bytes in units of S; 'seed' = the dissertation's formula, 'sim' = counted)\n\n",
      s, n * c, c, n);
  absl::StrAppendFormat(&out, "%-22s %-16s %6s %6s  %-20s %8s %8s  %-18s %8s %8s\n", "algorithm",
                        "rounds", "seed", "sim", "bytes on wire", "seed", "sim", "min XR bytes",
                        "seed", "sim");
  for (const auto& r : rows) {
    if (!r.available) {
      absl::StrAppendFormat(&out, "%-22s (not run: %s)\n", r.name, r.note);
      continue;
    }
    std::string wire = absl::StrFormat("%8.3f", r.measured.wire_bytes / s);
    if (r.measured.logical_bytes != r.measured.wire_bytes) {
      wire = absl::StrFormat("%.3f (%.3f logical)", r.measured.wire_bytes / s,
                             r.measured.logical_bytes / s);
    }
    absl::StrAppendFormat(&out, "%-22s %-16s %6.2f %6d  %-20s %8.3f %s  %-18s %8.3f %8.3f\n",
                          r.name, r.rounds_formula, r.seed_rounds, r.measured.rounds,
                          r.bytes_formula, r.seed_bytes / s, wire, r.cross_rack_formula,
                          r.seed_cross_rack_bytes / s, r.measured.cross_rack_bytes / s);
  }
  absl::StrAppend(&out, "\nNotes:\n");
  for (const auto& r : rows) {
    if (r.available && !r.note.empty()) absl::StrAppend(&out, "- ", r.name, ": ", r.note, "\n");
  }
  return out;
}

}  // namespace plexus::aggregation
