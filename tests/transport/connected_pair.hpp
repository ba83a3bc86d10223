// Two devices made with the same options and one connection between them, for tests that move a
// few messages over a real backend (tcp_protocol_test, tcp_sockets_test).
#pragma once

#include <catch2/catch.hpp>

#include <memory>

#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::transport::testing {

struct ConnectedPair {
  std::shared_ptr<Device> a, b;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<Listener> listener;  // b's
  std::unique_ptr<Connection> out;     // a's end, on cq_a
  std::unique_ptr<Connection> in;      // b's end (accepted), on cq_b
};

// REQUIREs every step; `out` connects from a (made with `a_options`) to the listener of b (made
// with `b_options`), `in` is its accepted end.
inline ConnectedPair ConnectPair(const DeviceOptions& a_options, const DeviceOptions& b_options,
                                 absl::Duration timeout = absl::Seconds(10)) {
  ConnectedPair p;
  auto a = Device::Create(a_options);
  auto b = Device::Create(b_options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  p.a = *std::move(a);
  p.b = *std::move(b);
  p.cq_a = p.a->CreateCompletionQueue();
  p.cq_b = p.b->CreateCompletionQueue();
  auto listener = p.b->Listen("");
  REQUIRE(listener.ok());
  p.listener = *std::move(listener);
  auto out = p.a->Connect(p.listener->address(), p.cq_a.get());
  REQUIRE(out.ok());
  p.out = *std::move(out);
  auto in = p.listener->Accept(p.cq_b.get(), timeout);
  REQUIRE(in.ok());
  p.in = *std::move(in);
  return p;
}

// Both devices made with `options`.
inline ConnectedPair ConnectPair(const DeviceOptions& options,
                                 absl::Duration timeout = absl::Seconds(10)) {
  return ConnectPair(options, options, timeout);
}

}  // namespace plexus::transport::testing
