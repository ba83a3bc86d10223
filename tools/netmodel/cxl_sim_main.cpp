// plexus-cxl-sim: the CXL fabric simulator on the seed's 16-device fat-tree (docs/netmodel.md,
// "CXL fabric simulator"): an incast, LLM inference and YCSB, each under vanilla CXL (credits
// only), Aurelia's congestion control with both signals, EPN alone and OVERLOAD alone.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "plexus/netmodel/cxl_workloads.hpp"
#include "plexus/tooling/cli.hpp"

namespace {

namespace cxl = plexus::netmodel::cxl;
namespace tooling = plexus::tooling;
using Json = nlohmann::json;

struct Args {
  bool json = false;
  std::string routing = "port_id";
  uint64_t seed = 1;
  int64_t incast_bytes = 1 << 20;
  cxl::LlmSpec llm;
  cxl::YcsbSpec ycsb;
  std::string ycsb_workloads = "a,b,c,f";
};

struct Mode {
  const char* name;
  bool cc, epn, overload;
};
constexpr Mode kModes[] = {{"vanilla", false, false, false},
                           {"aurelia", true, true, true},
                           {"epn_only", true, true, false},
                           {"overload_only", true, false, true}};

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Runs every mode and prints one row (or JSON line) each; `extra` adds the workload's figures.
template <typename Extra>
int RunModes(const Args& a, const tooling::Tool& tool, const std::string& workload,
             const std::vector<cxl::Transfer>& transfers,
             const std::vector<std::pair<cxl::FanId, double>>& rates, Extra extra) {
  auto fabric = cxl::Fabric::FatTree(4);
  auto routing = cxl::ParseRoutingPolicy(a.routing);
  if (!routing.ok()) return tool.Fail(routing.status());
  if (!a.json) {
    std::printf("%-12s %-14s %10s %10s %8s %8s %8s %12s %12s %10s %8s\n", "workload", "mode",
                "pauses", "sw_pauses", "marked", "epn_cut", "ovl_cut", "figure_a", "figure_b",
                "events", "Mev/s");
  }
  for (const Mode& m : kModes) {
    cxl::SimOptions o;
    o.routing = *routing;
    o.seed = a.seed;
    o.device_rates = rates;
    o.cc.enabled = m.cc;
    o.cc.epn = m.epn;
    o.cc.overload = m.overload;
    auto r = cxl::Simulate(*fabric, transfers, o);
    if (!r.ok()) return tool.Fail(r.status());
    const auto [name_a, value_a, name_b, value_b] = extra(*r);
    if (a.json) {
      Json j = {{"workload", workload},
                {"mode", m.name},
                {"routing", a.routing},
                {"pauses", r->pauses},
                {"switch_pauses", r->switch_pauses},
                {"epn_marked", r->epn_marked},
                {"congestion_cuts", r->congestion_cuts},
                {"overload_cuts", r->overload_cuts},
                {name_a, value_a},
                {name_b, value_b},
                {"makespan_ns", r->makespan_ns},
                {"events", r->events},
                {"events_per_s", r->events_per_s}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-12s %-14s %10lld %10lld %8lld %8lld %8lld %12.0f %12.0f %10lld %8.2f\n",
                  workload.c_str(), m.name, static_cast<long long>(r->pauses),
                  static_cast<long long>(r->switch_pauses), static_cast<long long>(r->epn_marked),
                  static_cast<long long>(r->congestion_cuts),
                  static_cast<long long>(r->overload_cuts), value_a, value_b,
                  static_cast<long long>(r->events), r->events_per_s / 1e6);
    }
  }
  if (!a.json) std::printf("  figure_a, figure_b: see docs/netmodel.md for the workload\n");
  return tooling::kExitOk;
}

using Figures = std::tuple<std::string, double, std::string, double>;

int Incast(const Args& a, const tooling::Tool& tool) {
  std::vector<cxl::Transfer> t;
  for (int pod = 1; pod < 4; ++pod) {
    for (int sw = 0; sw < 2; ++sw) {
      for (int dev = 2; dev < 4; ++dev) {
        cxl::Transfer x;
        x.src = {pod, sw, dev};
        x.dst = {0, 0, 2};
        x.bytes = a.incast_bytes;
        t.push_back(x);
      }
    }
  }
  return RunModes(a, tool, "incast", t, {}, [](const cxl::SimResult& r) {
    return Figures{"makespan_ns", r.makespan_ns, "latency_p99_ns", r.latency_p99_ns};
  });
}

int Llm(const Args& a, const tooling::Tool& tool) {
  auto fabric = cxl::Fabric::FatTree(4);
  auto w = cxl::LlmInference(*fabric, a.llm);
  if (!w.ok()) return tool.Fail(w.status());
  return RunModes(a, tool, "llm", w->transfers, {}, [&](const cxl::SimResult& r) {
    const auto times = cxl::LlmRunTimes(*w, r);
    return Figures{"run_p50_ns", Pct(times, 0.5), "run_p90_ns", Pct(times, 0.9)};
  });
}

int Ycsb(const Args& a, const tooling::Tool& tool) {
  auto fabric = cxl::Fabric::FatTree(4);
  for (char c : a.ycsb_workloads) {
    if (c == ',') continue;
    auto kind = cxl::ParseYcsb(std::string(1, c));
    if (!kind.ok()) return tool.Fail(kind.status());
    cxl::YcsbSpec spec = a.ycsb;
    spec.workload = *kind;
    auto w = cxl::YcsbWorkloadFor(*fabric, spec);
    if (!w.ok()) return tool.Fail(w.status());
    const int code =
        RunModes(a, tool, absl::StrFormat("ycsb_%c", c), w->transfers, w->device_rates,
                 [&](const cxl::SimResult& r) {
                   const auto lat = cxl::YcsbLatencies(*w, r);
                   return Figures{"op_p50_ns", Pct(lat, 0.5), "op_p99_ns", Pct(lat, 0.99)};
                 });
    if (code != tooling::kExitOk) return code;
  }
  return tooling::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-cxl-sim",
                     "Flit-level CXL fabric simulations after Aurelia: vanilla CXL vs congestion "
                     "control (both signals, EPN alone, OVERLOAD alone) on a k = 4 fat-tree.");
  tool.app().require_subcommand(1);
  Args a;
  const auto common = [&](CLI::App* app) {
    app->add_option("--routing", a.routing, "port_id, two_level, ecmp, spray or adaptive")
        ->capture_default_str();
    tooling::AddNumber(app, "--seed", &a.seed, "random seed", uint64_t{0},
                       std::numeric_limits<uint64_t>::max());
    tooling::AddJsonFlag(app, &a.json);
  };
  CLI::App* incast = tool.Subcommand("incast", "12 devices in pods 1-3 write to 0:0:2");
  tooling::AddNumber(incast, "--bytes", &a.incast_bytes, "bytes per writer", int64_t{64},
                     int64_t{1} << 34);
  common(incast);
  CLI::App* llm = tool.Subcommand("llm", "LLM inference: weight loads and ring all-reduces");
  tooling::AddNumber(llm, "--runs", &a.llm.runs, "inference runs (the seed: 1000)", 1, 100000);
  tooling::AddNumber(llm, "--scale", &a.llm.scale, "divides bytes and compute gaps", 1.0, 1e12);
  common(llm);
  CLI::App* ycsb = tool.Subcommand("ycsb", "YCSB on 4 CPUs and 12 memory expanders");
  ycsb->add_option("--workloads", a.ycsb_workloads, "some of a,b,c,f")->capture_default_str();
  tooling::AddNumber(ycsb, "--ops", &a.ycsb.ops_per_cpu, "operations per CPU", 1, 100000000);
  tooling::AddNumber(ycsb, "--interarrival-ns", &a.ycsb.mean_interarrival_ns,
                     "mean gap between a CPU's operations", 0.001, 1e12);
  tooling::AddNumber(ycsb, "--memory-bytes-per-s", &a.ycsb.memory_bytes_per_s,
                     "an expander's processing rate, bytes/s", 1.0, 1e15);
  common(ycsb);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (incast->parsed()) return Incast(a, tool);
  if (llm->parsed()) return Llm(a, tool);
  return Ycsb(a, tool);
}
