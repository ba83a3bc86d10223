// One deployment of a plan (deployment.hpp).
#include "deployment.hpp"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"

namespace plexus::serving {

transport::DeviceOptions DeviceOptionsFor(Wire wire) { return DeviceOptionsFor(wire, "127.0.0.1"); }

transport::DeviceOptions DeviceOptionsFor(Wire wire, const std::string& address) {
  transport::DeviceOptions options;
  if (wire == Wire::kTcp) {
    options.backend = transport::Backend::kTcp;
    options.local_address = address;
    options.progress = transport::ProgressMode::kThread;
  } else {
    options.backend = transport::Backend::kInproc;
    options.progress = transport::ProgressMode::kCaller;
  }
  return options;
}

namespace internal {

absl::StatusOr<std::shared_ptr<transport::Device>> NewDevice(Wire wire,
                                                             const std::string& address) {
  return transport::Device::Create(DeviceOptionsFor(wire, address));
}

absl::StatusOr<std::unique_ptr<WorkerNode>> StartWorker(int worker,
                                                        std::shared_ptr<const Topology> topology,
                                                        const ServeOptions& o, uint32_t epoch,
                                                        std::function<void()> on_stats) {
  const placement::Problem& p = topology->problem;
  PLEXUS_ASSIGN_OR_RETURN(auto device, NewDevice(o.wire, o.address));
  WorkerConfig config;
  config.worker = worker;
  config.topology = topology;
  config.compression = o.compression;
  config.cpu_spins = o.cpu_spins;
  config.join_timeout_s = o.join_timeout_s;
  config.max_join_pending = o.max_join_pending;
  config.seed = o.seed + epoch;
  config.epoch = epoch;
  config.balance = o.balance;
  config.shaped_links = o.shaped_links;
  config.on_stats = std::move(on_stats);
  for (const auto& [name, fn] : o.operators) {
    const int op = p.FindOperator(name);
    const auto& ops = topology->worker_ops[worker];
    if (std::find(ops.begin(), ops.end(), op) != ops.end()) config.operators[op] = fn;
  }
  auto node = WorkerNode::Create(device, std::move(config));
  if (!node.ok()) {
    return absl::Status(node.status().code(),
                        absl::StrCat("worker '", p.workers[worker].name,
                                     "': rpc server: ", node.status().message()));
  }
  return node;
}

absl::StatusOr<std::unique_ptr<Deployment>> Deployment::Start(
    std::shared_ptr<const Topology> topology, const ServeOptions& o, uint32_t epoch,
    const std::string& collector, Relay& relay) {
  const placement::Problem& p = topology->problem;
  std::unique_ptr<Deployment> d(new Deployment(topology, epoch, o, relay));
  d->nodes_.resize(p.workers.size());
  d->addresses_.assign(p.workers.size(), "");
  if (!d->hosts_.empty()) {
    PLEXUS_RETURN_IF_ERROR(d->StartOnHosts(o, collector));
    return d;
  }
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (!topology->Serves(static_cast<int>(w))) continue;
    PLEXUS_ASSIGN_OR_RETURN(d->nodes_[w], StartWorker(static_cast<int>(w), topology, o, epoch));
    d->addresses_[w] = d->nodes_[w]->address();
  }
  for (auto& node : d->nodes_) {
    if (node) node->Start(d->addresses_, collector);
  }
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (d->addresses_[w].empty()) continue;
    auto channel = relay.ChannelTo(d->addresses_[w], wire::Worker::Descriptor());
    if (!channel.ok()) {
      return absl::Status(channel.status().code(),
                          absl::StrCat("worker '", p.workers[w].name, "' at ", d->addresses_[w],
                                       ": ", channel.status().message()));
    }
  }
  return d;
}

