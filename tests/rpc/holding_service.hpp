// The test service most rpc tests need: Echo answers at once (and counts), HoldAsync parks its
// call until the test releases it (so a test controls how many calls are in flight), Fail is OK.
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <vector>

#include "kinds.plexus.hpp"
#include "plexus/rpc/server.hpp"
#include "test_server.hpp"

namespace plexus::rpctest {

class HoldingService : public Kinds::Service {
 public:
  absl::Status Echo(rpc::ServerContext&, const AllKinds& req, AllKinds* resp) override {
    ++echoes;
    *resp = req;
    return absl::OkStatus();
  }
  void HoldAsync(rpc::ServerCall<Inner, Inner> call) override {
    ++holds;
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(std::move(call));
  }
  absl::Status Fail(rpc::ServerContext&, const Inner&, Empty*) override { return absl::OkStatus(); }
  // Calls parked now.
  size_t Held() {
    std::lock_guard<std::mutex> lock(mu);
    return held.size();
  }
  // Answers the oldest parked call (OK).
  void ReleaseOne() {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(!held.empty());
    held.front().Finish(absl::OkStatus());
    held.erase(held.begin());
  }
  // Answers every parked call (OK).
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : held) c.Finish(absl::OkStatus());
    held.clear();
  }

  std::atomic<int> echoes{0};  // Echo calls served
  std::atomic<int> holds{0};   // HoldAsync calls received
  std::mutex mu;
  std::vector<rpc::ServerCall<Inner, Inner>> held;
};

// A HoldingService that records the id of each Hold request in the order the handler got it
// (what the QoS and forwarding tests assert on).
class OrderedHold : public HoldingService {
 public:
  void HoldAsync(rpc::ServerCall<Inner, Inner> call) override {
    {
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(call.request().id);
    }
    HoldingService::HoldAsync(std::move(call));
  }
  std::vector<int> Order() {
    std::lock_guard<std::mutex> lock(order_mu);
    return order;
  }
  std::mutex order_mu;
  std::vector<int> order;
};

// The QoS tests' bed: an inproc server of an OrderedHold that answers its parked calls before it
// shuts down.
struct OrderedHoldServer : TestServer<OrderedHold> {
  OrderedHoldServer()
      : TestServer(*transport::Device::Create({.backend = transport::Backend::kInproc}), "") {}
  ~OrderedHoldServer() { impl.Release(); }
  void WaitHeld(size_t n) {
    WaitUntil([&] { return impl.Held() == n; }, "held calls");
  }
  // Answers the parked call and waits until the next one (if any is queued) is parked, until
  // `total` were answered.
  void ReleaseInTurn(size_t total) {
    for (size_t done = 0; done < total; ++done) {
      WaitHeld(1);
      impl.ReleaseOne();
    }
  }
};

}  // namespace plexus::rpctest
