// The next operator's worker for one sender and edge (router.hpp).
#include "router.hpp"

namespace plexus::serving::internal {

absl::StatusOr<std::unique_ptr<Router>> Router::Create(std::vector<double> shares, bool daronpon,
                                                       uint64_t seed, std::vector<double> cost) {
  std::unique_ptr<rpc::Balancer> balancer;
  if (daronpon && shares.size() > 1) {
    rpc::BalancerOptions options;
    options.policy = rpc::BalancePolicy::kDaronpon;
    options.replicas = static_cast<uint32_t>(shares.size());
    options.seed = seed;
    options.cost = std::move(cost);
    auto created = rpc::Balancer::Create(options);
    if (!created.ok()) return created.status();
    balancer = std::move(*created);
  }
  return std::unique_ptr<Router>(new Router(std::move(shares), std::move(balancer)));
}

size_t Router::Pick() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t target = shares_.Next();
  if (!balancer_) return target;
  const rpc::BalanceChoice choice =
      balancer_->Pick({static_cast<rpc::ReplicaId>(target), /*hops=*/0});
  (void)balancer_->OnSend(choice.replica);  // cannot fail: the replica is the balancer's own
  return choice.replica;
}

void Router::Done(size_t index, const absl::StatusOr<uint32_t>& queued) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!balancer_) return;
  (void)balancer_->OnResponse(static_cast<rpc::ReplicaId>(index),
                              queued.ok() ? std::optional<uint32_t>(*queued) : std::nullopt);
}

}  // namespace plexus::serving::internal
