// The serving runtime's driver (serve.hpp): starts one WorkerNode per serving worker, injects the
// sources' requests, polls the workers' counters, drains, stops everything and reports.
#include "plexus/serving/serve.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deployment.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/device.hpp"
#include "recovery.hpp"
#include "report.hpp"
#include "topology.hpp"
#include "worker.hpp"

namespace plexus::serving {

using internal::NowNs;

absl::Status CheckServable(const placement::Problem& problem, const placement::Plan& plan,
                           const ServeOptions& options) {
  return internal::BuildTopology(problem, plan, options).status();
}

namespace internal {
namespace {

constexpr int64_t kSecondNs = 1'000'000'000;

absl::Status CheckOptions(const ServeOptions& o) {
  if (!(o.duration_s > 0) || !(o.warmup_s >= 0) || o.warmup_s >= o.duration_s) {
    return absl::InvalidArgumentError(
        "ServeOptions: needs duration_s > 0 and 0 <= warmup_s < duration_s");
  }
  if (!(o.compression > 0) || !std::isfinite(o.compression)) {
    return absl::InvalidArgumentError("ServeOptions::compression must be a positive number");
  }
  if (!(o.spike.factor > 0) || !std::isfinite(o.spike.factor) || !(o.spike.at_s >= 0) ||
      !(o.spike.duration_s >= 0)) {
    return absl::InvalidArgumentError(
        "ServeOptions::spike: needs factor > 0, at_s >= 0 and duration_s >= 0");
  }
  if (!(o.join_timeout_s > 0) || !(o.drain_timeout_s >= 0) || o.max_join_pending < 1) {
    return absl::InvalidArgumentError(
        "ServeOptions: needs join_timeout_s > 0, drain_timeout_s >= 0, max_join_pending >= 1");
  }
  if (!o.hosts.empty() && o.wire != Wire::kTcp) {
    return absl::InvalidArgumentError(
        "ServeOptions::hosts: workers in other processes need wire kTcp (inproc stays in one "
        "process)");
  }
  if (!o.hosts.empty() && !o.operators.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ServeOptions::operators ('", o.operators.begin()->first,
        "'): with hosts, real operators run in the host processes (HostOptions::operators)"));
  }
  return absl::OkStatus();
}

class Driver {
 public:
  Driver(std::shared_ptr<const Topology> topology, const ServeOptions& options)
      : t0_(topology), t_(std::move(topology)), p_(t0_->problem), o_(options), collector_(*t0_) {
    redeploy_options_ = o_;
    redeploy_options_.failures.clear();
    dead_.assign(p_.workers.size(), false);
    last_seen_.assign(p_.workers.size(), {});
    misses_.assign(p_.workers.size(), 0);
    for (const WorkerFailure& f : o_.failures) {
      kills_.push_back({f.at_s, p_.FindWorker(f.worker)});
    }
    std::sort(kills_.begin(), kills_.end());
  }
  ~Driver() { Teardown(); }

  absl::StatusOr<ServeReport> Run() {
    PLEXUS_RETURN_IF_ERROR(Setup());
    start_ns_ = NowNs();
    if (o_.admin != nullptr) {
      o_.admin->Handle("serving",
                       "the serving run: deployed plan, per-worker queues and rates, requests, "
                       "latency, failures",
                       [this](const base::admin::AdminRequest& r) { return AdminStatus(r); });
    }
    Inject();
    Drain();
    if (o_.admin != nullptr) o_.admin->Remove("serving");
    const int64_t end_ns = NowNs();
    const Counters at_end = Poll();
    Teardown();
    RunFigures figures{start_ns_, warm_ns_, stop_ns_, end_ns,
                       injected_, at_warm_, at_stop_, at_end};
    ServeReport report = BuildReport(*t_, o_, collector_, figures);
    report.retried_repeats = collector_.RetriedRepeats();
    for (const FailureReport& f : failures_) report.retried += f.retried;
    report.failures = failures_;
    AddTimeline(*t_, o_, collector_, start_ns_, report);
    return report;
  }

 private:
  struct Kill {
    double at_s = 0;
    int worker = -1;
    bool operator<(const Kill& o) const { return at_s < o.at_s; }
  };

