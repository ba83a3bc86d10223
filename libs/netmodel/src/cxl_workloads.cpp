#include "plexus/netmodel/cxl_workloads.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "plexus/base/names.hpp"

namespace plexus::netmodel::cxl {
namespace {

constexpr std::string_view kYcsbNames[] = {"a", "b", "c", "f"};
constexpr int kRing = 8;

absl::Status NeedK4(const Fabric& fabric, const char* what) {
  if (fabric.k() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": needs the seed's 16-device fabric (a k = 4 fat-tree), got k = ", fabric.k()));
  }
  return absl::OkStatus();
}

int64_t Scaled(double bytes, double scale) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(bytes / scale)));
}

}  // namespace

absl::StatusOr<LlmWorkload> LlmInference(const Fabric& fabric, const LlmSpec& spec) {
  if (absl::Status s = NeedK4(fabric, "LLM inference"); !s.ok()) return s;
  if (spec.runs < 1 || !(spec.scale >= 1) || spec.unit_bytes < 1 || spec.units < 1 ||
      !(spec.partition_bytes > 0) || !(spec.compute_gap_ns >= 0)) {
    return absl::InvalidArgumentError(
        "LLM inference: runs, units and unit_bytes must be >= 1, scale >= 1, partition_bytes > 0, "
        "compute_gap_ns >= 0");
  }
  std::vector<FanId> acc, mem;
  for (int n : fabric.devices()) {
    const FanId id = fabric.node(n).id;
    (id.device == 2 ? acc : mem).push_back(id);
  }
  const int64_t stripe = Scaled(spec.partition_bytes / kRing, spec.scale);
  const int64_t chunk =
      Scaled(static_cast<double>(spec.unit_bytes) * spec.units / kRing, spec.scale);
  const double gap = spec.compute_gap_ns / spec.scale;
  LlmWorkload w;
  std::vector<int> previous;   // the previous phase's transfers (a barrier)
  std::vector<int> run_start;  // overlapping phases: the previous run's transfers
  int phase_in_run = 0;
  const auto begin = [&](Transfer t) {
    if (spec.overlap_phases) {
      // Phase k of a run starts k gaps after the run does; a run starts a gap after the
      // previous run's last transfer.
      if (run_start.empty()) {
        t.start_ns = phase_in_run * gap;
      } else {
        t.after = run_start;
        t.gap_ns = (phase_in_run + 1) * gap;
      }
      return t;
    }
    t.after = previous;
    t.gap_ns = previous.empty() ? 0 : gap;
    return t;
  };
  for (int run = 0; run < spec.runs; ++run) {
    phase_in_run = 0;
    if (spec.overlap_phases && run > 0) {
      run_start.clear();
      for (int t = run == 1 ? 0 : w.run_end[run - 2]; t < w.run_end[run - 1]; ++t) {
        run_start.push_back(t);
      }
    }
    for (int phase = 0; phase < 2; ++phase) {
      std::vector<int> load;
      for (const FanId& a : acc) {
        for (const FanId& m : mem) {
          Transfer t;
          t.src = a;
          t.dst = m;
          t.op = Op::kRead;
          t.bytes = stripe;
          load.push_back(static_cast<int>(w.transfers.size()));
          w.transfers.push_back(begin(std::move(t)));
        }
      }
      ++phase_in_run;
      previous = load;
      std::vector<int> step(kRing), next(kRing);
      for (int s = 0; s < 2 * (kRing - 1); ++s) {
        for (int i = 0; i < kRing; ++i) {
          Transfer t;
          t.src = acc[i];
          t.dst = acc[(i + 1) % kRing];
          t.op = Op::kUio;
          t.bytes = chunk;
          if (s == 0) {
            t = begin(std::move(t));
          } else {
            t.after = {step[i], step[(i + kRing - 1) % kRing]};
          }
          next[i] = static_cast<int>(w.transfers.size());
          w.transfers.push_back(std::move(t));
        }
        step = next;
      }
      ++phase_in_run;
      previous = step;
    }
    w.run_end.push_back(static_cast<int>(w.transfers.size()));
  }
  return w;
}

