// Discrete-event serving simulator (see simulator.hpp and docs/placement.md).
#include "plexus/placement/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <random>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement {
namespace {

using internal::Position;
using internal::SourcePosition;
using internal::WorkerPosition;

struct Job {
  int op;
  double birth;    // earliest source injection among the requests it carries
  int64_t id = 0;  // the request: its source's injection number (a join pairs inputs by it)
};

struct Event {
  enum Kind : uint8_t { kInject, kArrive, kDone } kind;
  double time;
  uint64_t sequence;
  int op;      // inject: source; arrive/done: operator
  int worker;  // arrive/done
  double birth;
  int64_t ordinal;  // arrive at a join: tuple number; done: server slot unused
  double started;   // done: service start
  int64_t id = 0;   // the request (Job::id)
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct WorkerState {
  int servers = 1;
  int busy = 0;
  std::deque<Job> queue;
  double busy_time = 0;
  std::vector<int> operators;
};

struct JoinSlot {
  int worker = -1;
  int arrived = 0;
  double birth = 0;
};

class Simulation {
 public:
  Simulation(const Problem& problem, const Plan& plan, const SimulationOptions& options)
      : p_(problem), plan_(plan), o_(options), random_(options.seed) {}

  absl::StatusOr<SimulationReport> Run() {
    const size_t n = p_.operators.size();
    workers_.assign(p_.workers.size(), {});
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      const Tier& tier = p_.tiers[p_.workers[w].tier];
      workers_[w].servers = tier.replicated ? tier.locations : 1;
    }
    fits_.assign(n, std::vector<ServiceTime>(p_.workers.size()));
    round_robin_.assign(n, {});
    for (size_t op = 0; op < n; ++op) {
      for (const WorkerShare& w : plan_.workers[op]) {
        const auto& profile = p_.latency[op][plan_.variant[op]][p_.workers[w.worker].type];
        fits_[op][w.worker] = ServiceTime::Fit(*profile);
        workers_[w.worker].operators.push_back(static_cast<int>(op));
      }
      round_robin_[op].assign(plan_.workers[op].size(), 0);
    }
    fraction_.assign(p_.edges.size(), 0);
    edge_ordinal_.assign(p_.edges.size(), 0);
    joins_.assign(n, {});
    injected_.assign(n, 0);
    // A join pairs the inputs of one request (by id) unless an edge with rate_ratio != 1 lies
    // above it, where a request becomes several messages: then the k-th message of each input.
    std::vector<bool> fanned(n, false);
    by_id_.assign(n, true);
    for (int op : p_.topological_order) {
      for (int e : p_.in_edges[op]) {
        if (p_.edges[e].rate_ratio != 1 || fanned[p_.edges[e].from]) fanned[op] = true;
      }
      by_id_[op] = !fanned[op];
    }
    completions_.assign(n, 0);

    for (size_t op = 0; op < n; ++op) {
      if (p_.operators[op].kind == OperatorKind::kSource) {
        Push({Event::kInject, NextArrival(static_cast<int>(op), 0), 0, static_cast<int>(op), -1, 0,
              0, 0});
      }
    }
    while (!events_.empty()) {
      Event event = events_.top();
      events_.pop();
      if (event.time > o_.duration_s) break;
      if (++report_.events > o_.max_events) {
        return absl::ResourceExhaustedError(
            absl::StrCat("simulation stopped after ", o_.max_events,
                         " events: shorten duration_s or raise max_events"));
      }
      now_ = event.time;
      switch (event.kind) {
        case Event::kInject:
          Inject(event);
          break;
        case Event::kArrive:
          Arrive(event);
          break;
        case Event::kDone:
          Done(event);
          break;
      }
    }
    return Finish();
  }

 private:
  void Push(Event event) {
    event.sequence = sequence_++;
    events_.push(event);
  }

  double NextArrival(int source, double now) {
    const double rate = p_.rate[source];
    if (o_.poisson_arrivals) return now + std::exponential_distribution<double>(rate)(random_);
    return now + 1.0 / rate;
  }

