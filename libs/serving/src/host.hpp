// The rpc service of a host process (plexus.serving.wire.Host): runs the workers the driver
// assigns to it, one deployment (epoch) at a time. Host (serve.hpp) wraps it in a server.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "plexus/serving/serve.hpp"
#include "serving.plexus.hpp"
#include "topology.hpp"
#include "worker.hpp"

namespace plexus::serving::internal {

class HostService final : public wire::Host::Service {
 public:
  explicit HostService(HostOptions options) : options_(std::move(options)) {}
  ~HostService() override;

  absl::Status Deploy(rpc::ServerContext& context, const wire::HostDeploy& request,
                      wire::HostAddresses* response) override;
  absl::Status Begin(rpc::ServerContext& context, const wire::HostBegin& request,
                     wire::Ack* response) override;
  absl::Status Halt(rpc::ServerContext& context, const wire::HostEpoch& request,
                    wire::Ack* response) override;
  absl::Status Stop(rpc::ServerContext& context, const wire::HostEpoch& request,
                    wire::Ack* response) override;
  absl::Status Kill(rpc::ServerContext& context, const wire::HostKill& request,
                    wire::Ack* response) override;
  absl::Status Shutdown(rpc::ServerContext& context, const wire::HostEpoch& request,
                        wire::Ack* response) override;

  const HostOptions& options() const { return options_; }
  bool shut_down() const { return shut_down_; }
  // Steady-clock ns of the driver's last call here or health check of a worker here.
  int64_t last_contact_ns() const { return last_contact_ns_; }
  void Touch() { last_contact_ns_ = NowNs(); }

 private:
  // With mu_ held: closes the current deployment's workers.
  void StopNodes();

  const HostOptions options_;
  std::mutex mu_;
  uint32_t epoch_ = 0;
  std::shared_ptr<const Topology> topology_;
  std::vector<std::unique_ptr<WorkerNode>> nodes_;
  std::atomic<bool> shut_down_{false};
  std::atomic<int64_t> last_contact_ns_{NowNs()};
};

}  // namespace plexus::serving::internal
