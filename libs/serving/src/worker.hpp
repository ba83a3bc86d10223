// One worker of the plan: an rpc server (service plexus.serving.wire.Worker) in front of a FIFO
// and `servers` threads that run its operators, and the relay that sends each output to the
// next operator's worker over a channel of its own per peer. It knows the other workers and the
// collector by their rpc addresses only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "plexus/serving/routing.hpp"
#include "router.hpp"
#include "serving.plexus.hpp"
#include "topology.hpp"

namespace plexus::serving::internal {

struct WorkerConfig {
  int worker = -1;
  std::shared_ptr<const Topology> topology;
  double compression = 1;
  bool cpu_spins = true;
  double join_timeout_s = 5;
  size_t max_join_pending = 100'000;
  uint64_t seed = 1;
  std::map<int, OperatorFn> operators;  // real operators by operator index
  // The deployment this worker belongs to: stamped on what it sends, required on what it takes.
  uint32_t epoch = 0;
  Balance balance = Balance::kShares;
  std::function<void()> on_stats;  // called on each Stats call (a host's sign of its driver)
  bool shaped_links = false;       // ServeOptions::shaped_links
};

// Sends Messages, Completions and Drops to rpc addresses, one channel per address, reused.
class Relay {
 public:
  explicit Relay(std::shared_ptr<transport::Device> device) : device_(std::move(device)) {}
  ~Relay();
  // Sends without waiting; `done` runs (on a channel thread) with the worker's queue as its
  // acknowledgement reported it, or the call's failure. The payload must stay valid until then:
  // `keep` holds it.
  void Deliver(const std::string& address, const wire::Message& message,
               std::shared_ptr<const void> keep,
               std::function<void(absl::StatusOr<uint32_t>)> done);
  void Complete(const std::string& address, const wire::Completion& completion);
  void Dropped(const std::string& address, wire::Drop drop, std::string reason);
  absl::StatusOr<std::shared_ptr<rpc::Channel>> ChannelTo(const std::string& address,
                                                          const rpc::ServiceDesc& service);
  void Close();

 private:
  std::shared_ptr<transport::Device> device_;
  std::mutex mu_;
  bool closed_ = false;  // after Close no channel is opened again
  std::map<std::string, std::shared_ptr<rpc::Channel>> channels_;
};

class WorkerNode final : public wire::Worker::Service {
 public:
  // Starts the rpc server; the worker serves once Start gives it its peers.
  static absl::StatusOr<std::unique_ptr<WorkerNode>> Create(
      std::shared_ptr<transport::Device> device, WorkerConfig config);
  ~WorkerNode() override;
  std::string address() const { return server_->address(); }
  // Every worker's rpc address (indexed like Problem::workers, "" for those serving nothing) and
  // the collector's; starts the service threads.
  void Start(std::vector<std::string> peers, std::string collector);
  // Stops the service threads: nothing more is run or sent; what is queued stays (the driver
  // counts it). The server still takes messages, so peers stopping later see no failure.
  void Halt();
  // Halt, then closes the server and the channels.
  void Stop();

  absl::Status Deliver(rpc::ServerContext& context, const wire::Message& request,
                       wire::Ack* response) override;
  absl::Status Stats(rpc::ServerContext& context, const wire::StatsRequest& request,
                     wire::WorkerStats* response) override;

 private:
  struct Arrival {
    int64_t ready_ns = 0;  // when the link's delay has passed
    uint64_t sequence = 0;
    uint64_t id = 0;
    uint64_t sources = 0;
    int op = -1;
    int edge = -1;
    int64_t injected_ns = 0;
    std::string payload;  // kept only for real operators
    uint64_t part = 0;
    bool operator>(const Arrival& o) const {
      return ready_ns != o.ready_ns ? ready_ns > o.ready_ns : sequence > o.sequence;
    }
  };
  struct Job {
    uint64_t id = 0;
    uint64_t sources = 0;
    int op = -1;
    int64_t injected_ns = 0;
    std::vector<std::string> inputs;
    int64_t ready_ns = 0;  // when it could start: its (last) input's arrival
    uint64_t part = 0;     // Topology's parts; 0 for a join's (no fan-out above a join)
  };
  struct JoinSlot {
    int64_t first_ns = 0;  // when its first input arrived
    int64_t injected_ns = 0;
    uint64_t sources = 0;
    int arrived = 0;
    std::vector<bool> have;
    std::vector<std::string> inputs;
  };

  WorkerNode(std::shared_ptr<transport::Device> device, WorkerConfig config);
  void Serve(int server);
  // With mu_ held: moves arrivals whose delay passed into joins or the FIFO; drops stale joins.
  void AdmitReady(int64_t now_ns);
  // One service thread's state: its random draws and the end of its last emulated service as
  // scheduled, so that a late wake-up does not lengthen the next service (the server's capacity
  // stays the profile's, whatever the host's scheduling delays).
  struct Server {
    std::mt19937_64 random;
    std::normal_distribution<double> normal;
    int64_t timeline_ns = 0;
  };
  void Run(Job job, Server& server);
  void Emulate(const Job& job, Server& server);
  void Forward(const Job& job, const std::string* output);
  // One message of `job`'s output on edge `e`, with `part`; `owned`: a real operator's output
  // (null: the edge's emulated payload).
  void Send(const Job& job, int e, uint64_t part, const std::shared_ptr<const std::string>& owned);
  // `retryable`: the request was lost by a failed send, and is re-sent after a re-plan.
  void Drop(const Job& job, std::string reason, bool retryable = false);

  const WorkerConfig config_;
  const Topology& topology_;
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<rpc::Server> server_;
  Relay relay_;
  std::vector<std::string> peers_;
  std::string collector_;
  std::vector<std::unique_ptr<Router>> routers_;  // per edge out of this worker

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool closed_ = false;  // Stop's second half ran (driver thread only)
  uint64_t sequence_ = 0;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<Arrival>> arriving_;
  std::deque<Job> fifo_;
  // (op, request id) -> the inputs held so far.
  std::map<std::pair<int, uint64_t>, JoinSlot> joins_;
  int64_t in_service_ = 0;
  uint64_t processed_ = 0;
  std::vector<uint64_t> sent_bytes_;  // per destination worker
  std::vector<std::thread> threads_;
};

}  // namespace plexus::serving::internal