  bool Measured(double time) const { return time >= o_.warmup_s && time <= o_.duration_s; }

  void Inject(const Event& event) {
    Emit(event.op, now_, SourcePosition(p_, event.op), injected_[event.op]++);
    Push({Event::kInject, NextArrival(event.op, now_), 0, event.op, -1, 0, 0, 0});
  }

  // Smooth weighted round robin: deterministic routing that follows the shares closely.
  int Route(int op) {
    auto& current = round_robin_[op];
    const auto& workers = plan_.workers[op];
    size_t best = 0;
    for (size_t i = 0; i < workers.size(); ++i) {
      current[i] += workers[i].share;
      if (current[i] > current[best]) best = i;
    }
    current[best] -= 1.0;
    return workers[best].worker;
  }

  // Sends the outputs of one request of `op` (processed at `from`) along its outgoing edges.
  void Emit(int op, double birth, Position from, int64_t id) {
    for (int e : p_.out_edges[op]) {
      const Edge& edge = p_.edges[e];
      fraction_[e] += edge.rate_ratio;
      const int count = static_cast<int>(std::floor(fraction_[e] + 1e-9));
      fraction_[e] -= count;
      const int child = edge.to;
      const bool join =
          p_.operators[child].combine == Combine::kJoin && p_.in_edges[child].size() > 1;
      const double bytes = internal::BytesPerKb(p_) *
                           internal::MessageKb(p_, e, plan_.variant[op], plan_.variant[child]);
      for (int k = 0; k < count; ++k) {
        int worker;
        int64_t ordinal = -1;
        if (join) {
          ordinal = by_id_[child] ? id : edge_ordinal_[e]++;
          JoinSlot& slot = joins_[child][ordinal];
          if (slot.worker < 0) {
            slot.worker = Route(child);
            slot.birth = birth;
          }
          worker = slot.worker;
        } else {
          worker = Route(child);
        }
        const Position to = WorkerPosition(p_, worker);
        bool downwards = false;
        const Link* link = internal::LinkBetween(p_, from, to, &downwards);
        double delay = 0;
        if (link != nullptr) {
          delay = link->latency_ms / 1000.0;
          if (link->bandwidth_gbps > 0) delay += bytes * 8 / (link->bandwidth_gbps * 1e9);
        }
        if (Measured(now_)) {
          const std::string key =
              absl::StrCat(p_.tiers[from.tier].name, "->", p_.tiers[to.tier].name);
          report_.bytes_per_tier_pair[key] += bytes;
          measured_network_cost_ +=
              bytes / internal::BytesPerGb(p_) * internal::PricePerGb(p_, from, to);
        }
        Push({Event::kArrive, now_ + delay, 0, child, worker, birth, ordinal, 0, id});
      }
    }
  }

  void Arrive(const Event& event) {
    double birth = event.birth;
    if (event.ordinal >= 0) {
      auto& slots = joins_[event.op];
      auto it = slots.find(event.ordinal);
      JoinSlot& slot = it->second;
      slot.birth = std::min(slot.birth, event.birth);
      if (++slot.arrived < static_cast<int>(p_.in_edges[event.op].size())) return;
      birth = slot.birth;
      slots.erase(it);
    }
    WorkerState& worker = workers_[event.worker];
    if (worker.busy < worker.servers) {
      Start(event.worker, {event.op, birth, event.id});
    } else {
      worker.queue.push_back({event.op, birth, event.id});
    }
  }

  void Start(int worker, const Job& job) {
    ++workers_[worker].busy;
    const double service = fits_[job.op][worker].Draw(random_, normal_);
    Push({Event::kDone, now_ + service, 0, job.op, worker, job.birth, -1, now_, job.id});
  }

  void Done(const Event& event) {
    WorkerState& worker = workers_[event.worker];
    --worker.busy;
    const double begin = std::max(event.started, o_.warmup_s);
    const double end = std::min(now_, o_.duration_s);
    if (end > begin) worker.busy_time += end - begin;
    if (p_.out_edges[event.op].empty()) {
      if (Measured(now_)) {
        ++completions_[event.op];
        latencies_.push_back(now_ - event.birth);
      }
    } else {
      Emit(event.op, event.birth, WorkerPosition(p_, event.worker), event.id);
    }
    if (!worker.queue.empty()) {
      const Job next = worker.queue.front();
      worker.queue.pop_front();
      Start(event.worker, next);
    }
  }