  absl::Status Setup() {
    PLEXUS_ASSIGN_OR_RETURN(device_, NewDevice(o_.wire, o_.address));
    PLEXUS_ASSIGN_OR_RETURN(collector_server_, rpc::Server::Create(device_));
    PLEXUS_RETURN_IF_ERROR(collector_server_->Register(&collector_, {"Complete", "Dropped"}));
    PLEXUS_RETURN_IF_ERROR(collector_server_->Start());
    relay_ = std::make_unique<Relay>(device_);
    return Deploy();
  }

  // Starts the workers of t_ in deployment epoch_, and the sources' routers.
  absl::Status Deploy() {
    PLEXUS_ASSIGN_OR_RETURN(
        deployment_, Deployment::Start(t_, o_, epoch_, collector_server_->address(), *relay_));
    routers_.clear();
    routers_.resize(p_.edges.size());
    for (int op : t_->sources) {
      for (int e : p_.out_edges[op]) {
        PLEXUS_ASSIGN_OR_RETURN(
            routers_[e],
            Router::Create(t_->op_shares[p_.edges[e].to], o_.balance == Balance::kDaronpon,
                           o_.seed * 17 + static_cast<uint64_t>(e) + epoch_,
                           t_->op_costs[p_.edges[e].to]));
      }
    }
    return absl::OkStatus();
  }

  // What every worker and the driver have sent so far, and the workers' queues; counters of
  // replaced deployments included. `failed` (optional) gets the serving workers that did not
  // answer within the failure timeout.
  Counters Poll(std::vector<int>* failed = nullptr) {
    Counters c;
    c.at_ns = NowNs();
    c.sent.assign(p_.workers.size() + p_.operators.size(),
                  std::vector<uint64_t>(p_.workers.size(), 0));
    c.queue.assign(p_.workers.size(), 0);
    c.processed.assign(p_.workers.size(), 0);
    const std::vector<absl::StatusOr<WorkerCounters>> answers =
        deployment_ ? deployment_->Ask(*relay_, absl::Seconds(o_.failure_timeout_s), dead_)
                    : std::vector<absl::StatusOr<WorkerCounters>>();
    for (size_t w = 0; w < answers.size(); ++w) {
      if (deployment_->address(static_cast<int>(w)).empty() || dead_[w]) continue;
      if (!answers[w].ok()) {
        // A refused or broken connection is a failure at once; a late answer twice in a row
        // (once may be a loaded host).
        const bool late = absl::IsDeadlineExceeded(answers[w].status());
        if (failed != nullptr && (!late || ++misses_[w] >= 2)) failed->push_back(w);
        continue;
      }
      misses_[w] = 0;
      last_seen_[w] = *answers[w];
      c.queue[w] = answers[w]->queued;
      c.processed[w] = answers[w]->processed;
      for (size_t d = 0; d < answers[w]->sent.size(); ++d) c.sent[w][d] = answers[w]->sent[d];
    }
    for (size_t w = 0; w < retired_.size(); ++w) {
      c.processed[w] += retired_[w].processed;
      for (size_t d = 0; d < retired_[w].sent.size(); ++d) c.sent[w][d] += retired_[w].sent[d];
    }
    std::lock_guard<std::mutex> lock(source_mu_);
    for (size_t s = 0; s < t_->sources.size(); ++s) {
      c.sent[p_.workers.size() + t_->sources[s]] = source_sent_[s];
    }
    return c;
  }

  // The latest health check's counters, for the admin command: per-worker rates over it.
  void Remember(const Counters& c) {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (!status_now_.processed.empty()) status_before_ = std::move(status_now_);
    status_now_ = c;
  }

  // The admin command "serving" (no arguments).
  absl::StatusOr<std::string> AdminStatus(const base::admin::AdminRequest& request) {
    PLEXUS_RETURN_IF_ERROR(base::admin::CheckArgs(request, {}));
    RunStatus status;
    {
      std::lock_guard<std::mutex> lock(deploy_mu_);
      status.topology = t_;
      status.epoch = epoch_;
      status.halted = halted_;
      status.failures = failures_;
      for (int64_t n : injected_) status.injected += n;
    }
    status.plan_s = static_cast<double>(NowNs() - start_ns_) / kSecondNs * o_.compression;
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      status.before = status_before_;
      status.now = status_now_;
    }
    return RunStatusJson(status, o_, collector_);
  }

