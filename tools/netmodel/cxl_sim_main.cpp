// plexus-cxl-sim: the CXL fabric simulator on the seed's 16-device fat-tree (docs/netmodel.md,
// "CXL fabric simulator"): an incast, LLM inference and YCSB, each under vanilla CXL (credits
// only), Aurelia's congestion control with both signals, EPN alone and OVERLOAD alone; and `eval`,
// every workload under every routing policy with and without congestion control.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "plexus/netmodel/cxl_workloads.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

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
  cxl::CongestionControlOptions cc;    // the tunables; enabled, epn and overload come per mode
  int max_outstanding = 0;             // SimOptions::max_outstanding_packets
  bool input_fifo = false;             // SimOptions::input_fifo
  std::string credit_pools = "class";  // SimOptions::credit_pools: "class" or "protocol"
  int credits_per_vc = 256;            // LinkOptions::credits_per_vc
  double credit_update_ns = 0;         // LinkOptions::credit_update_ns
  double hot_factor = 4;
  double eval_interarrival_ns = 10;  // eval's YCSB load: the hot expander congests  // eval's
                                     // llm_hot: the hot expander's stripes, times a normal one
};

struct Mode {
  const char* name;
  bool cc, epn, overload;
};
constexpr Mode kModes[] = {{"vanilla", false, false, false},
                           {"aurelia", true, true, true},
                           {"epn_only", true, true, false},
                           {"overload_only", true, false, true}};

void ApplyCredits(const Args& a, cxl::SimOptions* o) {
  o->credit_pools =
      a.credit_pools == "protocol" ? cxl::CreditPools::kPerProtocol : cxl::CreditPools::kPerClass;
  o->link.credits_per_vc = a.credits_per_vc;
  o->link.credit_update_ns = a.credit_update_ns;
}

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
    o.cc = a.cc;
    o.max_outstanding_packets = a.max_outstanding;
    o.input_fifo = a.input_fifo;
    ApplyCredits(a, &o);
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

// eval: every workload under every routing policy, without and with Aurelia's congestion control.
struct EvalCase {
  std::string workload;
  std::vector<cxl::Transfer> transfers;
  std::vector<std::pair<cxl::FanId, double>> rates;
  const cxl::LlmWorkload* llm = nullptr;    // per-run throughput
  const cxl::YcsbWorkload* ycsb = nullptr;  // per-operation latency
};

constexpr const char* kEvalRouting[] = {"port_id", "ecmp", "spray", "adaptive"};

int64_t Bytes(const std::vector<cxl::Transfer>& t, int from, int to) {
  int64_t b = 0;
  for (int i = from; i < to; ++i) b += t[i].bytes;
  return b;
}

// One row: throughput (LLM: per run, median and 10th percentile; YCSB: bytes over the makespan),
// p99 (YCSB: per operation; LLM: request packets), pauses.
Json EvalRow(const EvalCase& c, const std::string& routing, bool cc, const cxl::SimResult& r) {
  Json j = {{"figure", "cxl_eval"},
            {"workload", c.workload},
            {"routing", routing},
            {"cc", cc ? "aurelia" : "vanilla"},
            {"pauses", r.pauses},
            {"switch_pauses", r.switch_pauses},
            {"epn_marked", r.epn_marked},
            {"congestion_cuts", r.congestion_cuts},
            {"overload_cuts", r.overload_cuts},
            {"makespan_ns", r.makespan_ns},
            {"events", r.events}};
  if (c.llm != nullptr) {
    const auto times = cxl::LlmRunTimes(*c.llm, r);
    std::vector<double> gbps;
    int from = 0;
    for (size_t i = 0; i < times.size(); ++i) {
      const int to = c.llm->run_end[i];
      gbps.push_back(static_cast<double>(Bytes(c.transfers, from, to)) / times[i]);
      from = to;
    }
    j["run_gbps"] = gbps;
    j["throughput_gbps"] = Pct(gbps, 0.5);
    j["throughput_p10_gbps"] = Pct(gbps, 0.1);
    j["p99_ns"] = r.latency_p99_ns;
  } else {
    j["throughput_gbps"] =
        static_cast<double>(Bytes(c.transfers, 0, static_cast<int>(c.transfers.size()))) /
        r.makespan_ns;
    const auto lat = cxl::YcsbLatencies(*c.ycsb, r);
    j["p99_ns"] = Pct(lat, 0.99);
    // The victims: operations on every expander but the busiest (Zipf's hot keys). Their tail
    // is what congestion spreading from the hot expander adds and congestion control can cut.
    std::map<uint16_t, int> ops_per_expander;
    std::vector<uint16_t> expander(c.ycsb->ops.size());
    for (size_t i = 0; i < c.ycsb->ops.size(); ++i) {
      const cxl::Transfer& t = c.transfers[c.ycsb->ops[i].last];
      expander[i] = (t.src.device == 2 && t.src.sw == 0 ? t.dst : t.src).value();
      ++ops_per_expander[expander[i]];
    }
    const auto hot = std::max_element(ops_per_expander.begin(), ops_per_expander.end(),
                                      [](auto x, auto y) { return x.second < y.second; });
    std::vector<double> cold, hot_lat;
    for (size_t i = 0; i < lat.size(); ++i) {
      (expander[i] == hot->first ? hot_lat : cold).push_back(lat[i]);
    }
    j["p99_hot_ns"] = Pct(hot_lat, 0.99);
    j["p99_cold_ns"] = Pct(cold, 0.99);
  }
  return j;
}

