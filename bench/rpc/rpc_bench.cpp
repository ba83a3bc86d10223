// plexus-bench-rpc: Plexus RPC against gRPC (--compare) and a raw TCP ping-pong floor, on one
// echo.proto. Every measurement runs a server process and a client process (this program, or
// plexus-bench-rpc-grpc for gRPC, with --role) started through plexus::tooling::Launcher; the
// client prints its counts and this process reports medians over --runs runs.
//
//   plexus-bench-rpc [--compare] [--json] [--runs 5] [--seconds 1]
//
// Figures: latency (median, p99) with 1 call in flight for 64 B and 8 B payloads (echoed back),
// both processes on one CPU and on two CPUs (sched_setaffinity), against a raw TCP floor that
// waits as Plexus does (polls 50 us, then blocks) and one that blocks at once; RPC/s with 32 and
// 128 calls in flight (32 B); goodput of 8 KiB requests (empty replies, 32 in flight); the cost of
// a rate limit at an infinite rate, of an ACL that denies 1% of calls and of an engine that does
// nothing (the control), as RPC/s with the policy over RPC/s without; Plexus over shm as extra
// lines; the global QoS figures (server and client reorder points, qos_bench.cpp).
//
// This file: the figures (each group's runs and medians) and main; orchestrator.cpp runs a
// server/client pair, plexus_peer.cpp is the Plexus and raw TCP peers, qos_bench.cpp the QoS
// mixes (in this process).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator.hpp"
#include "order.hpp"
#include "peer.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus_peer.hpp"
#include "qos_bench.hpp"
#include "raw_tcp.hpp"
#include "stats.hpp"

namespace pb = plexus::benchrpc;
using pb::Layout;
using pb::Orchestrator;
using pb::Sample;