absl::Status Deployment::StartOnHosts(const ServeOptions& o, const std::string& collector) {
  const placement::Problem& p = topology_->problem;
  const std::string problem_json = placement::ProblemToJson(p);
  const std::string plan_json = placement::PlanToJson(p, topology_->plan);
  std::vector<std::vector<int32_t>> on_host(hosts_.size());
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (topology_->Serves(static_cast<int>(w))) on_host[w % hosts_.size()].push_back(w);
  }
  rpc::CallOptions call;
  call.timeout = host_timeout_ * 10;  // parsing the problem and starting servers takes a moment
  std::vector<absl::Status> results(hosts_.size());
  std::vector<std::thread> callers;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (on_host[h].empty()) continue;
    callers.emplace_back([&, h] {
      auto channel = relay_.ChannelTo(hosts_[h], wire::Host::Descriptor());
      if (!channel.ok()) {
        results[h] = channel.status();
        return;
      }
      wire::HostDeploy request;
      request.epoch = epoch_;
      request.problem_json = problem_json;
      request.plan_json = plan_json;
      request.workers = rpc::Repeated<int32_t>(on_host[h].data(), on_host[h].size());
      request.compression = o.compression;
      request.cpu_spins = o.cpu_spins;
      request.join_timeout_s = o.join_timeout_s;
      request.max_join_pending = o.max_join_pending;
      request.seed = o.seed;
      request.balance = static_cast<uint32_t>(o.balance);
      request.shaped_links = o.shaped_links;
      auto reply = wire::Host::Stub(*channel).DeploySync(request, call);
      if (!reply.ok()) {
        results[h] = reply.status();
        return;
      }
      if ((*reply)->addresses.size() != on_host[h].size()) {
        results[h] =
            absl::InternalError(absl::StrCat("answered ", (*reply)->addresses.size(),
                                             " addresses for ", on_host[h].size(), " workers"));
        return;
      }
      for (size_t i = 0; i < on_host[h].size(); ++i) {
        addresses_[on_host[h][i]] = std::string((*reply)->addresses[i]);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (!results[h].ok()) {
      return absl::Status(results[h].code(), absl::StrCat("serving host ", h, " at ", hosts_[h],
                                                          ": deploy: ", results[h].message()));
    }
  }
  std::vector<std::string_view> peers(addresses_.begin(), addresses_.end());
  OnEveryHost([&](wire::Host::Stub& stub, const rpc::CallOptions& options) {
    wire::HostBegin request;
    request.epoch = epoch_;
    request.peers = rpc::Repeated<std::string_view>(peers.data(), peers.size());
    request.collector = collector;
    auto reply = stub.BeginSync(request, options);
    if (!reply.ok()) {
      // Reported by the first health check, which names the worker.
      base::Logf(base::LogLevel::kWarning, "serving: a host did not begin deployment %d: %s",
                 epoch_, reply.status().ToString());
    }
  });
  return absl::OkStatus();
}

void Deployment::OnEveryHost(
    const std::function<void(wire::Host::Stub&, const rpc::CallOptions&)>& call) {
  const placement::Problem& p = topology_->problem;
  std::vector<bool> used(hosts_.size(), false);
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (!addresses_[w].empty()) used[w % hosts_.size()] = true;
  }
  rpc::CallOptions options;
  options.timeout = host_timeout_;
  std::vector<std::thread> callers;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (!used[h]) continue;
    callers.emplace_back([&, h] {
      auto channel = relay_.ChannelTo(hosts_[h], wire::Host::Descriptor());
      if (!channel.ok()) return;
      wire::Host::Stub stub(*channel);
      call(stub, options);
    });
  }
  for (std::thread& t : callers) t.join();
}

std::vector<int> Deployment::SharingHost(int worker) const {
  if (hosts_.empty()) return {worker};
  std::vector<int> out;
  for (size_t w = 0; w < addresses_.size(); ++w) {
    if (w % hosts_.size() == static_cast<size_t>(worker) % hosts_.size()) {
      out.push_back(static_cast<int>(w));
    }
  }
  return out;
}

Deployment::~Deployment() { Stop(); }

std::vector<absl::StatusOr<WorkerCounters>> Deployment::Ask(Relay& relay, absl::Duration timeout,
                                                            const std::vector<bool>& skip) const {
  const size_t n = addresses_.size();
  std::vector<absl::StatusOr<WorkerCounters>> out(n, absl::NotFoundError("not asked"));
  // One thread per worker: the answer comes after the slowest worker, not after their sum.
  std::vector<std::thread> askers;
  for (size_t w = 0; w < n; ++w) {
    if (addresses_[w].empty() || skip[w]) continue;
    askers.emplace_back([this, w, n, timeout, &relay, &out] {
      auto channel = relay.ChannelTo(addresses_[w], wire::Worker::Descriptor());
      if (!channel.ok()) {
        out[w] = channel.status();
        return;
      }
      wire::Worker::Stub stub(*channel);
      rpc::CallOptions options;
      options.timeout = timeout;
      auto stats = stub.StatsSync(wire::StatsRequest{}, options);
      if (!stats.ok()) {
        out[w] = stats.status();
        return;
      }
      WorkerCounters c;
      c.queued = static_cast<int64_t>((*stats)->queued + (*stats)->in_service);
      c.processed = static_cast<int64_t>((*stats)->processed);
      c.sent.assign(n, 0);
      for (const wire::PeerBytes& b : (*stats)->sent) {
        if (b.worker >= 0 && static_cast<size_t>(b.worker) < n) c.sent[b.worker] = b.bytes;
      }
      out[w] = std::move(c);
    });
  }
  for (std::thread& t : askers) t.join();
  return out;
}

void Deployment::Kill(int worker) {
  if (hosts_.empty()) {
    if (nodes_[worker]) nodes_[worker]->Stop();
    return;
  }
  auto channel = relay_.ChannelTo(hosts_[worker % hosts_.size()], wire::Host::Descriptor());
  if (!channel.ok()) return;
  wire::HostKill request;
  request.worker = worker;
  rpc::CallOptions options;
  options.timeout = host_timeout_;
  (void)wire::Host::Stub(*channel).KillSync(request, options);  // fails: the host is gone
}

void Deployment::Halt() {
  if (!hosts_.empty()) {
    if (stopped_) return;
    OnEveryHost([&](wire::Host::Stub& stub, const rpc::CallOptions& options) {
      wire::HostEpoch request;
      request.epoch = epoch_;
      (void)stub.HaltSync(request, options);  // a dead host has nothing left to halt
    });
    return;
  }
  for (auto& node : nodes_) {
    if (node) node->Halt();
  }
}

void Deployment::Stop() {
  if (stopped_) return;
  Halt();
  stopped_ = true;
  if (!hosts_.empty()) {
    OnEveryHost([&](wire::Host::Stub& stub, const rpc::CallOptions& options) {
      wire::HostEpoch request;
      request.epoch = epoch_;
      (void)stub.StopSync(request, options);
    });
    return;
  }
  std::vector<std::thread> stoppers;
  for (auto& node : nodes_) {
    if (node) stoppers.emplace_back([n = node.get()] { n->Stop(); });
  }
  for (std::thread& t : stoppers) t.join();
}

}  // namespace internal
}  // namespace plexus::serving
