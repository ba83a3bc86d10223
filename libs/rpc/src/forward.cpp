// Server-side Daronpon forwarding: a replica redirects a new call one hop to a peer replica whose
// load + delta is below its own, deciding with the same Balancer as the client channels. The
// peers' loads come back as they do to any balancing client: piggybacked on the responses of the
// forwarded calls and gossiped (the peer channels ask for load reports).
#include "absl/strings/str_cat.h"
#include "channel_impl.hpp"
#include "plexus/base/status.hpp"
#include "server_impl.hpp"

namespace plexus::rpc {
namespace internal {
namespace {

// On each peer channel's chain: feeds the peer's reported loads and the end of every forwarded
// call to the server's balancer (replica p + 1).
class PeerLoadTap : public Policy {
 public:
  PeerLoadTap(ServerCore* core, uint32_t peer) : core_(core), peer_(peer) {}
  std::string name() const override { return "forward-loads"; }
  std::string kind() const override { return "forward_loads"; }
  uint32_t hooks() const override { return kHookComplete | kHookLoadReport; }
  void OnComplete(const CallInfo& call, const absl::Status& status) override {
    (void)status;
    Forwarding* f = core_->forwarding.load();
    if (f == nullptr) return;
    std::lock_guard<std::mutex> lock(core_->load_mu);
    if (f->balancer->outstanding(peer_ + 1) > 0) {
      (void)f->balancer->OnResponse(peer_ + 1, call.replica_load);
    }
  }
  void OnLoadReport(uint32_t replica, uint32_t load) override {
    (void)replica;
    Forwarding* f = core_->forwarding.load();
    if (f == nullptr) return;
    std::lock_guard<std::mutex> lock(core_->load_mu);
    (void)f->balancer->OnGossip({peer_ + 1, load});
  }

 private:
  ServerCore* core_;
  uint32_t peer_;
};

}  // namespace

std::optional<uint32_t> ServerCore::ForwardTarget(bool forwarded_to_us) {
  Forwarding* f = forwarding.load();
  if (f == nullptr) return std::nullopt;
  uint32_t peer;
  {
    std::lock_guard<std::mutex> lock(load_mu);
    if (forwarded_to_us) {
      ++f->received;
      return std::nullopt;
    }
    // The call is addressed to this server (replica 0); Daronpon moves it when the least loaded
    // peer's load + delta is below ours.
    BalanceChoice choice = f->balancer->Pick({.target = 0, .hops = 0});
    if (!choice.redirected || choice.replica == 0) return std::nullopt;
    peer = choice.replica - 1;
    if (f->balancer->outstanding(choice.replica) >= f->window) {
      ++f->peer_unusable;
      return std::nullopt;
    }
    (void)f->balancer->OnSend(choice.replica);
  }
  // A peer that is not connected gets nothing: the call is served here (no lock held: the
  // channel takes its own).
  if (!f->peers[peer]->status().ok()) {
    std::lock_guard<std::mutex> lock(load_mu);
    (void)f->balancer->OnResponse(peer + 1, std::nullopt);
    ++f->peer_unusable;
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(load_mu);
  ++f->forwarded;
  ++f->per_peer[peer];
  return peer;
}

void ServerCore::Forward(const std::shared_ptr<ServerCallImpl>& call, uint32_t p) {
  Forwarding* f = forwarding.load();
  const CallInfo& info = call->info();
  CallOptions opts;
  if (call->deadline() != absl::InfiniteFuture()) {
    const absl::Duration left = call->deadline() - absl::Now();
    if (left <= absl::ZeroDuration()) {
      // Never sent: the tap will not see it end.
      {
        std::lock_guard<std::mutex> lock(load_mu);
        (void)f->balancer->OnResponse(p + 1, std::nullopt);
      }
      call->Finish(absl::DeadlineExceededError("deadline exceeded before forwarding"));
      return;
    }
    opts.timeout = left;
  }
  for (const auto& [k, v] : call->metadata()) opts.metadata.emplace_back(k, v);
  // The request was decoded in this server's receive buffer, which the call keeps until it
  // finishes; the peer channel gathers its segments from there (no copy).
  // Flagged as forwarded (the peer serves it, never forwards it again) and tried once.
  Channel& peer = *f->peers[p];
  (void)Channel::Impl::Of(peer).StartOnce(
      peer, *info.service, *info.method, call->request(), opts,
      [call](RawResult r) { call->Relay(std::move(r)); }, /*forwarded=*/true);
}

void ServerCore::StopForwarding() {
  Forwarding* f = forwarding.load();
  if (f == nullptr) return;
  for (auto& ch : f->peers) ch->Close();
}

}  // namespace internal

absl::Status Server::ForwardTo(std::vector<std::string> peer_addresses, ForwardOptions options) {
  auto& c = impl_->core;
  if (!c.started) return absl::FailedPreconditionError("ForwardTo before Start");
  if (c.forwarding_owner) return absl::FailedPreconditionError("ForwardTo was already called");
  if (peer_addresses.empty()) return absl::InvalidArgumentError("ForwardTo: no peer addresses");
  auto f = std::make_unique<internal::Forwarding>();
  f->addresses = peer_addresses;
  std::vector<const ServiceDesc*> services;
  for (const auto& [name, s] : c.by_name) services.push_back(&s->descriptor());
  ChannelOptions co = options.channel;
  co.load_reports = true;
  co.balance = "";
  PLEXUS_ASSIGN_OR_RETURN(f->window, internal::ResolveWindow(co.max_in_flight));
  for (uint32_t p = 0; p < peer_addresses.size(); ++p) {
    auto ch = Channel::Connect(c.device, peer_addresses[p], services, co);
    if (!ch.ok()) {
      for (auto& open : f->peers) open->Close();
      return absl::Status(ch.status().code(),
                          absl::StrCat("forwarding: peer replica ", p, " (", peer_addresses[p],
                                       "): ", ch.status().message()));
    }
    PLEXUS_RETURN_IF_ERROR((*ch)->engines().Attach(std::make_shared<internal::PeerLoadTap>(&c, p)));
    f->peers.push_back(std::move(*ch));
  }
  f->per_peer.assign(peer_addresses.size(), 0);
  BalancerOptions bc;
  bc.policy = BalancePolicy::kDaronpon;
  bc.replicas = static_cast<uint32_t>(peer_addresses.size() + 1);
  bc.local = {0};
  bc.delta = options.delta;
  bc.log_gossip = false;  // the server gossips its own load (ServerCore::trigger)
  PLEXUS_ASSIGN_OR_RETURN(f->balancer, Balancer::Create(bc));
  {
    // The calls already being handled count as the local replica's outstanding ones.
    std::lock_guard<std::mutex> lock(c.load_mu);
    for (uint32_t i = 0; i < c.load; ++i) (void)f->balancer->OnSend(0);
    c.forwarding_owner = std::move(f);
    c.forwarding.store(c.forwarding_owner.get());
  }
  return absl::OkStatus();
}

Server::ForwardStats Server::forwarding() const {
  auto& c = impl_->core;
  ForwardStats s;
  internal::Forwarding* f = c.forwarding.load();
  std::lock_guard<std::mutex> lock(c.load_mu);
  s.local_load = c.load;
  if (f == nullptr) return s;
  s.forwarded = f->forwarded;
  s.received = f->received;
  s.peer_unusable = f->peer_unusable;
  s.per_peer = f->per_peer;
  for (uint32_t p = 0; p < f->peers.size(); ++p) s.peer_load.push_back(f->balancer->Load(p + 1));
  return s;
}

}  // namespace plexus::rpc
