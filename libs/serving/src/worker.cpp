// A worker of the serving runtime (worker.hpp).
#include "worker.hpp"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/log.hpp"

namespace plexus::serving::internal {

namespace {

constexpr int64_t kSweepNs = 100'000'000;  // how often stale joins are looked for
// An idle service thread wakes this often to look for stale joins and Stop.
constexpr auto kIdleWait = std::chrono::milliseconds(50);

rpc::CallOptions SendOptions() {
  rpc::CallOptions options;
  options.timeout = absl::Seconds(30);
  return options;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Relay

Relay::~Relay() { Close(); }

absl::StatusOr<std::shared_ptr<rpc::Channel>> Relay::ChannelTo(const std::string& address,
                                                               const rpc::ServiceDesc& service) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::CancelledError("serving: the relay is closed (shutting down)");
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  rpc::ChannelOptions options;
  options.reconnect = false;  // a worker that went away is a failure the report counts
  auto channel = rpc::Channel::Connect(device_, address, {&service}, options);
  if (!channel.ok()) return channel.status();
  channels_[address] = *channel;
  return *channel;
}

void Relay::Deliver(const std::string& address, const wire::Message& message,
                    std::shared_ptr<const void> keep,
                    std::function<void(absl::StatusOr<uint32_t>)> done) {
  auto channel = ChannelTo(address, wire::Worker::Descriptor());
  if (!channel.ok()) {
    done(channel.status());
    return;
  }
  wire::Worker::Stub stub(*channel);
  stub.Deliver(message, SendOptions(),
               [keep = std::move(keep),
                done = std::move(done)](absl::StatusOr<rpc::Reply<wire::Ack>> reply) {
                 if (!reply.ok()) {
                   done(reply.status());
                 } else {
                   done((*reply)->queued);
                 }
               });
}

void Relay::Complete(const std::string& address, const wire::Completion& completion) {
  auto channel = ChannelTo(address, wire::Collector::Descriptor());
  if (!channel.ok()) {
    if (absl::IsCancelled(channel.status())) return;  // shutting down: the driver counts it
    base::Logf(base::LogLevel::kWarning,
               "serving: completion of request %d not reported to the collector: %s",
               completion.request_id, channel.status().ToString());
    return;
  }
  auto keep = std::make_shared<wire::Completion>(completion);
  wire::Collector::Stub stub(*channel);
  stub.Complete(*keep, SendOptions(), [keep, address](absl::StatusOr<rpc::Reply<wire::Ack>> reply) {
    if (!reply.ok()) {
      base::Logf(base::LogLevel::kWarning,
                 "serving: completion of request %d not reported to %s: %s", keep->request_id,
                 address, reply.status().ToString());
    }
  });
}

void Relay::Dropped(const std::string& address, wire::Drop drop, std::string reason) {
  auto channel = ChannelTo(address, wire::Collector::Descriptor());
  if (!channel.ok()) {
    if (absl::IsCancelled(channel.status())) return;  // shutting down: the driver counts it
    base::Logf(base::LogLevel::kWarning, "serving: drop of request %d (%s) not reported: %s",
               drop.request_id, reason, channel.status().ToString());
    return;
  }
  struct Kept {
    wire::Drop drop;
    std::string reason;
  };
  auto keep = std::make_shared<Kept>(Kept{drop, std::move(reason)});
  keep->drop.reason = keep->reason;
  wire::Collector::Stub stub(*channel);
  stub.Dropped(keep->drop, SendOptions(), [keep](absl::StatusOr<rpc::Reply<wire::Ack>> reply) {
    if (!reply.ok()) {
      base::Logf(base::LogLevel::kWarning, "serving: drop of request %d not reported: %s",
                 keep->drop.request_id, reply.status().ToString());
    }
  });
}

void Relay::Close() {
  std::map<std::string, std::shared_ptr<rpc::Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    channels.swap(channels_);
  }
  for (auto& [address, channel] : channels) channel->Close();
}

// ---------------------------------------------------------------------------------------------
// WorkerNode

WorkerNode::WorkerNode(std::shared_ptr<transport::Device> device, WorkerConfig config)
    : config_(std::move(config)),
      topology_(*config_.topology),
      device_(device),
      relay_(std::move(device)),
      sent_bytes_(topology_.problem.workers.size(), 0) {
  const auto& p = topology_.problem;
  routers_.resize(p.edges.size());
  for (int op : topology_.worker_ops[config_.worker]) {
    for (int e : p.out_edges[op]) {
      if (!routers_[e]) {
        // Valid shares and costs (the topology's) make a router: Create cannot fail here.
        routers_[e] = *Router::Create(
            topology_.op_shares[p.edges[e].to], config_.balance == Balance::kDaronpon,
            config_.seed * 31 + static_cast<uint64_t>(e), topology_.op_costs[p.edges[e].to]);
      }
    }
  }
}

WorkerNode::~WorkerNode() { Stop(); }

absl::StatusOr<std::unique_ptr<WorkerNode>> WorkerNode::Create(
    std::shared_ptr<transport::Device> device, WorkerConfig config) {
  std::unique_ptr<WorkerNode> node(new WorkerNode(device, std::move(config)));
  rpc::ServerOptions options;
  options.max_connections = 0;
  auto server = rpc::Server::Create(device, options);
  if (!server.ok()) return server.status();
  node->server_ = std::move(*server);
  // Both handlers only take the worker's lock for a moment: they run on the dispatcher.
  if (absl::Status s = node->server_->Register(node.get(), {"Deliver", "Stats"}); !s.ok()) {
    return s;
  }
  if (absl::Status s = node->server_->Start(); !s.ok()) return s;
  return node;
}

void WorkerNode::Start(std::vector<std::string> peers, std::string collector) {
  peers_ = std::move(peers);
  collector_ = std::move(collector);
  const int servers = topology_.servers[config_.worker];
  for (int i = 0; i < servers; ++i) threads_.emplace_back([this, i] { Serve(i); });
}

void WorkerNode::Halt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void WorkerNode::Stop() {
  Halt();
  if (closed_) return;
  closed_ = true;
  if (server_ != nullptr) server_->Shutdown();
  relay_.Close();
}

absl::Status WorkerNode::Deliver(rpc::ServerContext&, const wire::Message& request,
                                 wire::Ack* response) {
  const auto& p = topology_.problem;
  if (request.epoch != config_.epoch) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker '%s' serves deployment %d, not %d (a message of another plan)",
                        p.workers[config_.worker].name, config_.epoch, request.epoch));
  }
  if (request.op < 0 || static_cast<size_t>(request.op) >= p.operators.size() || request.edge < 0 ||
      static_cast<size_t>(request.edge) >= p.edges.size() ||
      p.edges[request.edge].to != request.op ||
      std::find(topology_.worker_ops[config_.worker].begin(),
                topology_.worker_ops[config_.worker].end(),
                request.op) == topology_.worker_ops[config_.worker].end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker '%s' does not serve operator %d on edge %d",
                        p.workers[config_.worker].name, request.op, request.edge));
  }
  const int64_t now = NowNs();
  const double delay_s = topology_.LinkDelayS(topology_.From(request.edge, request.from_worker),
                                              placement::WorkerPosition(p, config_.worker),
                                              config_.shaped_links ? 0 : request.payload.size());
  Arrival arrival;
  arrival.ready_ns = now + static_cast<int64_t>(delay_s / config_.compression * 1e9);
  arrival.id = request.request_id;
  arrival.sources = request.sources;
  arrival.op = request.op;
  arrival.edge = request.edge;
  arrival.injected_ns = request.injected_ns;
  arrival.part = request.part;
  if (config_.operators.count(request.op) != 0) {
    arrival.payload.assign(reinterpret_cast<const char*>(request.payload.data()),
                           request.payload.size());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrival.sequence = sequence_++;
    arriving_.push(std::move(arrival));
    response->queued =
        static_cast<uint32_t>(arriving_.size() + fifo_.size() + static_cast<size_t>(in_service_));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

absl::Status WorkerNode::Stats(rpc::ServerContext& context, const wire::StatsRequest&,
                               wire::WorkerStats* response) {
  if (config_.on_stats) config_.on_stats();
  std::lock_guard<std::mutex> lock(mu_);
  response->queued = arriving_.size() + fifo_.size();
  response->in_service = static_cast<uint64_t>(in_service_);
  response->processed = processed_;
  response->join_pending = joins_.size();
  size_t count = 0;
  for (uint64_t b : sent_bytes_) count += b > 0 ? 1 : 0;
  auto* sent = static_cast<wire::PeerBytes*>(
      context.Allocate(sizeof(wire::PeerBytes) * std::max<size_t>(count, 1)));
  size_t i = 0;
  for (size_t w = 0; w < sent_bytes_.size(); ++w) {
    if (sent_bytes_[w] == 0) continue;
    sent[i] = wire::PeerBytes{};
    sent[i].worker = static_cast<int32_t>(w);
    sent[i].bytes = sent_bytes_[w];
    ++i;
  }
  response->sent = rpc::Repeated<wire::PeerBytes>(sent, count);
  return absl::OkStatus();
}

void WorkerNode::AdmitReady(int64_t now_ns) {
  const auto& p = topology_.problem;
  while (!arriving_.empty() && arriving_.top().ready_ns <= now_ns) {
    Arrival a = std::move(const_cast<Arrival&>(arriving_.top()));
    arriving_.pop();
    if (!topology_.join[a.op]) {
      Job job{a.id, a.sources, a.op, a.injected_ns, {}, a.ready_ns, a.part};
      job.inputs.push_back(std::move(a.payload));
      fifo_.push_back(std::move(job));
      continue;
    }
    const auto& in = p.in_edges[a.op];
    const size_t slot_index = std::find(in.begin(), in.end(), a.edge) - in.begin();
    auto [it, inserted] = joins_.try_emplace({a.op, a.id});
    JoinSlot& slot = it->second;
    if (inserted) {
      slot.first_ns = now_ns;
      slot.injected_ns = a.injected_ns;
      slot.have.assign(in.size(), false);
      slot.inputs.resize(in.size());
      if (joins_.size() > config_.max_join_pending) {
        auto oldest = joins_.begin();
        for (auto j = joins_.begin(); j != joins_.end(); ++j) {
          if (j->second.first_ns < oldest->second.first_ns) oldest = j;
        }
        Job lost{oldest->first.second,
                 topology_.masks[oldest->first.first][0],
                 oldest->first.first,
                 oldest->second.injected_ns,
                 {}};
        const bool evicted_this = oldest == it;
        joins_.erase(oldest);
        Drop(lost, "join buffer full (ServeOptions::max_join_pending)");
        if (evicted_this) continue;
      }
    }
    if (slot.have[slot_index]) {
      Job dup{a.id, a.sources, a.op, a.injected_ns, {}};
      Drop(dup, absl::StrCat("duplicate input on ", p.operators[p.edges[a.edge].from].name, " -> ",
                             p.operators[a.op].name));
      continue;
    }
    slot.have[slot_index] = true;
    slot.inputs[slot_index] = std::move(a.payload);
    slot.injected_ns = std::min(slot.injected_ns, a.injected_ns);
    slot.sources |= a.sources;
    if (++slot.arrived < static_cast<int>(in.size())) continue;
    fifo_.push_back(
        Job{a.id, slot.sources, a.op, slot.injected_ns, std::move(slot.inputs), a.ready_ns});
    joins_.erase(it);
  }
}

void WorkerNode::Serve(int server) {
  Server state;
  state.random.seed(config_.seed * 7919 + static_cast<uint64_t>(config_.worker) * 131 +
                    static_cast<uint64_t>(server));
  int64_t next_sweep = NowNs() + kSweepNs;
  const int64_t join_timeout_ns = static_cast<int64_t>(config_.join_timeout_s * 1e9);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const int64_t now = NowNs();
    AdmitReady(now);
    if (now >= next_sweep) {
      next_sweep = now + kSweepNs;
      for (auto it = joins_.begin(); it != joins_.end();) {
        if (now - it->second.first_ns < join_timeout_ns) {
          ++it;
          continue;
        }
        Job lost{it->first.second,
                 topology_.masks[it->first.first][0],
                 it->first.first,
                 it->second.injected_ns,
                 {}};
        it = joins_.erase(it);
        Drop(lost, "join inputs incomplete within ServeOptions::join_timeout_s");
      }
    }
    if (!fifo_.empty()) {
      Job job = std::move(fifo_.front());
      fifo_.pop_front();
      ++in_service_;
      lock.unlock();
      Run(std::move(job), state);
      lock.lock();
      --in_service_;
      ++processed_;
      continue;
    }
    auto wake = std::chrono::steady_clock::now() + kIdleWait;
    if (!arriving_.empty()) {
      const auto ready =
          std::chrono::steady_clock::time_point(std::chrono::nanoseconds(arriving_.top().ready_ns));
      wake = std::min(wake, ready);
    }
    cv_.wait_until(lock, wake);
  }
}