  void Report(bool draining) {
    if (!o_.progress) return;
    ServeProgress progress;
    const int64_t now = NowNs();
    progress.plan_s = static_cast<double>(now - start_ns_) / kSecondNs * o_.compression;
    progress.draining = draining;
    const int64_t completions = collector_.Completions();
    const double interval_s =
        static_cast<double>(now - last_progress_ns_) / kSecondNs * o_.compression;
    progress.completion_rate =
        interval_s > 0 ? static_cast<double>(completions - last_completions_) / interval_s : 0;
    last_progress_ns_ = now;
    last_completions_ = completions;
    const Counters c = Poll();
    for (int64_t q : c.queue) progress.queued += q;
    std::vector<int64_t> latencies = collector_.LatenciesNs();
    std::sort(latencies.begin(), latencies.end());
    progress.latency_p50_ms = PercentileMs(latencies, 0.50, o_.compression);
    progress.latency_p99_ms = PercentileMs(latencies, 0.99, o_.compression);
    o_.progress(progress);
  }

  // With deploy_mu_ held.
  void SendFromSource(int s, uint64_t id, int64_t injected_ns) {
    const int op = t_->sources[s];
    for (int e : p_.out_edges[op]) {
      const uint64_t count = t_->Count(e, id);
      for (uint64_t part = 0; part < count; ++part) SendOnEdge(s, e, id, part, injected_ns);
    }
  }

  // With deploy_mu_ held: message `part` of source s's request `id` on its out-edge e.
  void SendOnEdge(int s, int e, uint64_t id, uint64_t part, int64_t injected_ns) {
    const int child = p_.edges[e].to;
    // Shared with the acknowledgement's callback: a re-plan replaces routers_.
    std::shared_ptr<Router> router = t_->join[child] ? nullptr : routers_[e];
    const size_t pick = router == nullptr ? t_->by_id[child](id) : router->Pick();
    const int to = t_->op_workers[child][pick];
    auto message = std::make_shared<wire::Message>();
    message->request_id = id;
    message->part = part;
    message->sources = uint64_t{1} << s;
    message->op = child;
    message->edge = e;
    message->from_worker = -1;
    message->injected_ns = injected_ns;
    message->payload = rpc::AsBytes(t_->edge_payload[e]);
    message->epoch = epoch_;
    {
      std::lock_guard<std::mutex> lock(source_mu_);
      source_sent_[s][to] += t_->edge_payload[e].size();
    }
    relay_->Deliver(
        deployment_->address(to), *message, message,
        [this, e, id, part, s, to, router, pick](absl::StatusOr<uint32_t> queued) {
          if (router != nullptr) router->Done(pick, queued);
          if (queued.ok()) return;
          std::lock_guard<std::mutex> lock(source_mu_);
          failed_sends_.push_back({p_.edges[e].to, uint64_t{1} << s, id,
                                   absl::StrCat("send to worker '", p_.workers[to].name,
                                                "' failed: ", queued.status().message()),
                                   /*retryable=*/true, part});
        });
  }

  // The failure drills due by `now`, then a health check of every serving worker when one is
  // due; a worker found failed is recovered from. Called by one thread at a time (the monitor
  // while the sources inject, then the draining thread), the only one that replaces
  // deployments: its health checks read them without deploy_mu_, so the sources' sends never
  // wait for their round trips.
  void Supervise(int64_t now) {
    {
      std::lock_guard<std::mutex> lock(deploy_mu_);
      while (next_kill_ < kills_.size() && PlanNs(kills_[next_kill_].at_s) <= now) {
        const int w = kills_[next_kill_++].worker;
        if (!deployment_->address(w).empty() && !dead_[w]) {
          killed_ns_[w] = NowNs();
          deployment_->Kill(w);
        }
      }
      if (halted_ || o_.health_interval_s <= 0 || now < next_health_ns_) return;
      next_health_ns_ = now + static_cast<int64_t>(o_.health_interval_s * 1e9);
    }
    std::vector<int> failed;
    Remember(Poll(&failed));
    if (failed.empty()) return;
    // One at a time: the others of this check were workers of the deployment Recover replaces,
    // and the next check looks at the new one.
    std::lock_guard<std::mutex> lock(deploy_mu_);
    if (!halted_ && !dead_[failed[0]]) Recover(failed[0]);
  }

