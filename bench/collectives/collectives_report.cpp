// plexus-bench-collectives: tables, JSON lines and the summary (collectives_report.hpp).
#include "collectives_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plexus/tooling/figures.hpp"
#include "stats.hpp"

namespace plexus::bench {
namespace {

namespace pb = plexus::bench;
namespace pt_tooling = plexus::tooling;

using plexus::bench::Median;

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
  int iters = 0;
  int samples = 0;
};

Row MakeRow(pb::Op op, size_t bytes, const Point& p, int nprocs) {
  Row r;
  r.bytes = bytes;
  r.count = p.count;
  r.time_us = Median(p.times_us);
  r.algbw = r.time_us > 0 ? static_cast<double>(bytes) / (r.time_us * 1e-6) / 1e9 : 0;
  r.busbw = r.algbw * pb::BusFactor(op, nprocs);
  r.wrong = p.wrong;
  r.iters = p.iters;
  r.samples = static_cast<int>(p.times_us.size());
  return r;
}

bool Measures(const Job& job, pb::Op op) {
  return std::find(job.ops.begin(), job.ops.end(), op) != job.ops.end();
}

}  // namespace

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? fmt::format("{} {} {}", a, b, c) : std::string("unknown");
}

bool PrintReport(const GridOptions& o, const std::vector<Job>& jobs, const Samples& samples,
                 const Failures& failures, long cpus, const std::string& load_at_start) {
  bool all_ok = true;
  const int max_np = *std::max_element(o.nprocs.begin(), o.nprocs.end());
  // The best peer for a Plexus line: the highest busbw among peers of the same operation,
  // transport and process count at the same size (for shm that is Open MPI over vader only).
  auto best_peer = [&](pb::Op op, const std::string& transport, int nprocs,
                       size_t bytes) -> std::optional<std::pair<std::string, Row>> {
    std::optional<std::pair<std::string, Row>> best;
    for (const auto& [key, points] : samples) {
      const auto& [impl, op_name, t, n] = key;
      if (impl.rfind("plexus", 0) == 0 || op_name != pb::OpName(op) || t != transport ||
          n != nprocs)
        continue;
      const auto it = points.find(bytes);
      if (it == points.end()) continue;
      const Row row = MakeRow(op, bytes, it->second, nprocs);
      if (!best || row.busbw > best->second.busbw) best = {{impl, row}};
    }
    return best;
  };

  const bool oversubscribed = max_np > cpus;
  if (!o.json) {
    std::string op_names;
    for (pb::Op op : o.ops)
      op_names += fmt::format("{}{}", op_names.empty() ? "" : ", ", pb::OpName(op));
    std::printf(
        "# plexus-bench-collectives: %s; float, sum, out of place (Gloo allreduce and "
        "every broadcast: in place)\n",
        op_names.c_str());
    std::printf("# %ld CPUs, load average at start %s; %s of %d launch(es) per configuration\n",
                cpus, load_at_start.c_str(), o.runs > 1 ? "medians" : "figures", o.runs);
    std::printf("# binding: %s\n", o.bind_core ? "rank r on CPU r mod #CPUs (--bind core)"
                                               : "none, the scheduler places processes");
    if (oversubscribed) {
      std::printf("# NOTE: %d processes oversubscribe the %ld CPUs of this machine\n", max_np,
                  cpus);
    }
  }
  for (pb::Op op : o.ops) {
    const std::string op_name(pb::OpName(op));
    if (!o.json) std::printf("#\n# ==== %s ====\n", op_name.c_str());
    for (const Job& job : jobs) {
      if (!Measures(job, op)) continue;
      const Key key{job.impl, op_name, job.transport, job.nprocs};
      const auto it = samples.find(key);
      if (!o.json) {
        std::printf("#\n# %s %s over %s, %d processes%s\n", job.impl.c_str(), op_name.c_str(),
                    job.transport.c_str(), job.nprocs,
                    job.nprocs > cpus ? " (oversubscribed)" : "");
        if (!job.unavailable.empty()) {
          std::printf("# peer unavailable: %s\n", job.unavailable.c_str());
          continue;
        }
        if (job.under_mpirun) {
          std::string command;
          for (const std::string& a : job.argv) command += (command.empty() ? "" : " ") + a;
          std::printf("# %s\n", command.c_str());
        }
        const auto failed = failures.find({job.impl, job.transport, job.nprocs});
        if (failed != failures.end()) std::printf("# FAILED: %s\n", failed->second.c_str());
        if (it == samples.end()) continue;
        std::printf("# %10s %12s %8s %6s %11s %12s %12s %7s%s\n", "size", "count", "type", "redop",
                    "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong",
                    job.plexus && o.compare ? "  vs_best_peer" : "");
      }
      if (it == samples.end()) continue;
      const char* redop =
          op == pb::Op::kAllreduce || op == pb::Op::kReduce || op == pb::Op::kReduceScatter
              ? "sum"
              : "none";
      for (const auto& [bytes, point] : it->second) {
        const Row row = MakeRow(op, bytes, point, job.nprocs);
        if (row.wrong != 0) all_ok = false;
        std::optional<std::pair<std::string, Row>> best;
        if (job.plexus && o.compare) best = best_peer(op, job.transport, job.nprocs, bytes);
        // NaN when there is no peer figure to compare with.
        const double ratio =
            best && best->second.busbw > 0 ? row.busbw / best->second.busbw : std::nan("");
        if (o.json) {
          nlohmann::json j;
          j["impl"] = job.impl;
          j["transport"] = job.transport;
          j["nprocs"] = job.nprocs;
          j["op"] = op_name;
          j["bytes"] = row.bytes;
          j["count"] = row.count;
          j["dtype"] = "float";
          j["redop"] = redop;
          j["time_us"] = row.time_us;
          // The spread over runs, to tell a real gap from a noisy machine.
          j["time_us_min"] = *std::min_element(point.times_us.begin(), point.times_us.end());
          j["time_us_max"] = *std::max_element(point.times_us.begin(), point.times_us.end());
          j["time_us_runs"] = point.times_us;  // one per launch, in run order
          j["algbw"] = row.algbw;
          j["busbw"] = row.busbw;
          j["wrong"] = row.wrong;
          j["iters"] = row.iters;
          j["runs"] = row.samples;
          j["oversubscribed"] = job.nprocs > cpus;
          j["bind"] = o.bind_core ? "core" : "none";
          if (job.impl == "plexus_traced") {
            // Tracing's cost: this line's median time over the untraced line's (same runs).
            j["algorithm"] = o.algorithm;
            j["trace"] = true;
            std::optional<double> vs_untraced;
            if (const auto u = samples.find(Key{"plexus", op_name, job.transport, job.nprocs});
                u != samples.end()) {
              if (const auto at = u->second.find(bytes); at != u->second.end()) {
                vs_untraced = row.time_us / MakeRow(op, bytes, at->second, job.nprocs).time_us;
              }
            }
            j["vs_untraced"] = vs_untraced ? nlohmann::json(*vs_untraced) : nlohmann::json(nullptr);
          }
          if (job.plexus) {
            j["algorithm"] = o.algorithm;
            j["vs_best_peer"] = std::isnan(ratio) ? nlohmann::json(nullptr) : nlohmann::json(ratio);
            j["best_peer"] = best ? nlohmann::json(best->first) : nlohmann::json(nullptr);
          }
          // A plexus::tooling figure line (bench, figure, value, unit) with the fields above.
          // Plexus against a peer: the target is the best peer's busbw in the same run.
          nlohmann::json target = nullptr;
          std::optional<bool> met;
          if (job.impl == "plexus" && best) {
            target = best->second.busbw;
            met = row.busbw >= best->second.busbw;
          }
          const pt_tooling::Figure figure{op_name + " busbw", row.busbw, "GB/s", target, met, j};
          std::printf("%s\n", pt_tooling::FigureJson("collectives", figure).dump().c_str());
        } else {
          std::string vs;
          if (job.plexus && o.compare) {
            vs = std::isnan(ratio) ? "  n/a" : fmt::format("  {:6.2f}x {}", ratio, best->first);
          }
          std::printf("  %10zu %12zu %8s %6s %11.2f %12.3f %12.3f %7llu%s\n", row.bytes, row.count,
                      "float", redop, row.time_us, row.algbw, row.busbw,
                      static_cast<unsigned long long>(row.wrong), vs.c_str());
        }
      }
    }
  }
  if (!o.json && o.compare) {
    // One line per operation, transport and process count: the ratio column of the tables.
    std::printf(
        "#\n# summary: plexus busbw / best peer's busbw (>= 1.00: Plexus is at least as "
        "fast)\n");
    for (pb::Op op : o.ops) {
      for (const auto& [key, points] : samples) {
        const auto& [impl, op_name, transport, nprocs] = key;
        if ((impl != "plexus" && impl != "plexus_reno") || op_name != pb::OpName(op)) continue;
        std::string line =
            fmt::format("#   {}{} {} {} processes:", op_name,
                        impl == "plexus" ? "" : " (" + impl + ")", transport, nprocs);
        for (const auto& [bytes, point] : points) {
          const Row row = MakeRow(op, bytes, point, nprocs);
          const auto best = best_peer(op, transport, nprocs, bytes);
          line += best && best->second.busbw > 0
                      ? fmt::format("  {} {:.2f}x", pb::FormatBytes(bytes),
                                    row.busbw / best->second.busbw)
                      : fmt::format("  {} n/a", pb::FormatBytes(bytes));
        }
        std::printf("%s\n", line.c_str());
      }
    }
  }
  if (!o.json) {
    std::printf("#\n# load average at end %s\n", LoadAverage().c_str());
  }
  std::fflush(stdout);
  return all_ok;
}

}  // namespace plexus::bench
