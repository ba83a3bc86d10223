// A host process of a multi-process run (host.hpp; Host in serve.hpp).
#include "host.hpp"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deployment.hpp"
#include "plexus/base/status.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::serving {
namespace internal {

HostService::~HostService() {
  std::lock_guard<std::mutex> lock(mu_);
  StopNodes();
}

void HostService::StopNodes() {
  std::vector<std::thread> stoppers;
  for (auto& node : nodes_) stoppers.emplace_back([n = node.get()] { n->Stop(); });
  for (std::thread& t : stoppers) t.join();
  nodes_.clear();
}

absl::Status HostService::Deploy(rpc::ServerContext& context, const wire::HostDeploy& request,
                                 wire::HostAddresses* response) {
  Touch();
  if (!(request.compression > 0) || !std::isfinite(request.compression) ||
      !(request.join_timeout_s > 0) || request.max_join_pending < 1 ||
      request.balance > static_cast<uint32_t>(Balance::kDaronpon)) {
    return absl::InvalidArgumentError(
        "host: deploy needs compression > 0, join_timeout_s > 0, max_join_pending >= 1 and a "
        "known balance");
  }
  PLEXUS_ASSIGN_OR_RETURN(placement::Problem problem,
                          placement::ParseProblem(request.problem_json));
  PLEXUS_ASSIGN_OR_RETURN(placement::Plan plan, placement::ParsePlan(problem, request.plan_json));
  // The driver's options as far as its workers see them, with this host's operators.
  ServeOptions options;
  options.wire = Wire::kTcp;
  options.address = options_.address;
  options.operators = options_.operators;
  options.compression = request.compression;
  options.cpu_spins = request.cpu_spins;
  options.join_timeout_s = request.join_timeout_s;
  options.max_join_pending = static_cast<size_t>(request.max_join_pending);
  options.seed = request.seed;
  options.balance = static_cast<Balance>(request.balance);
  options.shaped_links = request.shaped_links;
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<const Topology> topology,
                          BuildTopology(problem, plan, options));
  std::lock_guard<std::mutex> lock(mu_);
  StopNodes();  // a new deployment replaces the last one
  epoch_ = request.epoch;
  topology_ = topology;
  auto* addresses = static_cast<std::string_view*>(
      context.Allocate(sizeof(std::string_view) * std::max<size_t>(request.workers.size(), 1)));
  for (size_t i = 0; i < request.workers.size(); ++i) {
    const int w = request.workers[i];
    if (w < 0 || static_cast<size_t>(w) >= problem.workers.size() || !topology->Serves(w)) {
      StopNodes();
      return absl::InvalidArgumentError(
          absl::StrCat("host: worker ", w, " does not serve in the plan of epoch ", epoch_));
    }
    auto node = StartWorker(w, topology, options, request.epoch, [this] { Touch(); });
    if (!node.ok()) {
      StopNodes();
      return node.status();
    }
    nodes_.push_back(std::move(*node));
    const std::string address = nodes_.back()->address();
    char* bytes = static_cast<char*>(context.Allocate(address.size()));
    std::copy(address.begin(), address.end(), bytes);
    addresses[i] = std::string_view(bytes, address.size());
  }
  response->addresses = rpc::Repeated<std::string_view>(addresses, request.workers.size());
  return absl::OkStatus();
}

absl::Status HostService::Begin(rpc::ServerContext&, const wire::HostBegin& request, wire::Ack*) {
  Touch();
  std::lock_guard<std::mutex> lock(mu_);
  if (request.epoch != epoch_ || !topology_) {
    return absl::FailedPreconditionError(absl::StrCat("host: deployment ", request.epoch,
                                                      " was not deployed here (", epoch_, " was)"));
  }
  if (request.peers.size() != topology_->problem.workers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("host: ", request.peers.size(),
                                                   " peer addresses for ",
                                                   topology_->problem.workers.size(), " workers"));
  }
  std::vector<std::string> peers(request.peers.begin(), request.peers.end());
  for (auto& node : nodes_) node->Start(peers, std::string(request.collector));
  return absl::OkStatus();
}

absl::Status HostService::Halt(rpc::ServerContext&, const wire::HostEpoch& request, wire::Ack*) {
  Touch();
  std::lock_guard<std::mutex> lock(mu_);
  if (request.epoch != epoch_) return absl::OkStatus();  // already replaced
  for (auto& node : nodes_) node->Halt();
  return absl::OkStatus();
}

absl::Status HostService::Stop(rpc::ServerContext&, const wire::HostEpoch& request, wire::Ack*) {
  Touch();
  std::lock_guard<std::mutex> lock(mu_);
  if (request.epoch != epoch_) return absl::OkStatus();
  StopNodes();
  return absl::OkStatus();
}

