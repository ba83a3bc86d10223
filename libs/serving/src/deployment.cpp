// One deployment of a plan (deployment.hpp).
#include "deployment.hpp"

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"

namespace plexus::serving {

transport::DeviceOptions DeviceOptionsFor(Wire wire) {
  transport::DeviceOptions options;
  if (wire == Wire::kTcp) {
    options.backend = transport::Backend::kTcp;
    options.local_address = "127.0.0.1";
    options.progress = transport::ProgressMode::kThread;
  } else {
    options.backend = transport::Backend::kInproc;
    options.progress = transport::ProgressMode::kCaller;
  }
  return options;
}

namespace internal {

absl::StatusOr<std::shared_ptr<transport::Device>> NewDevice(Wire wire) {
  return transport::Device::Create(DeviceOptionsFor(wire));
}

absl::StatusOr<std::unique_ptr<Deployment>> Deployment::Start(
    std::shared_ptr<const Topology> topology, const ServeOptions& o, uint32_t epoch,
    const std::string& collector, Relay& relay) {
  const placement::Problem& p = topology->problem;
  std::unique_ptr<Deployment> d(new Deployment(topology, epoch));
  std::map<int, OperatorFn> fns;
  for (const auto& [name, fn] : o.operators) fns[p.FindOperator(name)] = fn;
  d->nodes_.resize(p.workers.size());
  d->addresses_.assign(p.workers.size(), "");
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (!topology->Serves(static_cast<int>(w))) continue;
    auto device = NewDevice(o.wire);
    if (!device.ok()) return device.status();
    WorkerConfig config{static_cast<int>(w),
                        topology,
                        o.compression,
                        o.cpu_spins,
                        o.join_timeout_s,
                        o.max_join_pending,
                        o.seed + epoch,
                        {},
                        epoch,
                        o.balance};
    for (int op : topology->worker_ops[w]) {
      if (fns.count(op) != 0) config.operators[op] = fns[op];
    }
    auto node = WorkerNode::Create(*device, std::move(config));
    if (!node.ok()) {
      return absl::Status(
          node.status().code(),
          absl::StrCat("worker '", p.workers[w].name, "': rpc server: ", node.status().message()));
    }
    d->addresses_[w] = (*node)->address();
    d->nodes_[w] = std::move(*node);
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
  if (nodes_[worker]) nodes_[worker]->Stop();
}

void Deployment::Halt() {
  for (auto& node : nodes_) {
    if (node) node->Halt();
  }
}

void Deployment::Stop() {
  Halt();
  std::vector<std::thread> stoppers;
  for (auto& node : nodes_) {
    if (node) stoppers.emplace_back([n = node.get()] { n->Stop(); });
  }
  for (std::thread& t : stoppers) t.join();
}

}  // namespace internal
}  // namespace plexus::serving
