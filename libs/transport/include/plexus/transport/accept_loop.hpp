// A server's accept loop over a transport Listener, shared by the servers built on the transport
// (rpc's Server, aggregation's parameter server).
#pragma once

#include <atomic>
#include <memory>

#include "absl/functional/function_ref.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::transport {

// Hands each connection `listener` accepts (its completions going to `cq`) to `on_connection`
// until `stop` is set, which it sees within 100 ms. A failed accept (a peer's bad handshake) is
// that peer's problem: the loop goes on after a 10 ms pause, so that a listener failing at once
// every time cannot spin a core.
void AcceptUntil(Listener& listener, const std::atomic<bool>& stop, CompletionQueue* cq,
                 absl::FunctionRef<void(std::unique_ptr<Connection>)> on_connection);

}  // namespace plexus::transport
