// The serving runtime's driver (serve.hpp): starts one WorkerNode per serving worker, injects the
// sources' requests, polls the workers' counters, drains, stops everything and reports.
#include "plexus/serving/serve.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/transport/device.hpp"
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
  if (!(o.join_timeout_s > 0) || !(o.drain_timeout_s >= 0) || o.max_join_pending < 1) {
    return absl::InvalidArgumentError(
        "ServeOptions: needs join_timeout_s > 0, drain_timeout_s >= 0, max_join_pending >= 1");
  }
  return absl::OkStatus();
}

class Driver {
 public:
  Driver(std::shared_ptr<const Topology> topology, const ServeOptions& options)
      : t_(std::move(topology)), p_(t_->problem), o_(options), collector_(*t_) {}
  ~Driver() { Teardown(); }

  absl::StatusOr<ServeReport> Run() {
    PLEXUS_RETURN_IF_ERROR(Setup());
    start_ns_ = NowNs();
    Inject();
    Drain();
    const int64_t end_ns = NowNs();
    const Counters at_end = Poll();
    Teardown();
    RunFigures figures{start_ns_, warm_ns_, stop_ns_, end_ns,
                       injected_, at_warm_, at_stop_, at_end};
    return BuildReport(*t_, o_, collector_, figures);
  }

 private:
  absl::StatusOr<std::shared_ptr<transport::Device>> NewDevice() {
    transport::DeviceOptions options;
    // Over tcp a device thread moves the bytes: a relay's calls are fire-and-forget, and with
    // caller progress an image-sized request left only when its sender next polled, so relays
    // fell behind their rate. inproc moves the bytes in PostSend itself.
    options.progress =
        o_.wire == Wire::kTcp ? transport::ProgressMode::kThread : transport::ProgressMode::kCaller;
    if (o_.wire == Wire::kTcp) {
      options.backend = transport::Backend::kTcp;
      options.local_address = "127.0.0.1";
    } else {
      options.backend = transport::Backend::kInproc;
    }
    return transport::Device::Create(options);
  }

