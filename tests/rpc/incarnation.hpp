// One incarnation of a test server: a started Server on `device` at `address` with its service
// object beside it, shut down when the incarnation goes (the reconnection and retry tests kill
// and restart servers at one address).
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>

#include "plexus/rpc/server.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpctest {

template <typename Impl>
struct Incarnation {
  // `impl_args` construct the service.
  template <typename... Args>
  Incarnation(std::shared_ptr<transport::Device> device, std::string address, Args&&... impl_args)
      : impl(std::forward<Args>(impl_args)...) {
    auto s = rpc::Server::Create(device, {.address = std::move(address)});
    REQUIRE(s.ok());
    server = std::move(*s);
    REQUIRE(server->Register(&impl).ok());
    REQUIRE(server->Start().ok());
  }
  ~Incarnation() { server->Shutdown(); }
  Impl impl;
  std::unique_ptr<rpc::Server> server;
};

// A tcp device on 127.0.0.1.
inline std::shared_ptr<transport::Device> LoopbackTcp() {
  auto d = transport::Device::Create(
      {.backend = transport::Backend::kTcp, .local_address = "127.0.0.1"});
  REQUIRE(d.ok());
  return *d;
}

}  // namespace plexus::rpctest
