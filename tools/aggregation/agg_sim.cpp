// plexus-agg-sim: Table 4.1 (rounds, bytes on the wire, cross-rack bytes) counted on the flow
// simulator next to the dissertation's formulas; PBox's hierarchy inequality; PLink's two-level
// plan against ring and halving-doubling on simulated cloud topologies.
#include <cstdio>
#include <iostream>
#include <string>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

#include "plexus/aggregation/hierarchy.hpp"
#include "plexus/aggregation/plan.hpp"
#include "plexus/aggregation/plink.hpp"
#include "plexus/netmodel/flow_schedules.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace {

namespace agg = plexus::aggregation;
using nlohmann::json;

constexpr char kDescription[] =
    "Allreduce algorithms on a flow-level simulator with max-min fair sharing: the PLink "
    "dissertation's Table 4.1, PBox's hierarchical-reduction inequality, and PLink's two-level "
    "plan against ring and halving-doubling on simulated cloud fabrics.";

struct TableArgs {
  int per_rack = 4;
  int racks = 2;
  double bytes = 100e6;
  bool json = false;
};

int RunTable(const plexus::tooling::Tool& tool, const TableArgs& a) {
  auto rows = agg::ReproduceTable41(a.per_rack, a.racks, a.bytes);
  if (!rows.ok()) return tool.Fail(rows.status());
  if (a.json) {
    json out = json::array();
    for (const auto& r : *rows) {
      out.push_back({{"name", r.name},
                     {"available", r.available},
                     {"rounds",
                      {{"seed_formula", r.rounds_formula},
                       {"seed", r.seed_rounds},
                       {"measured", r.measured.rounds}}},
                     {"wire_bytes",
                      {{"seed_formula", r.bytes_formula},
                       {"seed", r.seed_bytes},
                       {"measured", r.measured.wire_bytes},
                       {"measured_logical", r.measured.logical_bytes}}},
                     {"cross_rack_bytes",
                      {{"seed_formula", r.cross_rack_formula},
                       {"seed", r.seed_cross_rack_bytes},
                       {"measured", r.measured.cross_rack_bytes}}},
                     {"note", r.note}});
    }
    std::cout << json{{"N", a.per_rack}, {"C", a.racks}, {"S", a.bytes}, {"rows", out}}.dump()
              << "\n";
    return plexus::tooling::kExitOk;
  }
  std::fputs(agg::FormatTable41(*rows, a.per_rack, a.racks, a.bytes).c_str(), stdout);
  return plexus::tooling::kExitOk;
}

struct HierarchyArgs {
  agg::HierarchyModel model{.workers_per_rack = 8,
                            .racks = 4,
                            .pbox_bytes_per_s = 70e9,
                            .core_bytes_per_s = 10e9,
                            .worker_bytes_per_s = 7e9};
  bool ring = false;
  bool json = false;
};

int RunHierarchy(const plexus::tooling::Tool& tool, HierarchyArgs a) {
  a.model.cross = a.ring ? agg::CrossRack::kRing : agg::CrossRack::kShardedPs;
  auto c = agg::ChooseHierarchy(a.model);
  if (!c.ok()) return tool.Fail(c.status());
  if (a.json) {
    std::cout << json{{"flat_s_per_byte", c->flat_s_per_byte},
                      {"local_s_per_byte", c->local_s_per_byte},
                      {"cross_s_per_byte", c->cross_s_per_byte},
                      {"use_hierarchy", c->use_hierarchy},
                      {"explanation", c->explanation}}
                     .dump()
              << "\n";
  } else {
    std::printf("%s\n", c->explanation.c_str());
  }
  return plexus::tooling::kExitOk;
}

struct CompareArgs {
  int racks = 8;
  int per_rack = 8;
  double oversubscription = 4;
  double bytes = 64e6;
  double host_gbit = 10;
  double noise = 0.2;
  int trials = 3;
  int chunks = 0;  // 0: one per node
  uint64_t seed = 1;
  bool node_offset = false;
  bool json = false;
};