  int64_t PlanNs(double plan_s) const {
    return start_ns_ + static_cast<int64_t>(plan_s / o_.compression * 1e9);
  }

  // With deploy_mu_ held: stops the deployment, re-plans without the failed worker(s), starts the
  // new deployment and re-sends what is owed.
  void Recover(int failed) {
    const int64_t detected_ns = NowNs();
    FailureReport f;
    f.worker = p_.workers[failed].name;
    const int64_t killed_ns = killed_ns_.count(failed) != 0 ? killed_ns_[failed] : detected_ns;
    f.killed_at_s = static_cast<double>(killed_ns - start_ns_) / kSecondNs * o_.compression;
    f.detected_after_ms = static_cast<double>(detected_ns - killed_ns) / 1e6;
    for (int w : deployment_->SharingHost(failed)) dead_[w] = true;
    // The old deployment stops: first nothing more runs or is sent, then the counters of those
    // still answering are kept (the failed worker's as last seen), then the servers close.
    deployment_->Halt();
    Poll();
    if (retired_.size() < p_.workers.size()) retired_.resize(p_.workers.size());
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      if (deployment_->address(static_cast<int>(w)).empty()) continue;
      retired_[w].processed += last_seen_[w].processed;
      retired_[w].sent.resize(p_.workers.size(), 0);
      for (size_t d = 0; d < last_seen_[w].sent.size(); ++d) {
        retired_[w].sent[d] += last_seen_[w].sent[d];
      }
      last_seen_[w] = {};
    }
    deployment_->Stop();
    ++epoch_;
    collector_.BeginEpoch(epoch_);
    {
      std::lock_guard<std::mutex> lock(source_mu_);
      failed_sends_.clear();  // every one of them is retryable
    }
    const std::vector<std::vector<int>> old_workers = t_->op_workers;

