// The communicator: a facade that sequences its parts, each a class of its own with its own state:
//  - ConnectionSet (connection_set.hpp): devices, completion queue, connections, mailboxes;
//  - PlanExecutor (executor.hpp): runs a plan over the connection set;
//  - MailboxPath (mailbox_path.hpp): small collectives over the connections' mailboxes;
//  - Reconfigurer (reconfig.hpp): live reconfiguration's requests, rounds and decisions;
//  - IssueQueue (issue_queue.hpp): the order calls run in, and the broken status.
// The executor and the mailbox path read a CallEnv (call_env.hpp) the communicator fills; none
// of the parts knows the communicator or the reconfigurer. The communicator's own files:
//  - communicator.cpp: creation (Make, Split), destruction, the IssueQueue, algorithm selection;
//  - collective_tasks.cpp: each collective's validation and run (staging, layout, plan);
//  - connection_set.cpp: ChangeConnections, a live change of the connection set;
//  - reconfig.cpp: BeginCollective, applying the changes that land on a collective;
//  - abort.cpp: failure handling (whom to blame, breaking the communicator).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "blame.hpp"
#include "call_env.hpp"
#include "connection_set.hpp"
#include "device_peers.hpp"
#include "executor.hpp"
#include "issue_queue.hpp"
#include "mailbox_path.hpp"
#include "plan.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "plexus/collectives/trace.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "qos_gate.hpp"
#include "reconfig.hpp"
#include "staging.hpp"
#include "tracer.hpp"
#include "wire.hpp"

namespace plexus::collectives::internal {

inline bool IsReducing(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kReduceScatter;
}

class CommunicatorImpl : public Communicator {
 public:
  // Connects over `device` when given (Communicator::Create on an existing device; Split
  // children of such a communicator), else over a device made from `options`.
  static absl::StatusOr<std::unique_ptr<Communicator>> Make(
      transport::Rendezvous& rendezvous, CommunicatorOptions options, const std::string& tag,
      std::shared_ptr<transport::Device> device = nullptr);
  ~CommunicatorImpl() override;

  int rank() const override { return layout_.rank; }
  int size() const override { return layout_.n; }
  const std::vector<int>& ring_order() const override { return layout_.order; }
  const CommunicatorOptions& options() const override { return options_; }
  transport::Backend peer_backend(int peer) const override {
    return peer >= 0 && peer < layout_.n ? peer_backend_[peer] : options_.device.backend;
  }
  Algorithm SelectAlgorithm(CollectiveKind kind, size_t bytes, Algorithm forced) const override;
  absl::Status health() const override { return issue_.broken(); }
  CollectiveTrace Trace() const override {
    return trace_ != nullptr ? trace_->Snapshot() : CollectiveTrace();
  }

