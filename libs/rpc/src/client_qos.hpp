// The client side of global QoS (docs/rpc_engines.md, "Global QoS"): one reorder point for the
// Channels of one transport Device (the runtime). A Channel whose chain classifies its calls (a
// "qos" engine, QosPolicy: the same classification as on a Server) sends them through it: a call
// leaves at once while its connection's window has a free slot (and, with
// QosSchedule::max_in_flight, while the runtime's calls through this point stay below it);
// otherwise it waits here, without blocking its caller, and every slot freed takes the next call by
// the server's own rule (QosOrder: latency class first, weighted share, aging), across the
// runtime's channels.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "channel_impl.hpp"
#include "plexus/rpc/qos.hpp"
#include "qos_queue.hpp"

namespace plexus::rpc::internal {

class ClientQos : public std::enable_shared_from_this<ClientQos> {
 public:
  // The reorder point of the channels on `device`, made on first use; it lives as long as the
  // device (a process-wide registry keeps it and drops it once the device is gone).
  static std::shared_ptr<ClientQos> ForDevice(const std::shared_ptr<transport::Device>& device);
  ClientQos() = default;
  ClientQos(const ClientQos&) = delete;
  ClientQos& operator=(const ClientQos&) = delete;
  ~ClientQos();

  // Sends `call` (its chain passed, encoded, routed to `core`) now or queues it as `cls`;
  // `schedule`, when given, is the rule from now on. Never blocks on a full window. An error
  // (nothing queued) fails the call.
  absl::Status Submit(const std::shared_ptr<CallState>& call,
                      const std::shared_ptr<ChannelCore>& core, const CallOptions& options,
                      QosClass cls, const QosSchedule* schedule);
  // A call this point sent completed (ChannelCore::Finalize): its slot is free.
  void Done();
  // Completes `call` with Cancelled if it waits here (true), or makes sure it is cancelled right
  // after it left when it is leaving now (true); false when this point does not hold it.
  bool Cancel(CallState& call);
  // Sends what can leave now; fails the calls waiting for a connection that died (a channel
  // closing calls it).
  void Kick() { Dispatch(); }
  QosStats stats() const;

 private:
  struct Waiting {
    std::shared_ptr<CallState> call;
    std::shared_ptr<ChannelCore> core;
    CallOptions options;
    QosClass cls = QosClass::kBulk;
    absl::Time queued;
  };
  // Sends the queued calls that can leave, one dispatcher at a time (another thread asking
  // meanwhile makes it look again).
  void Dispatch();
  // Fails the calls whose deadline passed while queued; looks again every few milliseconds while
  // calls wait (a slot freed by a call that did not pass this point wakes nobody else).
  void Run();
  static void Fail(const std::shared_ptr<CallState>& call, absl::Status why);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  QosOrder<Waiting> order_;
  size_t in_flight_ = 0;  // calls sent by this point and not completed
  bool dispatching_ = false, again_ = false, stop_ = false;
  // The call being handed to its connection (Dispatch without the lock) and whether it was
  // cancelled meanwhile.
  const CallState* leaving_ = nullptr;
  bool leaving_cancelled_ = false;
  std::thread thread_;
};

}  // namespace plexus::rpc::internal