  absl::StatusOr<SimulationReport> Finish() {
    const double measured = o_.duration_s - o_.warmup_s;
    report_.measured_s = measured;
    report_.throughput_ratio = internal::kInfinity;
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (p_.operators[op].kind == OperatorKind::kSource || !p_.out_edges[op].empty()) continue;
      SinkReport sink;
      sink.op = static_cast<int>(op);
      sink.target_rate = p_.rate[op];
      sink.achieved_rate = static_cast<double>(completions_[op]) / measured;
      report_.throughput_ratio =
          std::min(report_.throughput_ratio, sink.achieved_rate / sink.target_rate);
      report_.sinks.push_back(sink);
    }
    report_.sustained = report_.throughput_ratio >= 0.98;
    std::sort(latencies_.begin(), latencies_.end());
    auto percentile = [&](double q) {
      if (latencies_.empty()) return 0.0;
      const size_t index = std::min(
          latencies_.size() - 1, static_cast<size_t>(q * static_cast<double>(latencies_.size())));
      return latencies_[index] * 1000;
    };
    report_.latency_p50_ms = percentile(0.50);
    report_.latency_p90_ms = percentile(0.90);
    report_.latency_p99_ms = percentile(0.99);
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      if (workers_[w].operators.empty()) continue;
      WorkerReport worker;
      worker.worker = static_cast<int>(w);
      worker.operators = workers_[w].operators;
      worker.planned_utilisation =
          plan_.worker_utilisation.empty() ? 0 : plan_.worker_utilisation[w];
      worker.utilisation = workers_[w].busy_time / (measured * workers_[w].servers);
      worker.queue_at_end = static_cast<int64_t>(workers_[w].queue.size()) + workers_[w].busy;
      report_.compute_cost_per_hour += WorkerPrice(p_, static_cast<int>(w));
      report_.workers.push_back(worker);
    }
    report_.network_cost_per_hour = measured_network_cost_ / measured * internal::kSecondsPerHour;
    return report_;
  }

  const Problem& p_;
  const Plan& plan_;
  const SimulationOptions& o_;
  std::mt19937_64 random_;
  std::normal_distribution<double> normal_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t sequence_ = 0;
  double now_ = 0;
  std::vector<WorkerState> workers_;
  std::vector<std::vector<ServiceTime>> fits_;
  std::vector<std::vector<double>> round_robin_;
  std::vector<double> fraction_;
  std::vector<int64_t> edge_ordinal_;
  std::vector<int64_t> injected_;  // per source operator
  std::vector<bool> by_id_;        // per operator: a join pairs its inputs by request id
  std::vector<std::unordered_map<int64_t, JoinSlot>> joins_;
  std::vector<int64_t> completions_;
  std::vector<double> latencies_;
  double measured_network_cost_ = 0;
  SimulationReport report_;
};

}  // namespace

ServiceTime ServiceTime::Fit(const LatencyProfile& profile) {
  ServiceTime fit;
  fit.mu = std::log(profile.p50 / 1000.0);
  const double s75 = std::log(profile.p75 / profile.p50) / 0.6744897501960817;
  const double s90 = std::log(profile.p90 / profile.p50) / 1.2815515655446004;
  fit.sigma = std::max(0.0, (s75 + s90) / 2);
  return fit;
}

double ServiceTime::Draw(std::mt19937_64& random, std::normal_distribution<double>& normal) const {
  if (sigma > 0) return std::exp(mu + sigma * normal(random));
  return std::exp(mu);
}