void WorkerNode::Run(Job job, Server& server) {
  auto fn = config_.operators.find(job.op);
  if (fn == config_.operators.end()) {
    Emulate(job, server);
    Forward(job, nullptr);
    return;
  }
  Request request;
  request.id = job.id;
  request.sources = job.sources;
  request.op = job.op;
  request.part = job.part;
  for (const std::string& input : job.inputs) request.inputs.push_back(input);
  absl::StatusOr<std::string> output = fn->second(request);
  if (!output.ok()) {
    Drop(job, absl::StrCat("operator '", topology_.problem.operators[job.op].name,
                           "' failed: ", output.status().message()));
    return;
  }
  Forward(job, &*output);
}

void WorkerNode::Emulate(const Job& job, Server& server) {
  const auto& p = topology_.problem;
  const double seconds = topology_.fit[job.op][config_.worker].Draw(server.random, server.normal);
  // The service starts when the job could (its arrival) or when the previous service ended as
  // scheduled, whichever is later: time lost to late wake-ups and to relaying is made up.
  const int64_t start = std::max(job.ready_ns, server.timeline_ns);
  server.timeline_ns = start + static_cast<int64_t>(seconds / config_.compression * 1e9);
  const auto until =
      std::chrono::steady_clock::time_point(std::chrono::nanoseconds(server.timeline_ns));
  if (config_.cpu_spins && !p.worker_types[p.workers[config_.worker].type].gpu) {
    while (std::chrono::steady_clock::now() < until) {
    }
  } else {
    std::this_thread::sleep_until(until);
  }
}