// One simulated cloud: racks with oversubscribed uplinks, a random extra latency per host (a
// noisy neighbour), VMs handed out in random order, latency probes with relative noise.
int RunCompare(const plexus::tooling::Tool& tool, const CompareArgs& a) {
  namespace sim = plexus::netmodel::sim;
  const int p = a.racks * a.per_rack;
  const double elements = std::floor(a.bytes / 4);
  const int chunks = a.chunks > 0 ? a.chunks : p;
  std::map<std::string, std::vector<double>> ms;
  std::vector<std::string> order;
  std::mt19937_64 rng(a.seed);
  for (int trial = 0; trial < a.trials; ++trial) {
    auto topo = sim::Network::Racks({.racks = a.racks,
                                     .hosts_per_rack = a.per_rack,
                                     .host_bytes_per_s = a.host_gbit * 1e9 / 8,
                                     .oversubscription = a.oversubscription,
                                     .host_latency_s = 5e-6,
                                     .core_latency_s = 25e-6});
    if (!topo.ok()) return tool.Fail(topo.status());
    std::uniform_real_distribution<double> extra(0, 20e-6);
    for (int h = 0; h < p; ++h) (void)topo->AddHostLatency(h, extra(rng));
    std::vector<int> vm(p);
    std::iota(vm.begin(), vm.end(), 0);
    std::shuffle(vm.begin(), vm.end(), rng);
    std::uniform_real_distribution<double> jitter(-a.noise, a.noise);
    agg::Matrix latency(p, std::vector<double>(p, 0));
    for (int i = 0; i < p; ++i) {
      for (int j = 0; j < i; ++j) {
        latency[i][j] = latency[j][i] = topo->PathLatency(vm[i], vm[j]) * (1 + jitter(rng));
      }
    }
    std::vector<std::pair<std::string, absl::StatusOr<sim::Schedule>>> runs;
    runs.emplace_back("ring (VM order)", sim::RingSchedule(vm, a.bytes));
    if ((p & (p - 1)) == 0) {
      runs.emplace_back("halving-doubling (VM order)", sim::HalvingDoublingSchedule(vm, a.bytes));
    }
    auto two_level = [&](const std::vector<std::vector<int>>& groups) {
      auto plan = agg::BuildTwoLevelPlan(
          groups, static_cast<int64_t>(elements),
          {.chunk_elements = static_cast<int64_t>(std::ceil(elements / chunks))});
      if (!plan.ok()) return absl::StatusOr<sim::Schedule>(plan.status());
      return agg::PlanToSchedule(*plan, vm, 4);
    };
    auto groups = agg::GroupByDistance(
        latency, {.node_offset = a.node_offset, .seed = a.seed + trial}, {.seed = a.seed + trial});
    if (!groups.ok()) return tool.Fail(groups.status());
    runs.emplace_back("plink 2lha (probed groups)", two_level(*groups));
    std::vector<std::vector<int>> truth(a.racks);
    for (int k = 0; k < p; ++k) truth[topo->RackOf(vm[k])].push_back(k);
    runs.emplace_back("2lha (true racks)", two_level(truth));
    std::vector<int> shuffled(p);
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const int k = std::max(1, static_cast<int>(std::lround(std::sqrt(p))));
    std::vector<std::vector<int>> random_groups(k);
    for (int i = 0; i < p; ++i) random_groups[i % k].push_back(shuffled[i]);
    for (auto& g : random_groups) std::sort(g.begin(), g.end());
    runs.emplace_back("2lha (balanced random)", two_level(random_groups));
    std::vector<int> by_rack(p);
    std::iota(by_rack.begin(), by_rack.end(), 0);
    runs.emplace_back("ring (rack order, reference)", sim::RingSchedule(by_rack, a.bytes));
    for (auto& [name, schedule] : runs) {
      if (!schedule.ok()) return tool.Fail(schedule.status());
      auto r = sim::Simulate(*topo, *schedule);
      if (!r.ok()) return tool.Fail(r.status());
      if (!ms.count(name)) order.push_back(name);
      ms[name].push_back(r->makespan_s * 1e3);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  };
  const double ring = mean(ms["ring (VM order)"]);
  if (a.json) {
    plexus::tooling::FigureWriter writer("agg_sim_compare", /*json=*/true);
    for (const auto& name : order) {
      plexus::tooling::Figure f;
      f.figure = name;
      f.value = mean(ms[name]);
      f.unit = "ms";
      f.extra = {
          {"speedup_vs_ring", ring / mean(ms[name])}, {"nodes", p},       {"racks", a.racks},
          {"oversubscription", a.oversubscription},   {"bytes", a.bytes}, {"trials", a.trials}};
      writer.Add(f);
    }
    return plexus::tooling::kExitOk;
  }
  std::printf(
      "Allreduce of %.4g bytes on %d VMs (%d racks of %d, %.0f Gbit/s NICs, uplinks "
      "oversubscribed %.3g:1), mean of %d simulated clouds\n\n",
      a.bytes, p, a.racks, a.per_rack, a.host_gbit, a.oversubscription, a.trials);
  std::printf("%-32s %12s %16s\n", "algorithm", "time (ms)", "vs ring (VM order)");
  for (const auto& name : order) {
    std::printf("%-32s %12.2f %15.2fx\n", name.c_str(), mean(ms[name]), ring / mean(ms[name]));
  }
  return plexus::tooling::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool("plexus-agg-sim", kDescription);
  tool.app().require_subcommand(1);
  namespace t = plexus::tooling;

  TableArgs table;
  CLI::App* table_cmd = tool.Subcommand("table", "Table 4.1 counted on the simulator's schedules");
  t::AddNumber(table_cmd, "-N,--per-rack", &table.per_rack, "nodes per rack (N)", 1, 64);
  t::AddNumber(table_cmd, "-C,--racks", &table.racks, "racks (C)", 2, 64);
  t::AddNumber(table_cmd, "-S,--bytes", &table.bytes, "buffer bytes per node (S)", 1.0, 1e12);
  t::AddJsonFlag(table_cmd, &table.json);

  HierarchyArgs hier;
  CLI::App* hier_cmd =
      tool.Subcommand("hierarchy", "PBox's inequality: does rack-level aggregation pay?");
  t::AddNumber(hier_cmd, "--workers-per-rack", &hier.model.workers_per_rack, "N", 1, 1 << 16);
  t::AddNumber(hier_cmd, "--racks", &hier.model.racks, "R", 1, 1 << 16);
  t::AddNumber(hier_cmd, "--pbox-bytes-per-s", &hier.model.pbox_bytes_per_s,
               "a box's bandwidth, bytes/s (B_PBox)", 1.0, 1e15);
  t::AddNumber(hier_cmd, "--core-bytes-per-s", &hier.model.core_bytes_per_s,
               "a rack's uplink, bytes/s (B_Core)", 1.0, 1e15);
  t::AddNumber(hier_cmd, "--worker-bytes-per-s", &hier.model.worker_bytes_per_s,
               "a worker's NIC, bytes/s (B_Wkr)", 1.0, 1e15);
  hier_cmd->add_flag("--ring", hier.ring, "racks exchange by a ring instead of a sharded PS");
  t::AddJsonFlag(hier_cmd, &hier.json);

  CompareArgs cmp;
  CLI::App* cmp_cmd = tool.Subcommand(
      "compare", "PLink's plan against ring and halving-doubling on simulated cloud fabrics");
  t::AddNumber(cmp_cmd, "--racks", &cmp.racks, "racks", 1, 64);
  t::AddNumber(cmp_cmd, "--per-rack", &cmp.per_rack, "VMs per rack", 1, 64);
  t::AddNumber(cmp_cmd, "--oversubscription", &cmp.oversubscription, "uplink oversubscription", 1.0,
               1000.0);
  t::AddNumber(cmp_cmd, "--bytes", &cmp.bytes, "buffer bytes per VM", 1024.0, 1e11);
  t::AddNumber(cmp_cmd, "--host-gbit", &cmp.host_gbit, "NIC Gbit/s", 0.001, 1e4);
  t::AddNumber(cmp_cmd, "--noise", &cmp.noise, "relative noise of the probes", 0.0, 0.9);
  t::AddNumber(cmp_cmd, "--trials", &cmp.trials, "simulated clouds", 1, 100);
  t::AddNumber(cmp_cmd, "--chunks", &cmp.chunks, "2LHA chunks (0: one per VM)", 0, 1 << 16);
  t::AddNumber(cmp_cmd, "--seed", &cmp.seed, "random seed", uint64_t{0}, ~uint64_t{0});
  cmp_cmd->add_flag("--offset", cmp.node_offset,
                    "embed with the per-node latency term h_i of Eq. 4.1");
  t::AddJsonFlag(cmp_cmd, &cmp.json);

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (cmp_cmd->parsed()) return RunCompare(tool, cmp);
  if (table_cmd->parsed()) return RunTable(tool, table);
  if (hier_cmd->parsed()) return RunHierarchy(tool, hier);
  return t::kExitUsage;
}
