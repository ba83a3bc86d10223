// One deployment of a plan: a WorkerNode per serving worker, each on a transport device and rpc
// server of its own, started together, asked for their counters together, stopped together. A
// failure replaces the whole deployment by a new one (a new epoch).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/serving/serve.hpp"
#include "plexus/transport/device.hpp"
#include "topology.hpp"
#include "worker.hpp"

namespace plexus::serving::internal {

// A device made with DeviceOptionsFor(wire, address).
absl::StatusOr<std::shared_ptr<transport::Device>> NewDevice(Wire wire, const std::string& address);

// What a worker's Stats call answered.
struct WorkerCounters {
  int64_t queued = 0;  // queued or in service
  int64_t processed = 0;
  std::vector<uint64_t> sent;  // bytes per destination worker
};

// One worker of `topology` in `epoch`, as `o` says (its transport, seed, balance, real operators
// by name, ...), on a device and rpc server of its own, not yet serving (WorkerNode::Start).
// Errors name the worker. `on_stats`: WorkerConfig's.
absl::StatusOr<std::unique_ptr<WorkerNode>> StartWorker(int worker,
                                                        std::shared_ptr<const Topology> topology,
                                                        const ServeOptions& o, uint32_t epoch,
                                                        std::function<void()> on_stats = {});

class Deployment {
 public:
  // Starts the workers that serve in `topology`, in `epoch`, reporting to the collector at
  // `collector`: as threads here, or on options.hosts (worker w on hosts[w % hosts.size()]);
  // `relay` (the driver's) connects to each, and must outlive the deployment. Errors name the
  // worker or host.
  static absl::StatusOr<std::unique_ptr<Deployment>> Start(std::shared_ptr<const Topology> topology,
                                                           const ServeOptions& options,
                                                           uint32_t epoch,
                                                           const std::string& collector,
                                                           Relay& relay);
  ~Deployment();

  // Each worker's counters (indexed like Problem::workers), all asked at once within `timeout`:
  // NotFound for a worker that does not serve or is in `skip`, the call's error otherwise.
  std::vector<absl::StatusOr<WorkerCounters>> Ask(Relay& relay, absl::Duration timeout,
                                                  const std::vector<bool>& skip) const;
  // Stops one worker at once, as if its process died (a failure drill): on a host, the host's
  // process dies, with every worker on it.
  void Kill(int worker);
  // The workers that fail with `worker`: those on its host (itself alone when in-process).
  std::vector<int> SharingHost(int worker) const;
  // Every worker stops running and sending; their servers still answer (Ask).
  void Halt();
  // Halt, then every server closes (in parallel: closing waits for its threads to notice).
  void Stop();

  const std::shared_ptr<const Topology>& topology() const { return topology_; }
  uint32_t epoch() const { return epoch_; }
  // A worker's rpc address ("" when it does not serve).
  const std::string& address(int worker) const { return addresses_[worker]; }

 private:
  Deployment(std::shared_ptr<const Topology> topology, uint32_t epoch, const ServeOptions& o,
             Relay& relay)
      : topology_(std::move(topology)),
        epoch_(epoch),
        hosts_(o.hosts),
        host_timeout_(absl::Seconds(std::max(o.failure_timeout_s, 1.0))),
        relay_(relay) {}
  // Each host with workers of this deployment starts them; then every one learns its peers.
  absl::Status StartOnHosts(const ServeOptions& o, const std::string& collector);
  // Calls `method` on every host that runs a worker of this deployment, in parallel, within
  // the host timeout; the failures (a host that died) are the caller's to ignore.
  void OnEveryHost(const std::function<void(wire::Host::Stub&, const rpc::CallOptions&)>& call);
  std::shared_ptr<const Topology> topology_;
  uint32_t epoch_;
  std::vector<std::string> hosts_;  // empty: the workers are threads here
  absl::Duration host_timeout_;
  Relay& relay_;
  bool stopped_ = false;
  std::vector<std::unique_ptr<WorkerNode>> nodes_;  // per worker; null when it does not serve
  std::vector<std::string> addresses_;
};

}  // namespace plexus::serving::internal
