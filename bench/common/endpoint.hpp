// One end of a benchmark's transport connection between two local processes, and the device
// settings every such benchmark uses (header only: the benches that use it link the transport).
#pragma once

#include <memory>

#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::bench {

// Progress in the caller's thread (the waits measure the backend, not a hand-off to a device
// thread); tcp on 127.0.0.1 under the system's congestion control, as the raw TCP references and
// the other systems a benchmark compares with (the library's loopback default is reno).
inline transport::DeviceOptions LoopbackDeviceOptions(transport::Backend backend) {
  transport::DeviceOptions o;
  o.backend = backend;
  o.progress = transport::ProgressMode::kCaller;
  if (backend == transport::Backend::kTcp) o.local_address = "127.0.0.1";
  o.tcp.loopback_congestion_control = "";
  return o;
}

struct Endpoint {
  std::shared_ptr<transport::Device> device;
  std::unique_ptr<transport::CompletionQueue> cq;
  std::unique_ptr<transport::Listener> listener;
  std::unique_ptr<transport::Connection> conn;
};

}  // namespace plexus::bench