  std::shared_ptr<Work> AllReduceAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       ReduceOp op, CallOptions call) override {
    return Async(AllReduceTask(send, recv, count, dtype, op, call));
  }
  std::shared_ptr<Work> ReduceAsync(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op, int root, CallOptions call) override {
    return Async(ReduceTask(send, recv, count, dtype, op, root, call));
  }
  std::shared_ptr<Work> BroadcastAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       int root, CallOptions call) override {
    return Async(BroadcastTask(send, recv, count, dtype, root, call));
  }
  std::shared_ptr<Work> AllGatherAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       CallOptions call) override {
    return Async(AllGatherTask(send, recv, count, dtype, call));
  }
  std::shared_ptr<Work> ReduceScatterAsync(const void* send, void* recv, size_t count,
                                           DataType dtype, ReduceOp op, CallOptions call) override {
    return Async(ReduceScatterTask(send, recv, count, dtype, op, call));
  }
  std::shared_ptr<Work> AllToAllAsync(const void* send, void* recv, size_t count, DataType dtype,
                                      CallOptions call) override {
    return Async(AllToAllTask(send, recv, count, dtype, call));
  }
  std::shared_ptr<Work> AllToAllVAsync(const void* send, absl::Span<const size_t> send_counts,
                                       absl::Span<const size_t> send_displs, void* recv,
                                       absl::Span<const size_t> recv_counts,
                                       absl::Span<const size_t> recv_displs, DataType dtype,
                                       CallOptions call) override {
    return Async(
        AllToAllVTask(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, call));
  }
  std::shared_ptr<Work> SendAsync(const void* send, size_t count, DataType dtype,
                                  int peer) override {
    return Async(PointToPointTask(const_cast<void*>(send), count, dtype, peer, true));
  }
  std::shared_ptr<Work> RecvAsync(void* recv, size_t count, DataType dtype, int peer) override {
    return Async(PointToPointTask(recv, count, dtype, peer, false));
  }
  std::shared_ptr<Work> RecvFromAnyAsync(void* recv, size_t count, DataType dtype,
                                         int* source) override {
    return Async(RecvFromAnyTask(recv, count, dtype, source));
  }
  std::shared_ptr<Work> BarrierAsync() override { return Async(BarrierTask()); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

  // Live reconfiguration (the Reconfigurer).
  absl::StatusOr<uint64_t> RequestReconfiguration(const Reconfiguration& change) override {
    return reconfig_.Request(change);
  }
  absl::StatusOr<uint64_t> AwaitReconfiguration(uint64_t epoch, absl::Duration timeout) override {
    return reconfig_.Await(epoch, timeout);
  }
  ActiveConfiguration configuration() const override { return reconfig_.configuration(); }
  uint64_t collective_sequence() const override { return reconfig_.issued(); }

  // Tests and diagnostics: every connection of this communicator (each channel, each peer), to
  // read the transport's counters of the bytes it moved.
  std::vector<const transport::Connection*> connections() const { return conns_.Connections(); }
  // Tests and diagnostics: how many connections this rank has made since creation, creation's
  // included (a live change that keeps a pair's connections adds none for it).
  uint64_t connections_opened() const {
    return connections_opened_.load(std::memory_order_relaxed);
  }
  DevicePathCounts device_path_counts() const override {
    return {device_to_device_.load(std::memory_order_relaxed),
            device_staged_.load(std::memory_order_relaxed)};
  }
  // Tests and diagnostics: the QoS send gate (null without a schedule).
  QosGate* qos_gate() const { return qos_.get(); }

 private:
  // A task, or the validation error that stops it from being queued.
  using TaskOr = absl::StatusOr<std::function<absl::Status()>>;

  CommunicatorImpl() = default;

  // Blocking calls run in the caller's thread when nothing is queued before them; AllReduce and
  // Barrier first try TryInline (no closure at all).
  absl::Status RunBlocking(const BlockingCall& call) override;
  // The task of a blocking call (its validation error when it cannot be issued).
  TaskOr TaskOf(const BlockingCall& call);
  absl::Status Blocking(TaskOr task) { return issue_.Blocking(std::move(task)); }
  std::shared_ptr<Work> Async(TaskOr task) { return issue_.Async(std::move(task)); }
  // IssueQueue::TryInline, issuing the collective first.
  template <typename Fn>
  std::optional<absl::Status> TryInline(Fn&& fn) {
    return issue_.TryInline([this] { return IssueCollective(); }, std::forward<Fn>(fn));
  }
  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                            CallOptions call);
  // RunAllReduce of large device buffers over a ring: the call runs as segments of the buffer,
  // each one's copy to the host overlapping the previous segment's ring and its copy back the
  // next one's (staging.hpp). Every rank segments alike (same count, same options).
  absl::Status PipelinedDeviceAllReduce(const void* send, void* recv, size_t count, DataType dtype,
                                        ReduceOp op, const CallHeader& header);
  absl::Status RunBarrier();

  // Device buffers device to device on a one-host communicator (device_peers.hpp). Whether a
  // call tries that path (the same answer on every rank that passes device buffers). The three
  // collectives: false when the ranks agreed to stage the call through the host instead (the
  // caller then runs it staged, with the header unmarked). ShareDeviceBuffers: the exchange of
  // the buffers' records (the first barrier), the mapping of the peers' buffers into `peers`,
  // and the vote (this rank votes `usable` and whether it mapped every peer); *one_gpu: every
  // rank's buffers are on the same GPU (then one rank does all the device work). An exchange of
  // `bytes` from every rank into all[rank * bytes], a barrier, and the failure of a CUDA step
  // (aborts the call, naming this rank).
  bool UsesDevicePeers(const void* send, const void* recv, const CallOptions& call) const;
  absl::StatusOr<bool> DevicePeerAllReduce(const void* send, void* recv, size_t count,
                                           DataType dtype, ReduceOp op, const CallHeader& header);
  absl::StatusOr<bool> DevicePeerBroadcast(const void* send, void* recv, size_t count,
                                           DataType dtype, int root, const CallHeader& header);
  absl::StatusOr<bool> DevicePeerAllGather(const void* send, void* recv, size_t count,
                                           DataType dtype, const CallHeader& header);
  absl::StatusOr<bool> ShareDeviceBuffers(const CallHeader& header, const void* send,
                                          const void* recv, bool usable,
                                          std::vector<PeerBuffers>* peers, bool* one_gpu);
  absl::Status DeviceExchange(const CallHeader& header, const void* mine, void* all, size_t bytes);
  absl::Status DeviceBarrier(const CallHeader& header);
  // The end of a step: this rank's device work done (else DeviceFailure with `what`), then a
  // barrier, so that no rank goes on before every rank's step landed. A rank that queued no
  // device work in the step (`worked` false) only joins the barrier: synchronising a context of
  // another process while the working rank's kernel runs makes the GPU switch to it.
  absl::Status DeviceStepDone(const CallHeader& header, const std::string& what,
                              bool worked = true);
  absl::Status DeviceFailure(const CallHeader& header, const absl::Status& s,
                             const std::string& what);

  TaskOr AllReduceTask(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       CallOptions call);
  TaskOr ReduceTask(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                    int root, CallOptions call);
  TaskOr BroadcastTask(const void* send, void* recv, size_t count, DataType dtype, int root,
                       CallOptions call);
  TaskOr AllGatherTask(const void* send, void* recv, size_t count, DataType dtype,
                       CallOptions call);
  TaskOr ReduceScatterTask(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           CallOptions call);
  TaskOr AllToAllTask(const void* send, void* recv, size_t count, DataType dtype, CallOptions call);
  TaskOr AllToAllVTask(const void* send, absl::Span<const size_t> send_counts,
                       absl::Span<const size_t> send_displs, void* recv,
                       absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                       DataType dtype, CallOptions call);
  TaskOr PointToPointTask(void* buf, size_t count, DataType dtype, int peer, bool is_send);
  TaskOr RecvFromAnyTask(void* buf, size_t count, DataType dtype, int* source);
  // The peer whose next message to this rank is its next Send (the lowest such rank), found by
  // looking at each peer's channel-0 connection (Connection::PeekNext) until one is.
  absl::StatusOr<int> AwaitAnySend();
  TaskOr BarrierTask();

  // Live reconfiguration. Issuing a collective (creating its task, or running it inline) calls
  // IssueCollective (Reconfigurer::Issue). Running it calls BeginCollective first, before
  // choosing its algorithm or layout: it applies the changes that land on this collective's
  // sequence number (reconfig.cpp); the error of a transport change that failed (the
  // communicator is broken then).
  absl::Status IssueCollective() { return reconfig_.Issue(); }
  absl::Status BeginCollective();
  void ApplyChange(const DecidedChange& decided);
  // After Make connected: the Reconfigurer's setup and start.
  absl::Status StartReconfiguration();
  // A change of transport and/or channel count landing on the collective about to run
  // (connection_set.cpp; unset: unchanged): every rank opens the devices it needs, gathers
  // whether all could (and the point-to-point counts of the pairs whose connections change,
  // which must match), connects only the connections that change (every channel of a pair whose
  // backend changes, the channels added), takes the others over, swaps the new set in and closes
  // the dropped ones. Nothing happens, on every rank alike, when neither the pair backends nor
  // the count change. An error (naming the rank or peer; within options_.connect_timeout)
  // breaks the communicator.
  absl::Status ChangeConnections(const std::optional<TransportChoice>& transport,
                                 std::optional<int> channels, uint64_t epoch);
  // What a connection set for the pair backends `pairs` ([a][b], PairBackends) is built from.
  ConnectionSpec MakeConnectionSpec(const std::vector<std::vector<transport::Backend>>& pairs,
                                    std::string tag) const;

  absl::Status CheckCommon(const char* what, const void* send, const void* recv, size_t count,
                           DataType dtype, ReduceOp op = ReduceOp::kSum, int root = 0) const;
  // The algorithm used, after falling back from ones the collective does not implement.
  Algorithm Resolve(CollectiveKind kind, size_t bytes, Algorithm forced) const;
  // The layout for elements of `dtype` (valid until the next call; calls run one at a time).
  // With `segment_bytes` (what one ring step moves), chunks shrink so that each step still
  // spreads over every channel and reductions overlap transfers.
  const Layout& MakeLayout(DataType dtype, size_t segment_bytes = 0);
  // Fused casts (CallOptions::wire_dtype). CheckWire: InvalidArgument unless `call` asks for no
  // cast, or for bf16/f16 on an f32 call of a collective that supports it (`supported`).
  // recv_supported: the collective takes CallOptions::recv_dtype (else it must be unset).
  absl::Status CheckWire(const char* what, DataType dtype, const CallOptions& call, bool supported,
                         bool recv_supported = false) const;
  // CallOptions::recv_dtype (Broadcast, AllGather): InvalidArgument for an unsupported pair of
  // types, device buffers, or the send_bytes of send overlapping the recv_bytes of recv. OK when
  // not asked for.
  absl::Status CheckRecvType(const char* what, const void* send, size_t send_bytes,
                             const void* recv, size_t recv_bytes, DataType dtype,
                             const CallOptions& call) const;
  static std::optional<DataType> RecvTypeOf(DataType dtype, const CallOptions& call) {
    return call.recv_dtype == dtype ? std::nullopt : call.recv_dtype;
  }
  // The wire type of a call that takes a cast-capable path: nullopt when none was asked for.
  static std::optional<DataType> WireOf(DataType dtype, const CallOptions& call) {
    return call.wire_dtype == dtype ? std::nullopt : call.wire_dtype;
  }
  // MakeLayout for a cast: chunks of chunk_bytes on the wire (so of twice as many f32 bytes).
  const Layout& MakeWireLayout(DataType dtype, DataType wire, size_t segment_bytes = 0);
  // An empty plan reusing the previous call's storage (no allocations on the latency path).
  Plan& NewPlan();
  CallHeader Header(CollectiveKind kind, DataType dtype, ReduceOp op, Algorithm algorithm, int root,
                    size_t count);
  uint8_t* Scratch(size_t bytes);

  // The mailbox path and the plan executor; a failure ends in Abort.
  bool FitsMailbox(size_t bytes) const { return mailbox_.Fits(bytes); }
  using MailInbound = MailboxPath::MailInbound;
  absl::Status MailExchange(int to, const uint8_t* data, const MailInbound& in, size_t bytes,
                            DataType dtype, ReduceOp op, const CallHeader& header) {
    return mailbox_.MailExchange(to, data, in, bytes, dtype, op, header);
  }
  absl::Status MailboxAllReduce(uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                                const CallHeader& header) {
    return mailbox_.MailboxAllReduce(buf, count, dtype, op, header);
  }
  absl::Status Execute(const Plan& plan, const CallHeader& header, DataType dtype, ReduceOp op) {
    return executor_.Execute(plan, header, dtype, op);
  }
  // Works out whom `failure` blames (the rank that failed first, not one that aborted in
  // reaction: see blame.hpp), publishes that for the peers, marks the communicator broken with
  // the resulting error (naming every rank whose connection is down) and closes every
  // connection so that the peers fail fast too. Takes at most the blame grace (stalls) or
  // ~0.3 s (failed connections) beyond the failure.
  absl::Status Abort(const CallHeader& header, Failure failure);

  CommunicatorOptions options_;
  // Pinned host buffers of earlier calls on device memory (staging.hpp), and one call's staging
  // drawing on them.
  internal::PinnedPool pinned_pool_;
  internal::Staging NewStaging() {
    return internal::Staging(&pinned_pool_, options_.staging_cache_bytes);
  }
  Layout layout_;
  std::string tag_;
  uint64_t uid_ = 0;
  int split_count_ = 0;
  std::shared_ptr<transport::Store> store_;
  // This rank's wait records and failure account on the store (blame.hpp).
  std::unique_ptr<internal::BlameBoard> board_;
  AlgorithmTable table_;
  AlgorithmOverrides env_overrides_;
  bool debug_ = false;
  // Non-null when tracing (CommunicatorOptions::trace): every hook is one branch on it.
  std::unique_ptr<Tracer> trace_;

  // peer_backend_[rank]: the backend connecting that rank; pair_backends_[a][b]: every pair's
  // (the same on every rank).
  std::vector<transport::Backend> peer_backend_;
  std::vector<std::vector<transport::Backend>> pair_backends_;
  std::atomic<uint64_t> connections_opened_{0};
  // The device came from the caller (Create on an existing device): Split children reuse it.
  bool caller_device_ = false;
  // What a live change rebuilds the connections from (ChangeConnections): every rank's host
  // identity, the options of the devices the communicator creates, whether the mailbox path is
  // allowed (PLEXUS_COLL_MAILBOX) and whether table_ is the default for the pair backends.
  std::vector<std::string> hosts_;
  transport::DeviceOptions device_options_;
  bool use_mailboxes_ = true;
  bool use_default_table_ = false;
  // The connections in use (a live change swaps its contents; the object stays).
  ConnectionSet conns_;

  // Issue order, and the broken status.
  IssueQueue issue_;

  // State of the executing call (one at a time).
  uint64_t collective_seq_ = 0;
  // The live-reconfiguration epoch collectives run under (ActiveConfiguration::epoch, kept by
  // the thread running collectives: BeginCollective writes it, Header() reads it).
  uint64_t config_epoch_ = 0;
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  std::vector<uint8_t> scratch_;
  Layout call_layout_;
  Plan plan_;
  // The decisions landing on the collective starting (BeginCollective; reused storage).
  std::vector<DecidedChange> landing_;
  bool ready_ = false;  // fully connected (Make succeeded)
  // QoS time windows (qos.cpp): the send-admission gate of the executor and the mailbox path;
  // null without a schedule.
  std::unique_ptr<QosGate> qos_;

  // The parts (declared last: they refer to the members above).
  CallEnv env_;
  MailboxPath mailbox_{env_};
  std::unique_ptr<DevicePeerMaps> device_maps_;  // peers' device buffers (first device call)
  std::atomic<uint64_t> device_to_device_{0}, device_staged_{0};  // device_path_counts()
  PlanExecutor executor_{env_, mailbox_};
  Reconfigurer reconfig_;
};

}  // namespace plexus::collectives::internal