absl::StatusOr<SimulationReport> Simulate(const Problem& problem, const Plan& plan,
                                          const SimulationOptions& options) {
  if (!(options.duration_s > 0) || !(options.warmup_s >= 0) ||
      options.warmup_s >= options.duration_s) {
    return absl::InvalidArgumentError(
        "simulation needs duration_s > 0 and 0 <= warmup_s < duration_s");
  }
  if (options.max_events < 1) return absl::InvalidArgumentError("max_events must be >= 1");
  Plan checked = plan;
  PLEXUS_RETURN_IF_ERROR(EvaluatePlan(problem, checked));
  return Simulation(problem, checked, options).Run();
}

std::string SimulationSummary(const Problem& problem, const SimulationReport& report) {
  std::string out = absl::StrFormat(
      "simulated %.0f s (after warm-up), %d events\n"
      "throughput: %.1f%% of the target rate -> %s\n"
      "latency end to end: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms\n"
      "cost: compute %.3f/h, network %.3f/h (from the bytes carried)\n",
      report.measured_s, report.events, 100 * report.throughput_ratio,
      report.sustained ? "sustained: yes" : "sustained: NO (below 98%)", report.latency_p50_ms,
      report.latency_p90_ms, report.latency_p99_ms, report.compute_cost_per_hour,
      report.network_cost_per_hour);
  for (const SinkReport& sink : report.sinks) {
    absl::StrAppendFormat(&out, "  sink %-20s target %8.2f req/s, achieved %8.2f req/s\n",
                          problem.operators[sink.op].name, sink.target_rate, sink.achieved_rate);
  }
  absl::StrAppendFormat(&out, "  %-24s %-10s %9s %9s %7s  %s\n", "worker", "tier", "planned",
                        "measured", "queued", "operators");
  for (const WorkerReport& w : report.workers) {
    std::string ops;
    for (int op : w.operators)
      absl::StrAppend(&ops, ops.empty() ? "" : ",", problem.operators[op].name);
    const bool over = w.planned_utilisation > 1 + 1e-9;
    absl::StrAppendFormat(
        &out, "  %-24s %-10s %8.1f%% %8.1f%% %7d  %s%s\n", problem.workers[w.worker].name,
        problem.tiers[problem.workers[w.worker].tier].name, 100 * w.planned_utilisation,
        100 * w.utilisation, w.queue_at_end, ops, over ? "  <- OVER-COMMITTED" : "");
  }
  absl::StrAppend(&out, "  bytes per tier pair:");
  for (const auto& [pair, bytes] : report.bytes_per_tier_pair) {
    absl::StrAppendFormat(&out, " %s %.3g GB;", pair, bytes / 1e9);
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string SimulationToJson(const Problem& problem, const SimulationReport& report) {
  base::json::Json root;
  root["measured_s"] = report.measured_s;
  root["throughput_ratio"] = report.throughput_ratio;
  root["sustained"] = report.sustained;
  root["latency_ms"] = {{"p50", report.latency_p50_ms},
                        {"p90", report.latency_p90_ms},
                        {"p99", report.latency_p99_ms}};
  base::json::Json sinks = base::json::Json::array();
  for (const SinkReport& sink : report.sinks) {
    sinks.push_back({{"operator", problem.operators[sink.op].name},
                     {"target_rate", sink.target_rate},
                     {"achieved_rate", sink.achieved_rate}});
  }
  root["sinks"] = sinks;
  base::json::Json workers = base::json::Json::array();
  for (const WorkerReport& w : report.workers) {
    base::json::Json ops = base::json::Json::array();
    for (int op : w.operators) ops.push_back(problem.operators[op].name);
    workers.push_back({{"name", problem.workers[w.worker].name},
                       {"operators", ops},
                       {"planned_utilisation", w.planned_utilisation},
                       {"utilisation", w.utilisation},
                       {"queue_at_end", w.queue_at_end},
                       {"over_committed", w.planned_utilisation > 1 + 1e-9}});
  }
  root["workers"] = workers;
  root["bytes_per_tier_pair"] = report.bytes_per_tier_pair;
  root["network_cost_per_hour"] = report.network_cost_per_hour;
  root["compute_cost_per_hour"] = report.compute_cost_per_hour;
  root["events"] = report.events;
  return root.dump(1);
}

}  // namespace plexus::placement