// Aurelia's tunables the seed leaves open (docs/netmodel.md), for sensitivity sweeps.
void AddCcOptions(CLI::App* app, cxl::CongestionControlOptions* cc) {
  tooling::AddNumber(app, "--bp-window-ns", &cc->bp_window_ns, "EP-BP counting window", 1.0, 1e9);
  tooling::AddNumber(app, "--bp-threshold", &cc->bp_threshold,
                     "EP-BP events in the window above which a switch marks EPN", 0, 1000000);
  tooling::AddNumber(app, "--tick-ns", &cc->tick_ns, "at most one cut and one recovery step per",
                     1.0, 1e9);
  tooling::AddNumber(app, "--recovery-steps", &cc->rate.congestion_recovery_steps,
                     "steps back to the remembered rate after an EPN cut", 1, 1000);
  tooling::AddNumber(app, "--cut-factor", &cc->rate.cut_factor, "rate *= this on a signal", 0.01,
                     0.99);
  tooling::AddNumber(app, "--overload-backlog", &cc->overload_backlog_flits,
                     "flits waiting at a receiver above which it sets OVERLOAD", 0, 1000000);
}

int Eval(const Args& a, const tooling::Tool& tool) {
  auto fabric = cxl::Fabric::FatTree(4);
  auto llm = cxl::LlmInference(*fabric, a.llm);
  if (!llm.ok()) return tool.Fail(llm.status());
  // The imbalanced ML case the seed leaves open: the same inference with one hot memory expander
  // (0:0:3) holding hot_factor times the weights of each other one, so its uplink is the
  // bottleneck of every weight load and the accelerators' other reads share their downlinks with
  // it.
  cxl::LlmWorkload hot = *llm;
  const cxl::FanId hot_expander{0, 0, 3};
  for (cxl::Transfer& t : hot.transfers) {
    if (t.op == cxl::Op::kRead && t.dst == hot_expander) {
      t.bytes = static_cast<int64_t>(static_cast<double>(t.bytes) * a.hot_factor);
    }
  }
  std::vector<EvalCase> cases;
  cases.push_back({"llm", llm->transfers, {}, &*llm, nullptr});
  cases.push_back({"llm_hot", hot.transfers, {}, &hot, nullptr});
  std::vector<cxl::YcsbWorkload> ycsb;
  ycsb.reserve(a.ycsb_workloads.size());
  for (char ch : a.ycsb_workloads) {
    if (ch == ',') continue;
    auto kind = cxl::ParseYcsb(std::string(1, ch));
    if (!kind.ok()) return tool.Fail(kind.status());
    cxl::YcsbSpec spec = a.ycsb;
    spec.workload = *kind;
    spec.mean_interarrival_ns = a.eval_interarrival_ns;
    auto w = cxl::YcsbWorkloadFor(*fabric, spec);
    if (!w.ok()) return tool.Fail(w.status());
    ycsb.push_back(*std::move(w));
    cases.push_back({absl::StrFormat("ycsb_%c", ch), ycsb.back().transfers,
                     ycsb.back().device_rates, nullptr, &ycsb.back()});
  }
  if (!a.json) {
    std::printf("%-9s %-9s %-8s %12s %12s %10s %10s %9s %9s\n", "workload", "routing", "cc",
                "thr_GB/s", "thr_p10", "p99_ns", "pauses", "epn_cuts", "ovl_cuts");
  }
  const int total = static_cast<int>(cases.size() * std::size(kEvalRouting) * 2);
  int done = 0;
  int64_t events = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const EvalCase& c : cases) {
    for (const char* routing_name : kEvalRouting) {
      auto routing = cxl::ParseRoutingPolicy(routing_name);
      if (!routing.ok()) return tool.Fail(routing.status());
      for (bool cc : {false, true}) {
        cxl::SimOptions o;
        o.routing = *routing;
        o.seed = a.seed;
        o.device_rates = c.rates;
        o.cc = a.cc;
        o.max_outstanding_packets = a.max_outstanding;
        o.input_fifo = a.input_fifo;
        ApplyCredits(a, &o);
        o.cc.enabled = cc;
        auto r = cxl::Simulate(*fabric, c.transfers, o);
        if (!r.ok()) {
          return tool.Fail(absl::StrFormat("%s, %s, %s: %s", c.workload, routing_name,
                                           cc ? "aurelia" : "vanilla", r.status().ToString()));
        }
        const Json j = EvalRow(c, routing_name, cc, *r);
        ++done;
        events += r->events;
        std::fprintf(
            stderr, "[%d/%d %.1fs] %s %s %s\n", done, total,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            c.workload.c_str(), routing_name, cc ? "aurelia" : "vanilla");
        if (a.json) {
          std::printf("%s\n", j.dump().c_str());
        } else {
          std::printf("%-9s %-9s %-8s %12.1f %12s %10.0f %10lld %9lld %9lld\n", c.workload.c_str(),
                      routing_name, cc ? "aurelia" : "vanilla", j["throughput_gbps"].get<double>(),
                      j.contains("throughput_p10_gbps")
                          ? absl::StrFormat("%.1f", j["throughput_p10_gbps"].get<double>()).c_str()
                          : "-",
                      j["p99_ns"].get<double>(), static_cast<long long>(r->pauses),
                      static_cast<long long>(r->congestion_cuts),
                      static_cast<long long>(r->overload_cuts));
        }
        std::fflush(stdout);
      }
    }
  }
  if (!a.json) {
    std::printf(
        "  thr: LLM per-run bytes / run time (median, 10th percentile); YCSB bytes / "
        "makespan. p99: LLM request packets, YCSB operations.\n");
  }
  // The simulator's speed over the whole table: one core (a simulation is one thread), workload
  // generation included in the time.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  tooling::FigureWriter speed("cxl", a.json);
  const Json common = {{"simulations", total}, {"seed", a.seed}, {"threads", 1}};
  tooling::Figure f;
  f.figure = "eval_seconds";
  f.value = seconds;
  f.unit = "s";
  f.target = "<= 600";
  f.met = seconds <= 600;
  f.extra = common;
  speed.Add(f);
  tooling::Figure e;
  e.figure = "events_per_s";
  e.value = static_cast<double>(events) / seconds;
  e.unit = "events/s";
  e.extra = common;
  e.extra["events"] = events;
  speed.Add(e);
  if (!a.json) speed.PrintTable();
  return tooling::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-cxl-sim",
                     "Flit-level CXL fabric simulations after Aurelia: vanilla CXL vs congestion "
                     "control (both signals, EPN alone, OVERLOAD alone) on a k = 4 fat-tree.");
  tool.app().require_subcommand(1);
  Args a;
  const auto shared = [&](CLI::App* app) {
    tooling::AddNumber(app, "--seed", &a.seed, "random seed", uint64_t{0},
                       std::numeric_limits<uint64_t>::max());
    tooling::AddJsonFlag(app, &a.json);
    AddCcOptions(app, &a.cc);
    tooling::AddNumber(app, "--max-outstanding", &a.max_outstanding,
                       "request packets a device may have unanswered (tags); 0: no limit", 0,
                       1000000);
    app->add_flag("--input-fifo", a.input_fifo,
                  "switches keep one FIFO per input link and VC (head-of-line blocking)");
    app->add_option("--credit-pools", a.credit_pools,
                    "what a VC carries: class (one per message class, the specification's) or "
                    "protocol (CXL.mem's classes share one, the seed's vanilla CXL)")
        ->check(CLI::IsMember({"class", "protocol"}))
        ->capture_default_str();
    tooling::AddNumber(app, "--credits-per-vc", &a.credits_per_vc,
                       "receive buffer per link and VC, in flits", 1, 1 << 20);
    tooling::AddNumber(app, "--credit-update-ns", &a.credit_update_ns,
                       "freed credits return together every this many ns (0: each on its own)", 0.0,
                       1e9);
  };
  const auto common = [&](CLI::App* app) {
    app->add_option("--routing", a.routing, "port_id, two_level, ecmp, spray or adaptive")
        ->capture_default_str();
    shared(app);
  };
  CLI::App* incast = tool.Subcommand("incast", "12 devices in pods 1-3 write to 0:0:2");
  tooling::AddNumber(incast, "--bytes", &a.incast_bytes, "bytes per writer", int64_t{64},
                     int64_t{1} << 34);
  common(incast);
  CLI::App* llm = tool.Subcommand("llm", "LLM inference: weight loads and ring all-reduces");
  tooling::AddNumber(llm, "--runs", &a.llm.runs, "inference runs (the seed: 1000)", 1, 100000);
  tooling::AddNumber(llm, "--scale", &a.llm.scale, "divides bytes and compute gaps", 1.0, 1e12);
  llm->add_flag("--overlap", a.llm.overlap_phases,
                "a run's phases start a compute gap apart whether or not the previous one ended "
                "(weight loads and all-reduces overlap)");
  common(llm);
  CLI::App* ycsb = tool.Subcommand("ycsb", "YCSB on 4 CPUs and 12 memory expanders");
  ycsb->add_option("--workloads", a.ycsb_workloads, "some of a,b,c,f")->capture_default_str();
  tooling::AddNumber(ycsb, "--ops", &a.ycsb.ops_per_cpu, "operations per CPU", 1, 100000000);
  tooling::AddNumber(ycsb, "--interarrival-ns", &a.ycsb.mean_interarrival_ns,
                     "mean gap between a CPU's operations", 0.001, 1e12);
  tooling::AddNumber(ycsb, "--memory-bytes-per-s", &a.ycsb.memory_bytes_per_s,
                     "an expander's processing rate, bytes/s", 1.0, 1e15);
  common(ycsb);
  CLI::App* eval = tool.Subcommand(
      "eval",
      "every workload (llm, llm_hot, YCSB) x routing (port_id, ecmp, spray, adaptive) "
      "x congestion control (vanilla, aurelia): throughput, p99, pauses");
  tooling::AddNumber(eval, "--runs", &a.llm.runs, "LLM inference runs", 1, 100000);
  tooling::AddNumber(eval, "--scale", &a.llm.scale, "LLM: divides bytes and compute gaps", 1.0,
                     1e12);
  tooling::AddNumber(eval, "--hot-factor", &a.hot_factor,
                     "llm_hot: the hot expander's weights, times each other one's", 1.0, 1e6);
  eval->add_option("--workloads", a.ycsb_workloads, "YCSB: some of a,b,c,f")->capture_default_str();
  tooling::AddNumber(eval, "--ops", &a.ycsb.ops_per_cpu, "YCSB operations per CPU", 1, 100000000);
  tooling::AddNumber(eval, "--memory-bytes-per-s", &a.ycsb.memory_bytes_per_s,
                     "YCSB: an expander's processing rate, bytes/s", 1.0, 1e15);
  tooling::AddNumber(eval, "--interarrival-ns", &a.eval_interarrival_ns,
                     "YCSB: mean gap between a CPU's operations", 0.001, 1e12);
  shared(eval);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (incast->parsed()) return Incast(a, tool);
  if (llm->parsed()) return Llm(a, tool);
  if (eval->parsed()) return Eval(a, tool);
  return Ycsb(a, tool);
}