absl::Status HostService::Kill(rpc::ServerContext&, const wire::HostKill&, wire::Ack*) {
  // A drill of a process that dies: no goodbye, no flushing, every socket reset by the kernel.
  ::raise(SIGKILL);
  return absl::OkStatus();
}

absl::Status HostService::Shutdown(rpc::ServerContext&, const wire::HostEpoch&, wire::Ack*) {
  Touch();
  shut_down_ = true;
  return absl::OkStatus();
}

}  // namespace internal

struct Host::State {
  explicit State(HostOptions o) : service(std::move(o)) {}
  internal::HostService service;
  std::unique_ptr<rpc::Server> server;
};

absl::StatusOr<std::unique_ptr<Host>> Host::Start(HostOptions options) {
  if (!(options.driver_timeout_s > 0)) {
    return absl::InvalidArgumentError("HostOptions::driver_timeout_s must be > 0");
  }
  const std::string address = options.address;
  auto state = std::make_unique<State>(std::move(options));
  PLEXUS_ASSIGN_OR_RETURN(auto device,
                          transport::Device::Create(DeviceOptionsFor(Wire::kTcp, address)));
  PLEXUS_ASSIGN_OR_RETURN(state->server, rpc::Server::Create(device));
  PLEXUS_RETURN_IF_ERROR(state->server->Register(
      &state->service, {"Deploy", "Begin", "Halt", "Stop", "Kill", "Shutdown"}));
  PLEXUS_RETURN_IF_ERROR(state->server->Start());
  return std::unique_ptr<Host>(new Host(std::move(state)));
}

Host::Host(std::unique_ptr<State> state) : state_(std::move(state)) {}

Host::~Host() {
  if (state_ && state_->server) state_->server->Shutdown();
}

std::string Host::address() const { return state_->server->address(); }

absl::Status Host::Wait() {
  const double timeout_s = state_->service.options().driver_timeout_s;
  while (!state_->service.shut_down()) {
    const double silent_s =
        static_cast<double>(internal::NowNs() - state_->service.last_contact_ns()) / 1e9;
    if (silent_s > timeout_s) {
      return absl::UnavailableError(
          absl::StrCat("serving host ", address(), ": the driver has been silent for ",
                       static_cast<int>(silent_s), " s (HostOptions::driver_timeout_s ", timeout_s,
                       "): giving up"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::OkStatus();
}

namespace {
// Where rank r of a job publishes its host's address.
std::string HostKey(int rank) { return absl::StrCat("plexus-serving/host/", rank); }
}  // namespace

absl::Status ServeAsHost(transport::Rendezvous& rendezvous, HostOptions options) {
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<Host> host, Host::Start(std::move(options)));
  PLEXUS_RETURN_IF_ERROR(rendezvous.store()->Set(HostKey(rendezvous.rank()), host->address()));
  return host->Wait();
}

absl::StatusOr<std::vector<std::string>> HostsOf(transport::Rendezvous& rendezvous,
                                                 absl::Duration timeout) {
  std::vector<std::string> hosts;
  for (int r = 1; r < rendezvous.world_size(); ++r) {
    auto address = rendezvous.store()->Get(HostKey(r), timeout);
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat("rank ", r, " published no serving host address: ",
                                       address.status().message()));
    }
    hosts.push_back(*address);
  }
  return hosts;
}

absl::Status ShutdownHosts(const std::vector<std::string>& hosts, const std::string& address) {
  PLEXUS_ASSIGN_OR_RETURN(auto device,
                          transport::Device::Create(DeviceOptionsFor(Wire::kTcp, address)));
  std::string failed;
  for (const std::string& host : hosts) {
    rpc::ChannelOptions options;
    options.reconnect = false;
    auto channel = rpc::Channel::Connect(device, host, {&wire::Host::Descriptor()}, options);
    if (!channel.ok()) continue;  // gone already
    rpc::CallOptions call;
    call.timeout = absl::Seconds(5);
    wire::HostEpoch request;
    auto reply = wire::Host::Stub(*channel).ShutdownSync(request, call);
    (*channel)->Close();
    if (!reply.ok() && !absl::IsUnavailable(reply.status())) {
      absl::StrAppend(&failed, failed.empty() ? "" : "; ", host, ": ", reply.status().message());
    }
  }
  if (!failed.empty()) return absl::UnavailableError(absl::StrCat("serving hosts: ", failed));
  return absl::OkStatus();
}

}  // namespace plexus::serving
