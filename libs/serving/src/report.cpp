// ServeReport: building it from a run, and its text and JSON forms.
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/placement/network.hpp"
#include "plexus/placement/plan.hpp"

namespace plexus::serving {
namespace internal {

namespace {

// One failure as JSON, in the report and in the admin status alike.
base::json::Json FailureJson(const FailureReport& f) {
  return {{"worker", f.worker},
          {"killed_at_s", f.killed_at_s},
          {"detected_after_ms", f.detected_after_ms},
          {"replan_ms", f.replan_ms},
          {"redeploy_ms", f.redeploy_ms},
          {"moved", f.moved},
          {"retried", f.retried},
          {"cost_per_hour_after", f.cost_per_hour_after},
          {"recovered_after_s", f.recovered_after_s},
          {"error", f.error}};
}

int64_t MinInjected(const Topology& t, uint64_t mask, const std::vector<int64_t>& injected) {
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t s = 0; s < t.sources.size(); ++s) {
    if (mask & (uint64_t{1} << s)) least = std::min(least, injected[s]);
  }
  return least == std::numeric_limits<int64_t>::max() ? 0 : least;
}

}  // namespace

int64_t Expected(const Topology& t, int op, const std::vector<int64_t>& injected) {
  int64_t owed = 0;
  for (size_t i = 0; i < t.masks[op].size(); ++i) {
    const int64_t requests = MinInjected(t, t.masks[op][i], injected);
    bool whole = true;  // every ratio on the way a whole number: the same parts per request
    for (int e : t.chains[op][i]) whole = whole && t.ratio[e] == std::floor(t.ratio[e]);
    if (whole) {
      owed += requests * static_cast<int64_t>(t.Parts(op, i, 0));
      continue;
    }
    for (int64_t id = 0; id < requests; ++id) {
      owed += static_cast<int64_t>(t.Parts(op, i, static_cast<uint64_t>(id)));
    }
  }
  return owed;
}

std::vector<DropRecord> RequestDrops(const Topology& t, std::vector<DropRecord> drops,
                                     const std::vector<int64_t>& injected) {
  std::vector<DropRecord> out;
  for (DropRecord& d : drops) {
    // A join's inputs carry part of its sources; the request is the join's whole mask.
    const uint64_t mask = t.join[d.op] ? t.masks[d.op][0] : d.sources;
    if (static_cast<int64_t>(d.id) < MinInjected(t, mask, injected)) out.push_back(std::move(d));
  }
  return out;
}

LostParts LostFor(const Topology& t, int sink, const Collector::Sink& got,
                  const std::vector<DropRecord>& drops) {
  LostParts lost;
  for (const DropRecord& d : drops) {
    if (!t.reaches[d.op][sink]) continue;
    for (size_t i = 0; i < t.masks[sink].size(); ++i) {
      const uint64_t mask = t.masks[sink][i];
      if ((mask & d.sources) != d.sources) continue;
      // A join's input carries part of the join's mask, and no chain (BuildTopology).
      const int at = t.MaskIndex(d.op, d.sources);
      const size_t crossed = at < 0 ? 0 : t.chains[d.op][at].size();
      for (uint64_t part : t.Descendants(sink, i, crossed, d.id, d.part)) {
        if (!got.done.contains({mask, d.id, part})) lost[{mask, d.id}].insert(part);
      }
      break;
    }
  }
  return lost;
}

int64_t DroppedFor(const Topology& t, int sink, const Collector::Sink& got,
                   const std::vector<DropRecord>& drops) {
  int64_t count = 0;
  for (const auto& [request, parts] : LostFor(t, sink, got, drops)) {
    count += static_cast<int64_t>(parts.size());
  }
  return count;
}

double PercentileMs(const std::vector<int64_t>& sorted, double q, double compression) {
  if (sorted.empty()) return 0;
  const size_t index =
      std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size())));
  return static_cast<double>(sorted[index]) / 1e6 * compression;
}

