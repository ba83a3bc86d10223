// The client side: a Channel is one connection to a Server over a transport Device (inproc, shm,
// tcp, verbs). Generated stubs call it; use it directly only for untyped calls.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/rpc/call.hpp"
#include "plexus/rpc/policy.hpp"
#include "plexus/rpc/schema.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpc {

struct ChannelOptions {
  // Calls in flight on the connection; a further call waits for a slot (within its deadline), so
  // a slow server bounds the client's memory. 0: PLEXUS_RPC_WINDOW (default 64).
  size_t max_in_flight = 0;
  // Largest response accepted (each posted receive is this big). 0: PLEXUS_RPC_MAX_MESSAGE_BYTES
  // (default 4 MiB).
  size_t max_message_bytes = 0;
  absl::Duration connect_timeout = absl::Seconds(10);
  // The dispatcher thread spins on the completion queue instead of sleeping when idle: lower
  // latency for a busy CPU.
  bool poll = false;
  int max_depth = 32;  // nesting of a response's messages
};

class Channel {
 public:
  using RawCallback = absl::AnyInvocable<void(internal::RawResult)>;

  // Connects to a Server's address and runs the handshake for `services` (every service this
  // channel will call): FailedPrecondition naming the service and both schema hashes when the
  // server's schema differs, NotFound when it does not serve one of them.
  static absl::StatusOr<std::shared_ptr<Channel>> Connect(std::shared_ptr<transport::Device> device,
                                                          std::string_view address,
                                                          std::vector<const ServiceDesc*> services,
                                                          ChannelOptions options = {});
  // Fails the calls still outstanding with Cancelled and closes the connection.
  ~Channel();

  // Starts a call; `done` (may be empty) runs on the channel's thread when it completes. Waits
  // while the window is full. The request must stay valid until the call completes.
  std::shared_ptr<internal::CallState> StartCall(const ServiceDesc& service,
                                                 const MethodDesc& method, const void* request,
                                                 const CallOptions& options, RawCallback done);

  // Policies of this connection.
  EngineChain& engines();
  // OK while usable; the error that ended the connection otherwise.
  absl::Status status() const;
  std::string peer() const;
  void Close();

  struct Impl;

 private:
  explicit Channel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::rpc