void WorkerNode::Forward(const Job& job, const std::string* output) {
  const auto& p = topology_.problem;
  if (topology_.sink[job.op]) {
    wire::Completion done;
    done.request_id = job.id;
    done.sources = job.sources;
    done.op = job.op;
    done.worker = config_.worker;
    done.injected_ns = job.injected_ns;
    done.done_ns = NowNs();
    done.epoch = config_.epoch;
    done.part = job.part;
    relay_.Complete(collector_, done);
    return;
  }
  std::shared_ptr<const std::string> owned;
  if (output != nullptr) owned = std::make_shared<const std::string>(*output);
  for (int e : p.out_edges[job.op]) {
    const uint64_t count = topology_.Count(e, job.id);
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t part = topology_.ratio[e] == 1 ? job.part : job.part * topology_.radix[e] + k;
      Send(job, e, part, owned);
    }
  }
}

void WorkerNode::Send(const Job& job, int e, uint64_t part,
                      const std::shared_ptr<const std::string>& owned) {
  const auto& p = topology_.problem;
  const int child = p.edges[e].to;
  Router* router = topology_.join[child] ? nullptr : routers_[e].get();
  const size_t pick = router == nullptr ? topology_.by_id[child](job.id) : router->Pick();
  const int to = topology_.op_workers[child][pick];
  const std::string& payload = owned ? *owned : topology_.edge_payload[e];
  auto message = std::make_shared<wire::Message>();
  message->request_id = job.id;
  message->part = part;
  message->sources = job.sources;
  message->op = child;
  message->edge = e;
  message->from_worker = config_.worker;
  message->injected_ns = job.injected_ns;
  message->payload = rpc::AsBytes(payload);
  message->epoch = config_.epoch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sent_bytes_[to] += payload.size();
  }
  // The message views the payload: both stay alive until the call completes.
  std::shared_ptr<const void> keep = std::make_shared<
      std::pair<std::shared_ptr<wire::Message>, std::shared_ptr<const std::string>>>(message,
                                                                                     owned);
  Job copy{job.id, job.sources, child, job.injected_ns, {}, 0, part};
  relay_.Deliver(peers_[to], *message, std::move(keep),
                 [this, copy, to, router, pick](absl::StatusOr<uint32_t> queued) {
                   if (router != nullptr) router->Done(pick, queued);
                   if (queued.ok()) return;
                   Drop(copy,
                        absl::StrCat("send to worker '", topology_.problem.workers[to].name,
                                     "' failed: ", queued.status().message()),
                        /*retryable=*/true);
                 });
}

void WorkerNode::Drop(const Job& job, std::string reason, bool retryable) {
  wire::Drop drop;
  drop.epoch = config_.epoch;
  drop.retryable = retryable;
  drop.request_id = job.id;
  drop.sources = job.sources;
  drop.op = job.op;
  drop.worker = config_.worker;
  drop.part = job.part;
  relay_.Dropped(collector_, drop, std::move(reason));
}

}  // namespace plexus::serving::internal