std::vector<double> LlmRunTimes(const LlmWorkload& w, const SimResult& r) {
  std::vector<double> out;
  double prev = 0;
  int from = 0;
  for (int end : w.run_end) {
    double last = prev;
    for (int t = from; t < end; ++t) last = std::max(last, r.finish_ns[t]);
    out.push_back(last - prev);
    prev = last;
    from = end;
  }
  return out;
}

std::string_view YcsbName(Ycsb w) { return base::NameAt(static_cast<size_t>(w), kYcsbNames); }

absl::StatusOr<Ycsb> ParseYcsb(std::string_view name) {
  return base::ParseName<Ycsb>(name, kYcsbNames, "YCSB workload");
}

absl::StatusOr<YcsbWorkload> YcsbWorkloadFor(const Fabric& fabric, const YcsbSpec& spec) {
  if (absl::Status s = NeedK4(fabric, "YCSB"); !s.ok()) return s;
  if (spec.ops_per_cpu < 1 || spec.keys < 1 || !(spec.zipf_theta >= 0) || spec.record_bytes < 1 ||
      !(spec.mean_interarrival_ns > 0) || !(spec.memory_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        "YCSB: ops_per_cpu, keys and record_bytes must be >= 1, zipf_theta >= 0, "
        "mean_interarrival_ns and memory_bytes_per_s > 0");
  }
  std::vector<FanId> cpus, mems;
  for (int n : fabric.devices()) {
    const FanId id = fabric.node(n).id;
    (id.sw == 0 && id.device == 2 ? cpus : mems).push_back(id);
  }
  YcsbWorkload w;
  for (const FanId& m : mems) w.device_rates.push_back({m, spec.memory_bytes_per_s});
  // Zipf over keys: P(k) proportional to 1 / (k + 1)^theta, by inverse CDF.
  std::vector<double> cdf(spec.keys);
  double sum = 0;
  for (int k = 0; k < spec.keys; ++k) {
    sum += 1.0 / std::pow(k + 1.0, spec.zipf_theta);
    cdf[k] = sum;
  }
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::exponential_distribution<double> gap(1.0 / spec.mean_interarrival_ns);
  const double write_share = spec.workload == Ycsb::kA   ? 0.5
                             : spec.workload == Ycsb::kB ? 0.05
                             : spec.workload == Ycsb::kC ? 0
                                                         : 0.5;
  const auto add = [&](FanId src, FanId dst, Op op, int64_t bytes, double start,
                       std::vector<int> after) {
    Transfer t;
    t.src = src;
    t.dst = dst;
    t.op = op;
    t.bytes = bytes;
    t.start_ns = start;
    t.after = std::move(after);
    w.transfers.push_back(std::move(t));
    return static_cast<int>(w.transfers.size()) - 1;
  };
  for (size_t c = 0; c < cpus.size(); ++c) {
    double now = 0;
    for (int op = 0; op < spec.ops_per_cpu; ++op) {
      now += gap(rng);
      const double u = uniform(rng) * sum;
      const int key = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const FanId mem = mems[std::min(key, spec.keys - 1) % mems.size()];
      const bool write = uniform(rng) < write_share;
      YcsbWorkload::OpRecord rec{now, 0, write};
      if (!write) {
        rec.last = add(cpus[c], mem, Op::kRead, spec.record_bytes, now, {});
      } else {
        std::vector<int> after;
        if (spec.workload == Ycsb::kF) {
          after = {add(cpus[c], mem, Op::kRead, spec.record_bytes, now, {})};
        }
        rec.last = add(cpus[c], mem, Op::kWrite, spec.record_bytes, now, std::move(after));
        for (size_t other = 0; other < cpus.size(); ++other) {
          if (other == c) continue;
          add(mem, cpus[other], Op::kWrite, 64, now, {rec.last});
          ++w.invalidations;
        }
      }
      w.ops.push_back(rec);
    }
  }
  return w;
}

std::vector<double> YcsbLatencies(const YcsbWorkload& w, const SimResult& r) {
  std::vector<double> out;
  out.reserve(w.ops.size());
  for (const auto& op : w.ops) out.push_back(r.finish_ns[op.last] - op.start_ns);
  return out;
}

}  // namespace plexus::netmodel::cxl