void AddTimeline(const Topology& t, const ServeOptions& o, const Collector& collector,
                 int64_t start_ns, ServeReport& report) {
  double target = 0;
  for (size_t op = 0; op < t.problem.operators.size(); ++op) {
    if (t.sink[op]) target += t.problem.rate[op];
  }
  if (!(target > 0)) return;
  const double width = std::max(1.0, std::ceil(20 / target));
  const size_t buckets = static_cast<size_t>(std::ceil(o.duration_s / width));
  std::vector<std::vector<int64_t>> latency(buckets);
  for (const Collector::Sink& sink : collector.Sinks()) {
    for (const CompletionRecord& c : sink.completions) {
      const double at = static_cast<double>(c.done_ns - start_ns) / 1e9 * o.compression;
      const auto b = static_cast<int64_t>(std::floor(at / width));
      if (b < 0 || static_cast<size_t>(b) >= buckets) continue;
      latency[b].push_back(c.done_ns - c.injected_ns);
    }
  }
  for (size_t b = 0; b < buckets; ++b) {
    std::sort(latency[b].begin(), latency[b].end());
    TimelinePoint point;
    point.t_s = static_cast<double>(b) * width;
    point.completion_rate = static_cast<double>(latency[b].size()) / width;
    point.target_rate = target;
    point.latency_p50_ms = PercentileMs(latency[b], 0.50, o.compression);
    point.latency_p99_ms = PercentileMs(latency[b], 0.99, o.compression);
    report.timeline.push_back(point);
  }
  for (FailureReport& f : report.failures) {
    if (!f.error.empty()) continue;
    for (const TimelinePoint& point : report.timeline) {
      if (point.t_s >= f.killed_at_s && point.completion_rate >= 0.98 * target) {
        f.recovered_after_s = point.t_s + width - f.killed_at_s;
        break;
      }
    }
  }
}

std::string RunStatusJson(const RunStatus& status, const ServeOptions& o,
                          const Collector& collector) {
  const Topology& t = *status.topology;
  const placement::Problem& p = t.problem;
  base::json::Json out;
  out["scenario"] = p.name;
  out["plan_s"] = status.plan_s;
  out["epoch"] = status.epoch;
  out["halted"] = status.halted;
  out["plan"] = base::json::Json::parse(placement::PlanToJson(p, t.plan));
  out["injected"] = status.injected;
  out["completed"] = collector.Completions();
  std::vector<int64_t> latencies = collector.LatenciesNs();
  std::sort(latencies.begin(), latencies.end());
  out["latency_ms"] = {{"p50", PercentileMs(latencies, 0.50, o.compression)},
                       {"p99", PercentileMs(latencies, 0.99, o.compression)}};
  const Counters& now = status.now;
  const Counters& before = status.before;
  const double dt = before.processed.empty()
                        ? 0
                        : static_cast<double>(now.at_ns - before.at_ns) / 1e9 * o.compression;
  base::json::Json workers = base::json::Json::array();
  for (size_t w = 0; w < p.workers.size() && !now.processed.empty(); ++w) {
    if (!t.Serves(static_cast<int>(w))) continue;
    base::json::Json ops = base::json::Json::array();
    for (int op : t.worker_ops[w]) ops.push_back(p.operators[op].name);
    const int64_t done = now.processed[w];
    workers.push_back(
        {{"name", p.workers[w].name},
         {"operators", ops},
         {"queued", now.queue[w]},
         {"processed", done},
         {"rate", dt > 0 ? static_cast<double>(done - before.processed[w]) / dt : 0.0}});
  }
  out["workers"] = workers;
  base::json::Json failures = base::json::Json::array();
  for (const FailureReport& f : status.failures) failures.push_back(FailureJson(f));
  out["failures"] = failures;
  return out.dump();
}

