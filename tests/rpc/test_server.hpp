// A test server: a started Server on `device` at `address` ("" picks one) with its service object
// beside it, shut down when it goes. The reconnection and retry tests kill and restart such
// servers at one address (calls parked in the service die with it); tests that must answer parked
// calls first derive and release them in their destructor.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "plexus/rpc/server.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpctest {

template <typename Impl>
struct TestServer {
  // `impl_args` construct the service.
  template <typename... Args>
  TestServer(std::shared_ptr<transport::Device> on, std::string address, Args&&... impl_args)
      : device(std::move(on)), impl(std::forward<Args>(impl_args)...) {
    auto s = rpc::Server::Create(device, {.address = std::move(address)});
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
  }
  ~TestServer() { server->Shutdown(); }
  std::shared_ptr<transport::Device> device;
  Impl impl;
  std::unique_ptr<rpc::Server> server;
};

// Waits up to 5 s (in 1 ms steps) for `pred`, then REQUIREs it; `what` names it in a failure.
template <typename Pred>
void WaitUntil(Pred pred, const char* what) {
  for (int i = 0; i < 5000 && !pred(); ++i) absl::SleepFor(absl::Milliseconds(1));
  INFO(what);
  REQUIRE(pred());
}

// A tcp device on 127.0.0.1.
inline std::shared_ptr<transport::Device> LoopbackTcp() {
  auto d = transport::Device::Create(
      {.backend = transport::Backend::kTcp, .local_address = "127.0.0.1"});
  REQUIRE(d.ok());
  return *d;
}

}  // namespace plexus::rpctest