    const int64_t replan_start = NowNs();
    absl::StatusOr<placement::Plan> plan = ReplanWithout(p_, dead_, o_.replan);
    f.replan_ms = static_cast<double>(NowNs() - replan_start) / 1e6;
    absl::Status deployed = plan.status();
    if (deployed.ok()) {
      auto topology = BuildTopology(p_, *plan, redeploy_options_);
      deployed = topology.status();
      if (topology.ok()) {
        t_ = *topology;
        deployed = Deploy();
      }
    }
    const std::vector<std::pair<int, uint64_t>> owed = OwedInputs(*t_, collector_, injected_);
    if (!deployed.ok()) {
      f.error = absl::StrCat("no deployment without worker '", f.worker, "': ", deployed.message());
      halted_ = true;
      deployment_->Stop();
      // What was owed is lost for good, with the reason.
      for (const auto& [s, id] : owed) {
        collector_.AddDrop({t_->sources[s], uint64_t{1} << s, id, f.error, false});
      }
      failures_.push_back(std::move(f));
      return;
    }
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      std::vector<int> before = old_workers[op], after = t_->op_workers[op];
      std::sort(before.begin(), before.end());
      std::sort(after.begin(), after.end());
      if (before != after) f.moved.push_back(p_.operators[op].name);
    }
    f.cost_per_hour_after = t_->plan.total_cost;
    collector_.MarkRetried(owed);
    for (const auto& [s, id] : owed) SendFromSource(s, id, injected_at_[s][id]);
    f.retried = static_cast<int64_t>(owed.size());
    f.redeploy_ms = static_cast<double>(NowNs() - detected_ns) / 1e6 - f.replan_ms;
    failures_.push_back(std::move(f));
  }

  void Inject() {
    const size_t sources = t_->sources.size();
    source_sent_.assign(sources, std::vector<uint64_t>(p_.workers.size(), 0));
    injected_.assign(sources, 0);
    injected_at_.assign(sources, {});
    std::mt19937_64 random(o_.seed);
    // Per source the wall seconds of its next injection since the start; a source injects while
    // that is within the duration (the last one at the end included, as the simulator does).
    const double duration_wall = o_.duration_s / o_.compression;
    std::vector<double> rate_wall(sources), next_s(sources, 0);
    std::vector<int64_t> next(sources);
    // During the spike every source injects `factor` times faster.
    const double spike_from = o_.spike.at_s / o_.compression;
    const double spike_to = (o_.spike.at_s + o_.spike.duration_s) / o_.compression;
    const bool spiking = o_.spike.factor != 1 && o_.spike.duration_s > 0;
    auto advance = [&](size_t s) {
      const double factor =
          spiking && next_s[s] >= spike_from && next_s[s] < spike_to ? o_.spike.factor : 1;
      if (o_.poisson_arrivals) {
        next_s[s] += std::exponential_distribution<double>(rate_wall[s] * factor)(random);
      } else if (spiking) {
        next_s[s] += 1 / (rate_wall[s] * factor);
      } else {
        // From the count, not a running sum: the last injection lands on the end exactly.
        next_s[s] = static_cast<double>(injected_[s] + 1) / rate_wall[s];
      }
      next[s] = next_s[s] <= duration_wall + 1e-9
                    ? start_ns_ + static_cast<int64_t>(std::llround(next_s[s] * 1e9))
                    : std::numeric_limits<int64_t>::max();
    };
    for (size_t s = 0; s < sources; ++s) {
      rate_wall[s] = p_.rate[t_->sources[s]] * o_.compression;
      advance(s);
    }
    warm_ns_ = start_ns_ + static_cast<int64_t>(o_.warmup_s / o_.compression * 1e9);
    stop_ns_ = start_ns_ + static_cast<int64_t>(std::llround(duration_wall * 1e9));
    last_progress_ns_ = start_ns_;
    // Polling the workers takes round trips: a thread of its own does it (and the failure
    // drills and health checks), so that injections leave on time.
    std::mutex mu;
    std::condition_variable cv;
    bool injecting = true;
    std::thread monitor([&] {
      int64_t next_progress = start_ns_ + kSecondNs;
      bool warm = false;
      std::unique_lock<std::mutex> lock(mu);
      while (injecting) {
        const int64_t wake =
            std::min(warm ? next_progress : std::min(next_progress, warm_ns_), NextSupervision());
        cv.wait_until(lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(wake)));
        if (!injecting) break;
        const int64_t now = NowNs();
        lock.unlock();
        Supervise(now);
        if (!warm && now >= warm_ns_) {
          warm = true;
          at_warm_ = Poll();
        }
        if (now >= next_progress) {
          next_progress += kSecondNs;
          Report(false);
        }
        lock.lock();
      }
      if (!warm) at_warm_ = Poll();
    });
    while (true) {
      const size_t s = sources == 0 ? 0 : std::min_element(next.begin(), next.end()) - next.begin();
      const int64_t due = sources == 0 ? stop_ns_ : std::min(next[s], stop_ns_);
      if (due > NowNs()) {
        std::this_thread::sleep_until(
            std::chrono::steady_clock::time_point(std::chrono::nanoseconds(due)));
      }
      const int64_t now = NowNs();
      if (sources > 0 && next[s] <= now) {
        std::lock_guard<std::mutex> lock(deploy_mu_);
        if (halted_) break;
        const uint64_t id = static_cast<uint64_t>(injected_[s]++);
        injected_at_[s].push_back(next[s]);
        SendFromSource(static_cast<int>(s), id, next[s]);
        advance(s);
        continue;
      }
      if (now >= stop_ns_) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      injecting = false;
    }
    cv.notify_all();
    monitor.join();
    at_stop_ = Poll();
  }

  // When the monitor must next run Supervise: the next drill or health check.
  int64_t NextSupervision() {
    std::lock_guard<std::mutex> lock(deploy_mu_);
    int64_t wake = std::numeric_limits<int64_t>::max();
    if (next_kill_ < kills_.size()) wake = PlanNs(kills_[next_kill_].at_s);
    if (o_.health_interval_s > 0 && !halted_) wake = std::min(wake, next_health_ns_);
    return wake;
  }

  // Waits until every sink has what the injections owe it (or it was dropped), within the
  // drain timeout; failures found meanwhile are recovered from.
  void Drain() {
    const int64_t deadline = NowNs() + static_cast<int64_t>(o_.drain_timeout_s * 1e9);
    int64_t next_progress = NowNs() + kSecondNs;
    int64_t owed = 0;
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (t_->sink[op]) owed += Expected(*t_, static_cast<int>(op), injected_);
    }
    while (NowNs() < deadline) {
      if (Settled(owed)) break;
      Supervise(NowNs());
      if (NowNs() >= next_progress) {
        next_progress += kSecondNs;
        Report(true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Whether every sink has completed or lost all that the injections owe it.
  bool Settled(int64_t owed) {
    std::vector<DropRecord> drops = collector_.Drops();
    {
      std::lock_guard<std::mutex> lock(source_mu_);
      drops.insert(drops.end(), failed_sends_.begin(), failed_sends_.end());
    }
    // Cheap first: a drop report loses at most max_parts messages at a sink.
    if (collector_.Completions() + static_cast<int64_t>(drops.size() * t_->max_parts) < owed) {
      return false;
    }
    drops = RequestDrops(*t_, std::move(drops), injected_);
    const std::vector<Collector::Sink> sinks = collector_.Sinks();
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (!t_->sink[op]) continue;
      const int64_t lost = DroppedFor(*t_, static_cast<int>(op), sinks[op], drops);
      if (static_cast<int64_t>(sinks[op].completions.size()) + lost <
          Expected(*t_, static_cast<int>(op), injected_)) {
        return false;
      }
    }
    return true;
  }

  // Halts every worker first (nothing more is sent), then closes them: a worker closing while a
  // peer still sends to it would turn the peer's messages into failures.
  void Teardown() {
    {
      // Sends that failed from the driver count as drops at the operator they were for.
      std::lock_guard<std::mutex> lock(source_mu_);
      for (DropRecord& d : failed_sends_) collector_.AddDrop(std::move(d));
      failed_sends_.clear();
    }
    collector_.Freeze();
    if (deployment_) deployment_->Stop();
    if (relay_) relay_->Close();
    if (collector_server_) collector_server_->Shutdown();
    collector_server_.reset();
  }

  const std::shared_ptr<const Topology> t0_;  // the first deployment's (the collector's view)
  std::shared_ptr<const Topology> t_;         // the deployment serving now
  const placement::Problem& p_;
  const ServeOptions& o_;
  ServeOptions redeploy_options_;  // o_ without the drills, for re-planned topologies
  Collector collector_;
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<rpc::Server> collector_server_;
  std::unique_ptr<Relay> relay_;
  // Deployments: replaced under deploy_mu_, which the sources' sends also take.
  std::mutex deploy_mu_;
  uint32_t epoch_ = 0;
  std::unique_ptr<Deployment> deployment_;
  std::vector<std::shared_ptr<Router>> routers_;  // per source edge
  std::vector<bool> dead_;                        // per worker
  std::vector<int> misses_;  // per worker: health checks answered late in a row
  std::vector<WorkerCounters> last_seen_,
      retired_;  // per worker; retired_: replaced deployments' sums
  std::vector<Kill> kills_;
  size_t next_kill_ = 0;
  std::map<int, int64_t> killed_ns_;
  int64_t next_health_ns_ = 0;
  bool halted_ = false;  // a re-plan failed: nothing serves any more
  std::vector<FailureReport> failures_;
  std::vector<std::vector<int64_t>> injected_at_;  // per source, per id: its injection time

  std::mutex source_mu_;
  std::vector<std::vector<uint64_t>> source_sent_;  // per source, per destination worker
  std::vector<DropRecord> failed_sends_;
  std::vector<int64_t> injected_;  // per source
  int64_t start_ns_ = 0, warm_ns_ = 0, stop_ns_ = 0;
  int64_t last_progress_ns_ = 0, last_completions_ = 0;
  Counters at_warm_, at_stop_;
  std::mutex status_mu_;
  Counters status_before_, status_now_;  // the last two health checks (admin command)
};

}  // namespace
}  // namespace internal

absl::StatusOr<ServeReport> Serve(const placement::Problem& problem, const placement::Plan& plan,
                                  const ServeOptions& options) {
  PLEXUS_RETURN_IF_ERROR(internal::CheckOptions(options));
  PLEXUS_ASSIGN_OR_RETURN(auto topology, internal::BuildTopology(problem, plan, options));
  internal::Driver driver(std::move(topology), options);
  return driver.Run();
}

}  // namespace plexus::serving