ServeReport BuildReport(const Topology& t, const ServeOptions& o, const Collector& collector,
                        const RunFigures& run) {
  const placement::Problem& p = t.problem;
  ServeReport r;
  r.compression = o.compression;
  r.accuracy = t.plan.accuracy;
  r.measured_s = static_cast<double>(run.stop_ns - run.warm_ns) / 1e9 * o.compression;
  r.wall_s = static_cast<double>(run.end_ns - run.start_ns) / 1e9;
  for (int64_t n : run.injected) r.injected += n;

  const std::vector<DropRecord> drops = RequestDrops(t, collector.Drops(), run.injected);
  for (const DropRecord& d : drops) ++r.drops_by_reason[d.reason];
  const std::vector<Collector::Sink> sinks = collector.Sinks();
  std::vector<int64_t> latencies;
  r.throughput_ratio = std::numeric_limits<double>::infinity();
  for (size_t op = 0; op < p.operators.size(); ++op) {
    if (!t.sink[op]) continue;
    const Collector::Sink& got = sinks[op];
    SinkServeReport sink;
    sink.op = static_cast<int>(op);
    sink.target_rate = p.rate[op];
    sink.expected = Expected(t, sink.op, run.injected);
    sink.completed = static_cast<int64_t>(got.completions.size());
    sink.duplicates = got.duplicates;
    int64_t in_window = 0;
    for (const CompletionRecord& c : got.completions) {
      if (c.done_ns < run.warm_ns || c.done_ns > run.stop_ns) continue;
      ++in_window;
      latencies.push_back(c.done_ns - c.injected_ns);
    }
    sink.dropped = DroppedFor(t, sink.op, got, drops);
    sink.unfinished = std::max<int64_t>(0, sink.expected - sink.completed - sink.dropped);
    sink.achieved_rate = r.measured_s > 0 ? static_cast<double>(in_window) / r.measured_s : 0;
    r.throughput_ratio = std::min(r.throughput_ratio, sink.achieved_rate / sink.target_rate);
    r.completed += sink.completed;
    r.dropped += sink.dropped;
    r.duplicates += sink.duplicates;
    r.unfinished += sink.unfinished;
    r.sinks.push_back(sink);
  }
  if (r.sinks.empty()) r.throughput_ratio = 0;
  r.sustained = r.throughput_ratio >= 0.98;
  std::sort(latencies.begin(), latencies.end());
  r.latency_p50_ms = PercentileMs(latencies, 0.50, o.compression);
  r.latency_p90_ms = PercentileMs(latencies, 0.90, o.compression);
  r.latency_p99_ms = PercentileMs(latencies, 0.99, o.compression);

  // Bytes in the measured window per tier pair, and what they cost per plan hour.
  double cost = 0;
  const size_t workers = p.workers.size();
  for (size_t from = 0; from < run.at_stop.sent.size(); ++from) {
    // Rows past the workers are operators; only the sources' send.
    if (from >= workers && t.source_index[from - workers] < 0) continue;
    const placement::Position a =
        from < workers ? placement::WorkerPosition(p, static_cast<int>(from))
                       : placement::SourcePosition(p, static_cast<int>(from - workers));
    for (size_t to = 0; to < workers; ++to) {
      const uint64_t before = run.at_warm.sent.empty() ? 0 : run.at_warm.sent[from][to];
      const double bytes = static_cast<double>(run.at_stop.sent[from][to] - before);
      if (bytes <= 0) continue;
      const placement::Position b = placement::WorkerPosition(p, static_cast<int>(to));
      r.bytes_per_tier_pair[absl::StrCat(p.tiers[a.tier].name, "->", p.tiers[b.tier].name)] +=
          bytes;
      cost += bytes / placement::BytesPerGb(p) * placement::PricePerGb(p, a, b);
    }
  }
  // The bytes are those sent between the two polls, which a busy host may start late.
  const int64_t polled_ns = run.at_warm.sent.empty() ? run.at_stop.at_ns - run.start_ns
                                                     : run.at_stop.at_ns - run.at_warm.at_ns;
  const double polled_s = static_cast<double>(polled_ns) / 1e9 * o.compression;
  r.network_cost_per_hour = polled_s > 0 ? cost / polled_s * 3600 : 0;
  for (size_t w = 0; w < workers; ++w) {
    if (!t.Serves(static_cast<int>(w))) continue;
    WorkerServeReport worker;
    worker.worker = static_cast<int>(w);
    worker.operators = t.worker_ops[w];
    worker.servers = t.servers[w];
    worker.queue_at_end = run.at_stop.queue.empty() ? 0 : run.at_stop.queue[w];
    worker.processed = run.at_end.processed.empty() ? 0 : run.at_end.processed[w];
    r.compute_cost_per_hour += placement::WorkerPrice(p, static_cast<int>(w));
    r.workers.push_back(worker);
  }
  return r;
}

}  // namespace internal