  absl::Status Setup() {
    PLEXUS_ASSIGN_OR_RETURN(device_, NewDevice());
    PLEXUS_ASSIGN_OR_RETURN(collector_server_, rpc::Server::Create(device_));
    PLEXUS_RETURN_IF_ERROR(collector_server_->Register(&collector_, {"Complete", "Dropped"}));
    PLEXUS_RETURN_IF_ERROR(collector_server_->Start());
    relay_ = std::make_unique<Relay>(device_);
    std::map<int, OperatorFn> fns;
    for (const auto& [name, fn] : o_.operators) fns[p_.FindOperator(name)] = fn;
    nodes_.resize(p_.workers.size());
    addresses_.assign(p_.workers.size(), "");
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      if (!t_->Serves(static_cast<int>(w))) continue;
      PLEXUS_ASSIGN_OR_RETURN(auto device, NewDevice());
      WorkerConfig config{static_cast<int>(w),
                          t_,
                          o_.compression,
                          o_.cpu_spins,
                          o_.join_timeout_s,
                          o_.max_join_pending,
                          o_.seed,
                          {}};
      for (int op : t_->worker_ops[w]) {
        if (fns.count(op) != 0) config.operators[op] = fns[op];
      }
      auto node = WorkerNode::Create(device, std::move(config));
      if (!node.ok()) {
        return absl::Status(node.status().code(),
                            absl::StrCat("worker '", p_.workers[w].name,
                                         "': rpc server: ", node.status().message()));
      }
      addresses_[w] = (*node)->address();
      nodes_[w] = std::move(*node);
    }
    for (auto& node : nodes_) {
      if (node) node->Start(addresses_, collector_server_->address());
    }
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      if (addresses_[w].empty()) continue;
      auto channel = relay_->ChannelTo(addresses_[w], wire::Worker::Descriptor());
      if (!channel.ok()) {
        return absl::Status(channel.status().code(),
                            absl::StrCat("worker '", p_.workers[w].name, "' at ", addresses_[w],
                                         ": ", channel.status().message()));
      }
    }
    return absl::OkStatus();
  }

  // What every worker and the driver have sent so far, and the workers' queues.
  Counters Poll() {
    Counters c;
    c.at_ns = NowNs();
    c.sent.assign(p_.workers.size() + p_.operators.size(),
                  std::vector<uint64_t>(p_.workers.size(), 0));
    c.queue.assign(p_.workers.size(), 0);
    c.processed.assign(p_.workers.size(), 0);
    for (size_t w = 0; w < p_.workers.size(); ++w) {
      if (addresses_[w].empty()) continue;
      auto channel = relay_->ChannelTo(addresses_[w], wire::Worker::Descriptor());
      if (!channel.ok()) continue;
      wire::Worker::Stub stub(*channel);
      rpc::CallOptions options;
      options.timeout = absl::Seconds(2);
      auto stats = stub.StatsSync(wire::StatsRequest{}, options);
      if (!stats.ok()) continue;
      c.queue[w] = static_cast<int64_t>((*stats)->queued + (*stats)->in_service);
      c.processed[w] = static_cast<int64_t>((*stats)->processed);
      for (const wire::PeerBytes& b : (*stats)->sent) {
        if (b.worker >= 0 && static_cast<size_t>(b.worker) < p_.workers.size()) {
          c.sent[w][b.worker] = b.bytes;
        }
      }
    }
    std::lock_guard<std::mutex> lock(source_mu_);
    for (size_t s = 0; s < t_->sources.size(); ++s) {
      c.sent[p_.workers.size() + t_->sources[s]] = source_sent_[s];
    }
    return c;
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

  void SendFromSource(int s, uint64_t id, int64_t now) {
    const int op = t_->sources[s];
    for (int e : p_.out_edges[op]) {
      const int child = p_.edges[e].to;
      const size_t pick =
          t_->join[child] ? HashRoute(id, t_->op_shares[child]) : round_robin_[e]->Next();
      const int to = t_->op_workers[child][pick];
      auto message = std::make_shared<wire::Message>();
      message->request_id = id;
      message->sources = uint64_t{1} << s;
      message->op = child;
      message->edge = e;
      message->from_worker = -1;
      message->injected_ns = now;
      message->payload = rpc::AsBytes(t_->edge_payload[e]);
      {
        std::lock_guard<std::mutex> lock(source_mu_);
        source_sent_[s][to] += t_->edge_payload[e].size();
      }
      relay_->Deliver(addresses_[to], *message, message, [this, e, id, s, to](absl::Status st) {
        std::lock_guard<std::mutex> lock(source_mu_);
        failed_sends_.push_back(
            {p_.edges[e].to, uint64_t{1} << s, id,
             absl::StrCat("send to worker '", p_.workers[to].name, "' failed: ", st.message())});
      });
    }
  }

  void Inject() {
    const size_t sources = t_->sources.size();
    source_sent_.assign(sources, std::vector<uint64_t>(p_.workers.size(), 0));
    injected_.assign(sources, 0);
    round_robin_.resize(p_.edges.size());
    for (int op : t_->sources) {
      for (int e : p_.out_edges[op]) {
        round_robin_[e] = std::make_unique<SmoothRoundRobin>(t_->op_shares[p_.edges[e].to]);
      }
    }
    std::mt19937_64 random(o_.seed);
    // Per source the wall seconds of its next injection since the start; a source injects while
    // that is within the duration (the last one at the end included, as the simulator does).
    const double duration_wall = o_.duration_s / o_.compression;
    std::vector<double> rate_wall(sources), next_s(sources, 0);
    std::vector<int64_t> next(sources);
    auto advance = [&](size_t s) {
      if (o_.poisson_arrivals) {
        next_s[s] += std::exponential_distribution<double>(rate_wall[s])(random);
      } else {
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
    // Polling the workers takes round trips: a thread of its own does it, so that injections
    // leave on time.
    std::mutex mu;
    std::condition_variable cv;
    bool injecting = true;
    std::thread monitor([&] {
      int64_t next_progress = start_ns_ + kSecondNs;
      bool warm = false;
      std::unique_lock<std::mutex> lock(mu);
      while (injecting) {
        const int64_t wake = warm ? next_progress : std::min(next_progress, warm_ns_);
        cv.wait_until(lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(wake)));
        if (!injecting) break;
        const int64_t now = NowNs();
        lock.unlock();
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
        SendFromSource(static_cast<int>(s), injected_[s]++, next[s]);
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

  // Waits until every sink has what the injections owe it (or it was dropped), within the
  // drain timeout.
  void Drain() {
    const int64_t deadline = NowNs() + static_cast<int64_t>(o_.drain_timeout_s * 1e9);
    int64_t next_progress = NowNs() + kSecondNs;
    int64_t owed = 0;
    for (size_t op = 0; op < p_.operators.size(); ++op) {
      if (t_->sink[op]) owed += Expected(*t_, static_cast<int>(op), injected_);
    }
    while (NowNs() < deadline) {
      if (Settled(owed)) break;
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
    // Cheap first: drop reports can only overcount the requests lost.
    if (collector_.Completions() + static_cast<int64_t>(drops.size()) < owed) return false;
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
    for (auto& node : nodes_) {
      if (node) node->Halt();
    }
    for (auto& node : nodes_) {
      if (node) node->Stop();
    }
    if (relay_) relay_->Close();
    if (collector_server_) collector_server_->Shutdown();
    collector_server_.reset();
  }

  std::shared_ptr<const Topology> t_;
  const placement::Problem& p_;
  const ServeOptions& o_;
  Collector collector_;
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<rpc::Server> collector_server_;
  std::unique_ptr<Relay> relay_;
  std::vector<std::unique_ptr<WorkerNode>> nodes_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<SmoothRoundRobin>> round_robin_;  // per source edge
  std::mutex source_mu_;
  std::vector<std::vector<uint64_t>> source_sent_;  // per source, per destination worker
  std::vector<DropRecord> failed_sends_;
  std::vector<int64_t> injected_;  // per source
  int64_t start_ns_ = 0, warm_ns_ = 0, stop_ns_ = 0;
  int64_t last_progress_ns_ = 0, last_completions_ = 0;
  Counters at_warm_, at_stop_;
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
