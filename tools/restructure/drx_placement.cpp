// plexus-drx placement: Fianchetto's placement study on netmodel's analytic model, next to the
// seed's figures (docs/restructure.md, "Placement model").
#include "drx_placement.hpp"

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plexus/netmodel/drx_placement.hpp"
#include "plexus/tooling/figures.hpp"

namespace plexus::drxtool {

namespace pn = plexus::netmodel;

namespace {

// The seed's figures the model is compared with (§3.7.1-3.7.3; the per-placement curves were
// figures that did not survive extraction, so only the quoted numbers are here).
std::optional<double> SeedShare(pn::DrxPlacement p, int apps) {
  static const std::map<int, double> multi_axl = {{1, 0.668}, {5, 0.557}, {10, 0.647}, {15, 0.717}};
  static const std::map<int, double> fianchetto = {
      {1, 0.170}, {5, 0.153}, {10, 0.135}, {15, 0.072}};
  const auto& m = p == pn::DrxPlacement::kMultiAxl ? multi_axl : fianchetto;
  auto it = m.find(apps);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::optional<double> SeedSpeedup(pn::DrxPlacement p, int apps) {
  if (p == pn::DrxPlacement::kBumpInTheWire && apps == 1) return 3.5;
  if (p == pn::DrxPlacement::kBumpInTheWire && apps == 15) return 8.2;
  if (p == pn::DrxPlacement::kIntegrated && apps == 15) return 4.4;
  return std::nullopt;
}

}  // namespace

int RunPlacement(const PlacementArgs& a) {
  const auto workloads = pn::FianchettoWorkloads();
  tooling::FigureWriter out("drx_placement", a.json);
  out.SetCommon({{"pcie_generation", a.fabric.pcie_generation},
                 {"upstream_lanes", a.fabric.upstream_lanes},
                 {"accelerators_per_switch", a.fabric.accelerators_per_switch}});
  for (int apps : a.apps) {
    // Mean over the five pipelines of each placement's speedup over Multi-Axl, and the
    // restructuring share of the end-to-end latency.
    std::map<pn::DrxPlacement, double> speedup, share;
    for (const pn::DrxWorkload& w : workloads) {
      auto base = pn::DrxLatency(a.fabric, w, pn::DrxPlacement::kMultiAxl, apps);
      if (!base.ok()) {
        std::fprintf(stderr, "plexus-drx placement: %s\n",
                     std::string(base.status().message()).c_str());
        return 2;
      }
      for (pn::DrxPlacement p : pn::kDrxPlacements) {
        auto l = pn::DrxLatency(a.fabric, w, p, apps);
        if (!l.ok()) {
          std::fprintf(stderr, "plexus-drx placement: %s\n",
                       std::string(l.status().message()).c_str());
          return 2;
        }
        speedup[p] += base->total_s() / l->total_s() / workloads.size();
        share[p] += l->restructuring_share() / workloads.size();
      }
    }
    for (pn::DrxPlacement p : pn::kDrxPlacements) {
      tooling::Figure f;
      f.figure = "speedup_vs_multi_axl";
      f.value = speedup[p];
      f.unit = "x";
      f.extra = {{"placement", pn::DrxPlacementName(p)}, {"apps", apps}};
      if (auto seed = SeedSpeedup(p, apps)) f.extra["seed"] = *seed;
      out.Add(f);
    }
    for (pn::DrxPlacement p : {pn::DrxPlacement::kMultiAxl, pn::DrxPlacement::kBumpInTheWire}) {
      tooling::Figure f;
      f.figure = "restructuring_share";
      f.value = share[p];
      f.unit = "fraction";
      f.extra = {{"placement", pn::DrxPlacementName(p)}, {"apps", apps}};
      if (auto seed = SeedShare(p, apps)) f.extra["seed"] = *seed;
      out.Add(f);
    }
  }
  const std::map<int, std::pair<double, double>> seed_collectives = {{4, {3.7, 5.1}},
                                                                     {32, {5.2, 10.5}}};
  for (int n : a.accelerators) {
    double broadcast = 0, allreduce = 0;
    for (const pn::DrxWorkload& w : workloads) {
      auto b = pn::DrxBroadcast(a.fabric, w, n);
      auto r = pn::DrxAllReduce(a.fabric, w, n);
      if (!b.ok() || !r.ok()) {
        std::fprintf(stderr, "plexus-drx placement: %s\n",
                     std::string((b.ok() ? r.status() : b.status()).message()).c_str());
        return 2;
      }
      broadcast += b->speedup() / workloads.size();
      allreduce += r->speedup() / workloads.size();
    }
    auto seed = seed_collectives.find(n);
    for (auto [name, value] :
         {std::pair{"broadcast_speedup", broadcast}, std::pair{"allreduce_speedup", allreduce}}) {
      tooling::Figure f;
      f.figure = name;
      f.value = value;
      f.unit = "x";
      f.extra = {{"placement", "bump-in-the-wire"}, {"accelerators", n}};
      if (seed != seed_collectives.end()) {
        f.extra["seed"] = name[0] == 'b' ? seed->second.first : seed->second.second;
      }
      out.Add(f);
    }
  }
  if (!a.json) out.PrintTable();
  return 0;
}

}  // namespace plexus::drxtool