std::string ServeSummary(const placement::Problem& problem, const ServeReport& r) {
  std::string out = absl::StrFormat(
      "served %.0f plan s measured (compression %g, %.1f wall s in all)\n"
      "throughput: %.1f%% of the target rate -> %s\n"
      "latency end to end: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms (plan time)\n"
      "requests: %d injected; messages at the sinks: %d completed, %d dropped, %d duplicated, "
      "%d unfinished\n"
      "cost: compute %.3f/h, network %.3f/h (from the bytes sent); accuracy %.2f\n",
      r.measured_s, r.compression, r.wall_s, 100 * r.throughput_ratio,
      r.sustained ? "sustained: yes" : "sustained: NO (below 98%)", r.latency_p50_ms,
      r.latency_p90_ms, r.latency_p99_ms, r.injected, r.completed, r.dropped, r.duplicates,
      r.unfinished, r.compute_cost_per_hour, r.network_cost_per_hour, r.accuracy);
  for (const SinkServeReport& s : r.sinks) {
    absl::StrAppendFormat(&out,
                          "  sink %-20s target %8.2f req/s, achieved %8.2f req/s; expected %d, "
                          "completed %d, dropped %d, unfinished %d, duplicates %d\n",
                          problem.operators[s.op].name, s.target_rate, s.achieved_rate, s.expected,
                          s.completed, s.dropped, s.unfinished, s.duplicates);
  }
  for (const auto& [reason, count] : r.drops_by_reason) {
    absl::StrAppendFormat(&out, "  dropped %d: %s\n", count, reason);
  }
  for (const FailureReport& f : r.failures) {
    if (!f.error.empty()) {
      absl::StrAppendFormat(&out,
                            "failure: worker '%s' killed at %.1f s, detected after %.0f ms; %s\n",
                            f.worker, f.killed_at_s, f.detected_after_ms, f.error);
      continue;
    }
    absl::StrAppendFormat(
        &out,
        "failure: worker '%s' killed at %.1f s, detected after %.0f ms, re-planned in %.1f ms, "
        "redeployed in %.0f ms (moved: %s; cost now %.3f/h), %d requests retried; full rate "
        "again %s\n",
        f.worker, f.killed_at_s, f.detected_after_ms, f.replan_ms, f.redeploy_ms,
        f.moved.empty() ? "nothing" : absl::StrJoin(f.moved, ", "), f.cost_per_hour_after,
        f.retried,
        f.recovered_after_s < 0 ? std::string("not within the run")
                                : absl::StrFormat("%.1f s after the kill", f.recovered_after_s));
  }
  if (r.retried_repeats > 0) {
    absl::StrAppendFormat(&out,
                          "  %d completions of retried requests that a sink had already: ignored\n",
                          r.retried_repeats);
  }
  return out;
}

std::string ServeToJson(const placement::Problem& problem, const ServeReport& r) {
  base::json::Json root;
  root["measured_s"] = r.measured_s;
  root["wall_s"] = r.wall_s;
  root["compression"] = r.compression;
  root["accuracy"] = r.accuracy;
  root["throughput_ratio"] = r.throughput_ratio;
  root["sustained"] = r.sustained;
  root["latency_ms"] = {
      {"p50", r.latency_p50_ms}, {"p90", r.latency_p90_ms}, {"p99", r.latency_p99_ms}};
  base::json::Json sinks = base::json::Json::array();
  for (const SinkServeReport& s : r.sinks) {
    sinks.push_back({{"operator", problem.operators[s.op].name},
                     {"target_rate", s.target_rate},
                     {"achieved_rate", s.achieved_rate},
                     {"expected", s.expected},
                     {"completed", s.completed},
                     {"dropped", s.dropped},
                     {"unfinished", s.unfinished},
                     {"duplicates", s.duplicates}});
  }
  root["sinks"] = sinks;
  base::json::Json workers = base::json::Json::array();
  for (const WorkerServeReport& w : r.workers) {
    base::json::Json ops = base::json::Json::array();
    for (int op : w.operators) ops.push_back(problem.operators[op].name);
    workers.push_back({{"name", problem.workers[w.worker].name},
                       {"operators", ops},
                       {"servers", w.servers},
                       {"queue_at_end", w.queue_at_end},
                       {"processed", w.processed}});
  }
  root["workers"] = workers;
  root["bytes_per_tier_pair"] = r.bytes_per_tier_pair;
  root["network_cost_per_hour"] = r.network_cost_per_hour;
  root["compute_cost_per_hour"] = r.compute_cost_per_hour;
  root["requests"] = {{"injected", r.injected},
                      {"completed", r.completed},
                      {"dropped", r.dropped},
                      {"duplicates", r.duplicates},
                      {"unfinished", r.unfinished}};
  root["drops_by_reason"] = r.drops_by_reason;
  base::json::Json failures = base::json::Json::array();
  for (const FailureReport& f : r.failures) failures.push_back(internal::FailureJson(f));
  root["failures"] = failures;
  root["retried"] = r.retried;
  root["retried_repeats"] = r.retried_repeats;
  base::json::Json timeline = base::json::Json::array();
  for (const TimelinePoint& t : r.timeline) {
    timeline.push_back({{"t_s", t.t_s},
                        {"completion_rate", t.completion_rate},
                        {"target_rate", t.target_rate},
                        {"p50_ms", t.latency_p50_ms},
                        {"p99_ms", t.latency_p99_ms}});
  }
  root["timeline"] = timeline;
  return root.dump(1);
}

}  // namespace plexus::serving