namespace {

using plexus::bench::Median;

struct Figures {
  plexus::tooling::FigureWriter* out;
  int runs;
  void Add(const std::string& figure, double value, const std::string& unit, nlohmann::json extra,
           nlohmann::json target = nullptr, std::optional<bool> met = {}) {
    plexus::tooling::Figure f;
    f.figure = figure;
    f.value = value;
    f.unit = unit;
    f.target = std::move(target);
    f.met = met;
    f.extra = std::move(extra);
    f.extra["runs"] = runs;
    out->Add(f);
  }
};

// One QoS mix without and with its engine, alternating within each run: the lines `prefix` +
// small_latency_median, small_latency_p99, bulk_rate (per mode, `extra` plus the mode's "policy"
// name and the counts) and small_p99_with_over_without (`ratio_extra`).
void MixFigures(Figures& fig, int runs, pb::QosMixOptions mix,
                pb::QosMixSample (*run)(const pb::QosMixOptions&), const std::string& prefix,
                const char* with_name, const nlohmann::json& extra,
                const nlohmann::json& ratio_extra) {
  std::vector<double> med[2], p99[2], bulk[2], calls[2], ratio;
  double failed = 0;
  for (int r = 0; r < runs; ++r) {
    pb::QosMixSample s[2];
    for (int m : {0, 1}) {
      mix.qos = m == 1;
      s[m] = run(mix);
      med[m].push_back(s[m].small_median_us);
      p99[m].push_back(s[m].small_p99_us);
      bulk[m].push_back(s[m].bulk_rate);
      calls[m].push_back(s[m].small_calls);
      failed += static_cast<double>(s[m].failed);
    }
    ratio.push_back(s[1].small_p99_us / s[0].small_p99_us);
  }
  for (int m : {0, 1}) {
    nlohmann::json e = extra;
    e["policy"] = m ? with_name : "none";
    e["small_calls"] = Median(calls[m]);
    e["failed_calls"] = failed;
    fig.Add(prefix + "small_latency_median", Median(med[m]), "us", e);
    fig.Add(prefix + "small_latency_p99", Median(p99[m]), "us", e);
    fig.Add(prefix + "bulk_rate", Median(bulk[m]), "RPC/s", e);
  }
  fig.Add(prefix + "small_p99_with_over_without", Median(ratio), "ratio", ratio_extra);
}

// Global QoS: small calls' latency with a bulk background on one server, without and with the
// "qos" engine on the server, then on the client's channel (qos_bench.cpp; in this process, the
// two modes alternate within each run).
void QosFigures(Figures& fig, int runs, double seconds) {
  const pb::QosMixOptions mix{.seconds = std::max(1.0, seconds)};
  MixFigures(fig, runs, mix, pb::RunQosMix, "qos_", "qos",
             {{"system", "plexus-tcp"},
              {"small_bytes", mix.small_bytes},
              {"bulk_bytes", mix.bulk_bytes},
              {"bulk_inflight", mix.bulk_inflight}},
             {{"system", "plexus-tcp"}, {"bulk_inflight", mix.bulk_inflight}});
  // The client side: one channel (window 4) that 12 bulk callers keep full, a small caller beside
  // them, without and with the qos engine on the channel (the server has none).
  const pb::QosMixOptions cmix{.seconds = std::max(1.0, seconds), .bulk_inflight = 12, .window = 4};
  MixFigures(
      fig, runs, cmix, pb::RunClientQosMix, "qos_client_", "qos on the channel",
      {{"system", "plexus-tcp"},
       {"small_bytes", cmix.small_bytes},
       {"bulk_bytes", cmix.bulk_bytes},
       {"bulk_callers", cmix.bulk_inflight},
       {"window", cmix.window}},
      {{"system", "plexus-tcp"}, {"bulk_callers", cmix.bulk_inflight}, {"window", cmix.window}});
}

// Policy cost: RPC/s (ok calls) with the policy on the client's chain against RPC/s without, in
// alternating 20 ms windows of one client run (so both see the same machine), 32 in flight,
// 32 B; 1% of requests carry the tag the ACL denies (only ok calls count, so the ACL's 1% is
// part of its cost). Each run's cost is the median over its adjacent window pairs (one without
// the policy, the next with it): a stall of the machine lands in one window of a pair, and the
// pooled rates of a run, also reported, move by a point or two with a few of them. The figure is
// the median of the runs'. "noop" is the control: an engine that passes every call, what any
// engine costs before it does anything (no target).
void PolicyFigures(Orchestrator& o, Figures& fig, int runs) {
  const Layout unpinned{"unpinned,blocking", -1, -1};
  // tagcheck and tagcheck_in_place (bench/rpc/plexus_peer.cpp) split the ACL's cost into its
  // rule matching and its private copy; like noop, they have no target.
  for (const std::string p : {"noop", "ratelimit", "acl", "tagcheck", "tagcheck_in_place"}) {
    std::vector<double> with, without, ratio, paired;
    for (int r = 0; r < runs; ++r) {
      Sample s = o.Run("plexus-tcp", unpinned, "rate", 32, 32, 32, p, 1.0);
      with.push_back(s.rate);
      without.push_back(s.base_rate);
      ratio.push_back(s.base_rate > 0 ? s.rate / s.base_rate : NAN);
      if (std::isfinite(s.pair_cost)) paired.push_back(s.pair_cost);
    }
    nlohmann::json extra = {
        {"system", "plexus-tcp"}, {"policy", p}, {"inflight", 32}, {"size", 32}};
    fig.Add("policy_rpc_rate", Median(with), "RPC/s", extra);
    nlohmann::json base = extra;
    base["policy"] = absl::StrCat("none (", p, " run)");
    fig.Add("policy_rpc_rate", Median(without), "RPC/s", base);
    const double cost = Median(paired);
    extra["pooled_cost"] = 1 - Median(ratio);  // from each run's two rates
    if (p != "ratelimit" && p != "acl") {
      fig.Add("policy_cost", cost, "fraction", extra);
    } else {
      fig.Add("policy_cost", cost, "fraction", extra, "<= 0.03", cost <= 0.03);
    }
  }
  // The chain alone, in process: what an engine costs a call with nothing else around it, by one
  // thread and by two sharing the chain (a Channel called from several threads).
  for (int threads : {1, 2}) {
    for (const std::string p : {"none", "noop", "ratelimit", "acl", "tagcheck"}) {
      std::vector<double> ns;
      for (int r = 0; r < runs; ++r) ns.push_back(pb::ChainNsPerCall(p, threads, 0.2));
      fig.Add("policy_chain_ns", Median(ns), "ns/call",
              {{"policy", p}, {"threads", threads}, {"where", "in process"}});
    }
  }
}

int Orchestrate(bool compare, bool json, int runs, const pb::PeerArgs& base,
                const std::string& only) {
  Orchestrator o;
  o.self = plexus::tooling::SelfPath("plexus-bench-rpc");
  o.base = base;
  std::string grpc_missing = PLEXUS_BENCH_GRPC_MISSING;
  if (compare && grpc_missing.empty()) {
    o.grpc_peer = o.self.substr(0, o.self.rfind('/') + 1) + "plexus-bench-rpc-grpc";
    if (access(o.grpc_peer.c_str(), X_OK) != 0) grpc_missing = o.grpc_peer + " is not built";
  }
  const bool grpc = compare && grpc_missing.empty();
  if (compare && !grpc) {
    std::fprintf(stderr, "plexus-bench-rpc: --compare: gRPC skipped: %s\n", grpc_missing.c_str());
  }
  plexus::tooling::FigureWriter out("rpc", json);
  Figures fig{&out, runs};
  if (!json) {
    std::printf(
        "plexus-bench-rpc: medians of %d runs of %.2f s; server and client in separate "
        "processes on 127.0.0.1. Waiting: Plexus polls up to 50 us (20 us with a device thread) "
        "while that pays, then blocks; raw-tcp blocks in recv(); raw-tcp-spin polls 50 us, then "
        "blocks (the floor under Plexus's waiting); gRPC blocks in cq.Next()\n",
        runs, base.seconds);
  }
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<Layout> layouts = {{"same-cpu", 0, 0}};
  if (cpus >= 2) layouts.push_back({"split-cpu", 0, 1});
  const Layout unpinned{"unpinned", -1, -1};

  // --only: one group of figures; empty: all of them.
  auto wanted = [&](const char* group) { return only.empty() || only == group; };
  // Latency, 1 in flight. Each run launches the systems in a balanced order (BalancedOrder), so
  // that a disturbance, or being first, falls on all of them alike.
  for (const Layout& layout : wanted("latency") ? layouts : std::vector<Layout>{}) {
    for (uint32_t size : {64u, 8u}) {
      std::map<std::string, std::vector<double>> med, p99;
      std::vector<std::string> systems = {"raw-tcp", "raw-tcp-spin", "plexus-tcp"};
      if (grpc) systems.push_back("grpc");
      if (layout.name.rfind("split", 0) == 0 && size == 64) systems.push_back("plexus-shm");
      for (int r = 0; r < runs; ++r) {
        for (size_t k : plexus::bench::BalancedOrder(systems.size(), static_cast<size_t>(r))) {
          const std::string& sys = systems[k];
          Sample s = o.Run(sys, layout, "latency", size, size, 1);
          med[sys].push_back(s.median_us);
          p99[sys].push_back(s.p99_us);
        }
      }
      for (const std::string& sys : systems) {
        nlohmann::json extra = {{"system", sys}, {"layout", layout.name}, {"size", size}};
        fig.Add("latency_median", Median(med[sys]), "us", extra);
        fig.Add("latency_p99", Median(p99[sys]), "us", extra);
      }
      // Like with like carries the target: on two CPUs Plexus's waits spin, so the floor that
      // spins; on one CPU its adaptive spin stops (the peer needs the CPU), so the blocking
      // floor. The other floor and gRPC (blocking) are for information.
      const double plexus = Median(med["plexus-tcp"]);
      nlohmann::json extra = {{"system", "plexus-tcp"}, {"layout", layout.name}, {"size", size}};
      const bool spinning = layout.server_cpu != layout.client_cpu;
      const double vs_spin = plexus / Median(med["raw-tcp-spin"]);
      const double vs_blocking = plexus / Median(med["raw-tcp"]);
      // The blocking floor's target is the tighter one: on one CPU nothing but each side's own
      // work separates Plexus from it (the split below shows where the difference is).
      auto add_vs = [&](const char* figure, double v, bool like) {
        if (like && !spinning) {
          fig.Add(figure, v, "ratio", extra, "<= 1.1", v <= 1.1);
        } else if (like) {
          fig.Add(figure, v, "ratio", extra, "<= 1.3", v <= 1.3);
        } else {
          fig.Add(figure, v, "ratio", extra);
        }
      };
      add_vs("latency_median_vs_raw_tcp_spin", vs_spin, spinning);
      add_vs("latency_median_vs_raw_tcp_blocking", vs_blocking, !spinning);
      if (grpc) {
        fig.Add("latency_median_vs_grpc_blocking", plexus / Median(med["grpc"]), "ratio", extra);
      }
    }
  }

  // The same-cpu 64 B difference split into user space and kernel: both peers of raw-tcp and
  // plexus-tcp run with libplexus_syscall_clock.so preloaded, which times each side's socket
  // system calls. On one CPU a round trip is the client's time between its calls plus its
  // blocking calls, which hold everything else (the kernel's work, the server's turn); each
  // side's time between its calls is its user-space work.
  if (wanted("latency")) {
    o.split = true;
    const std::vector<std::string> systems = {"raw-tcp", "plexus-tcp"};
    std::map<std::string, std::vector<double>> med, client, server, user;
    for (int r = 0; r < runs; ++r) {
      for (size_t k : plexus::bench::BalancedOrder(systems.size(), static_cast<size_t>(r))) {
        const std::string& sys = systems[k];
        Sample s = o.Run(sys, layouts[0], "latency", 64, 64, 1);
        med[sys].push_back(s.median_us);
        client[sys].push_back(s.client_user_us);
        server[sys].push_back(s.server_user_us);
        user[sys].push_back(s.client_user_us + s.server_user_us);
      }
    }
    o.split = false;
    nlohmann::json extra = {{"layout", "same-cpu"}, {"size", 64}, {"clock", "preloaded"}};
    for (const std::string& sys : systems) {
      extra["system"] = sys;
      fig.Add("latency_median", Median(med[sys]), "us", extra);
      extra["side"] = "client";
      fig.Add("latency_user_us", Median(client[sys]), "us", extra);
      extra["side"] = "server";
      fig.Add("latency_user_us", Median(server[sys]), "us", extra);
      extra.erase("side");
    }
    extra["system"] = "plexus-tcp";
    fig.Add("latency_median_over_raw_tcp", Median(med["plexus-tcp"]) - Median(med["raw-tcp"]), "us",
            extra);
    fig.Add("latency_user_over_raw_tcp", Median(user["plexus-tcp"]) - Median(user["raw-tcp"]), "us",
            extra);
  }

  // RPC/s with 32 and 128 in flight, 32 B each way; unpinned (both processes on every CPU).
  for (int inflight : wanted("rate") ? std::vector<int>{32, 128} : std::vector<int>{}) {
    std::map<std::string, std::vector<double>> rate;
    std::vector<std::string> systems = {"plexus-tcp"};
    if (grpc) systems.push_back("grpc");
    if (inflight == 32) {
      systems.push_back("plexus-shm");
      systems.push_back("plexus-tcp-thread");
    }
    for (int r = 0; r < runs; ++r) {
      for (const std::string& sys : systems) {
        rate[sys].push_back(o.Run(sys, unpinned, "rate", 32, 32, inflight).rate);
      }
    }
    for (const std::string& sys : systems) {
      fig.Add("rpc_rate", Median(rate[sys]), "RPC/s",
              {{"system", sys}, {"layout", unpinned.name}, {"size", 32}, {"inflight", inflight}});
    }
    if (grpc) {
      const double vs = Median(rate["plexus-tcp"]) / Median(rate["grpc"]);
      fig.Add("rpc_rate_vs_grpc", vs, "ratio",
              {{"system", "plexus-tcp"}, {"size", 32}, {"inflight", inflight}}, ">= 3", vs >= 3);
    }
  }

  // Goodput: 8 KiB requests, empty replies, 32 and 128 in flight (the issue names no window; both
  // are reported, each against gRPC at the same window).
  for (int inflight : wanted("goodput") ? std::vector<int>{32, 128} : std::vector<int>{}) {
    std::map<std::string, std::vector<double>> gp;
    std::vector<std::string> systems = {"plexus-tcp"};
    if (grpc) systems.push_back("grpc");
    for (int r = 0; r < runs; ++r) {
      for (const std::string& sys : systems) {
        gp[sys].push_back(o.Run(sys, unpinned, "rate", 8192, 0, inflight).goodput);
      }
    }
    for (const std::string& sys : systems) {
      fig.Add("goodput", Median(gp[sys]), "GB/s",
              {{"system", sys}, {"layout", unpinned.name}, {"size", 8192}, {"inflight", inflight}});
    }
    if (grpc) {
      const double vs = Median(gp["plexus-tcp"]) / Median(gp["grpc"]);
      fig.Add("goodput_vs_grpc", vs, "ratio",
              {{"system", "plexus-tcp"}, {"size", 8192}, {"inflight", inflight}}, ">= 4", vs >= 4);
    }
  }

  if (wanted("policy")) PolicyFigures(o, fig, runs);
  // Live upgrade every 100 ms during a rate run (32 in flight, 32 B): the longest time an upgrade
  // held calls at the gate, p99 latency of the calls in flight during a swap against all calls,
  // and calls lost, duplicated or missing from the upgraded metrics engine (target: 0).
  if (wanted("upgrade")) {
    std::map<std::string, std::vector<double>> u;
    for (int r = 0; r < runs; ++r) {
      Sample s = o.Run("plexus-tcp", unpinned, "rate", 32, 32, 32, "upgrade");
      for (const auto& [k, v] : s.upgrade) u[k].push_back(v);
    }
    nlohmann::json extra = {{"system", "plexus-tcp"},
                            {"inflight", 32},
                            {"size", 32},
                            {"every_ms", 100},
                            {"swaps", Median(u["swaps"])}};
    fig.Add("upgrade_max_pause", Median(u["max_pause_us"]), "us", extra);
    fig.Add("upgrade_p99_during_swaps", Median(u["p99_during_us"]), "us", extra);
    fig.Add("upgrade_max_latency_during_swaps", Median(u["max_during_us"]), "us", extra);
    fig.Add("upgrade_p99_all", Median(u["p99_us"]), "us", extra);
    double bad = 0;
    for (const char* k : {"lost", "duplicated", "uncounted"}) {
      for (double v : u[k]) bad += std::abs(v);
    }
    fig.Add("upgrade_calls_lost_duplicated_uncounted", bad, "calls", extra, "== 0", bad == 0);
  }
  if (wanted("qos")) QosFigures(fig, runs, base.seconds);
  if (!json) out.PrintTable();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool(
      "plexus-bench-rpc",
      "Plexus RPC latency, RPC/s, goodput and policy cost, against gRPC's async completion-queue "
      "server and client (--compare) and a raw TCP ping-pong, on one echo.proto. Server and "
      "client run in separate processes on 127.0.0.1; figures are medians of --runs runs.");
  bool compare = false, json = false;
  int runs = 5;
  std::string only;
  pb::PeerArgs peer;
  pb::PlexusArgs x;
  tool.app().add_flag("--compare", compare, "also run gRPC (plexus-bench-rpc-grpc)");
  plexus::tooling::AddJsonFlag(&tool.app(), &json);
  plexus::tooling::AddNumber(&tool.app(), "--runs", &runs, "runs per figure (the median is kept)",
                             1, 100);
  pb::AddPeerOptions(&tool.app(), &peer);
  tool.app()
      .add_option("--transport", x.transport, "peer: tcp or shm")
      ->check(CLI::IsMember({"tcp", "shm"}))
      ->group("");
  tool.app()
      .add_option("--progress", x.progress, "peer: the transport's progress (thread or caller)")
      ->check(CLI::IsMember({"thread", "caller"}))
      ->group("");
  tool.app()
      .add_option(
          "--policy", x.policy,
          "peer: none, noop, ratelimit, acl, tagcheck or tagcheck_in_place on the client's chain, "
          "or upgrade (rate limit and metrics upgraded every 100 ms)")
      ->check(CLI::IsMember(
          {"none", "noop", "ratelimit", "acl", "tagcheck", "tagcheck_in_place", "upgrade"}))
      ->group("");
  tool.app()
      .add_option("--only", only,
                  "run one group of figures: latency, rate (RPC/s), goodput, policy (policy "
                  "costs), upgrade (live upgrade) or qos (the global QoS figures)")
      ->check(CLI::IsMember({"latency", "rate", "goodput", "policy", "upgrade", "qos"}));
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (peer.cpu >= 0) plexus::bench::PinToCpu(peer.cpu);
  if (peer.role.empty()) return Orchestrate(compare, json, runs, peer, only);
  if (peer.role == "server") return pb::PlexusServer(x);
  if (peer.role == "client") return pb::PlexusClient(peer, x);
  if (peer.role == "raw-server") return pb::RawServer(peer);
  if (peer.role == "raw-client") return pb::RawClient(peer);
  return tool.Usage("--role must be server, client, raw-server or raw-client");
}
