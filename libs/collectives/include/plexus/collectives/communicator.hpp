// An NCCL-style communicator over plexus::transport: AllReduce, Reduce, Broadcast, AllGather,
// ReduceScatter, AllToAll(V), Send/Recv, Barrier and Split, blocking or asynchronous.
//
//   auto rdv = plexus::transport::Rendezvous::FromEnv();
//   plexus::collectives::CommunicatorOptions options;
//   options.device.backend = plexus::transport::Backend::kShm;
//   auto comm = plexus::collectives::Communicator::Create(*rdv, options);
//   absl::Status s = (*comm)->AllReduce(grad, grad, n, DataType::kF32, ReduceOp::kSum);
//
// Semantics shared by every call:
//  - Collective: every rank of the communicator makes the same sequence of collective calls
//    with matching arguments (count, dtype, op, root). A mismatch is detected from the header
//    that travels with each collective's first message on every connection and is reported as
//    an error (FailedPrecondition naming the rank and both calls), never silent corruption. A
//    rank that only sends in the mismatched call (a broadcast root) learns of it at its next
//    call, which fails because the receivers aborted.
//  - Ordered: the calls of one communicator execute one after the other in issue order, like
//    the kernels of a CUDA stream. Blocking calls run in the caller's thread when nothing is
//    queued before them; *Async calls run on the communicator's progress thread.
//  - In place when the send and receive pointers are equal (for AllGather: when send points at
//    this rank's block of recv; for ReduceScatter: when recv points at this rank's block of
//    send). Buffers need no alignment. Counts are elements, not bytes.
//  - Buffers must stay valid until the call returns or its Work completes.
//  - Failure: a dead or unreachable peer, or no progress for `timeout`, fails the call on every
//    rank within about 1.1x `timeout` with an error that names first the rank that failed first
//    ("... failed on rank 0: rank 2 made no progress ..."), not a rank that aborted in reaction
//    (Unavailable / DeadlineExceeded; docs/collectives.md, "Contract"). After any failure the
//    communicator is broken: every later call fails at once with the same error (as NCCL's
//    ncclCommAbort); create a new communicator to continue.
//  - Results are bit-identical across runs for the same algorithm, ring order and world size:
//    every element is reduced in an order fixed by the algorithm, never by arrival times.
//  - Live reconfiguration: RequestReconfiguration changes the ring order, algorithm overrides or
//    channel count from any rank at any time; every rank switches at the same collective
//    (docs/collectives_operations.md, "Live reconfiguration"; operators:
//    plexus/collectives/admin.hpp).
//  - CUDA builds (PLEXUS_HAVE_CUDA): device pointers are accepted; between the ranks of one host
//    AllReduce, Broadcast and AllGather go device to device (CallOptions::device_peer_access),
//    everything else is staged through pinned host memory and reduced on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/collectives/qos.hpp"
#include "plexus/collectives/selector.hpp"
#include "plexus/collectives/types.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::collectives {

// Live reconfiguration (plexus/collectives/reconfiguration.hpp) and tracing
// (plexus/collectives/trace.hpp): include those to call RequestReconfiguration,
// configuration() or Trace().
struct Reconfiguration;
struct ActiveConfiguration;
struct CollectiveTrace;

// CommunicatorOptions::trace. Every rank may choose differently.
struct TraceOptions {
  // Record every call. PLEXUS_COLL_TRACE (non-empty) also turns it on.
  bool enabled = false;
  // Calls kept: a ring, beyond it the oldest records are dropped (CollectiveTrace::dropped).
  // 1 to 2^24; PLEXUS_COLL_TRACE_CAPACITY sets it when this is left at 0.
  size_t capacity = 0;
  // Non-empty: when the communicator is destroyed, its trace is written (Chrome trace-event
  // format) to `<path_prefix>.<rank>.json`, or for a communicator made by Split to
  // `<path_prefix>.<communicator id in hex>.<rank>.json`. Implies `enabled`. Empty: the value of
  // PLEXUS_COLL_TRACE. A later communicator of the same rank and prefix replaces the file.
  std::string path_prefix;
  // Also record, for each call on the plan path, per peer when the first message to it was
  // posted and when the last message from it arrived (TraceEvent::peers): two clock reads per
  // message. PLEXUS_COLL_TRACE_PEERS=1 turns it on too.
  bool peer_steps = false;
};

// DeviceOptions with caller-driven progress: the default device of a communicator.
inline transport::DeviceOptions CallerDrivenDeviceOptions() {
  transport::DeviceOptions options;
  options.progress = transport::ProgressMode::kCaller;
  return options;
}

// Settings of a communicator, fixed at creation.
struct CommunicatorOptions {
  // The transport device the communicator creates (Create without a device): device.backend
  // connects the ranks (inproc: threads of one process; shm: processes on one host; tcp:
  // anywhere; verbs: RDMA); device.progress is kCaller here (the thread executing a call moves
  // the bytes itself, lowest latency; kThread: a device thread moves them); local_address, the
  // held-byte caps and the tcp and shm groups apply as documented in
  // transport/device.hpp. device.op_timeout and device.connect_timeout are not read: the
  // communicator sets them to `timeout` and `connect_timeout` below. shm.cma_threshold 0 keeps the
  // transport's default (PLEXUS_SHM_CMA_THRESHOLD, else 2 MiB). Create on an existing device
  // ignores all of `device` (options() then reports that device's options).
  transport::DeviceOptions device = CallerDrivenDeviceOptions();
  // Per peer (default) or one backend for all; PLEXUS_COLL_TRANSPORT_POLICY=per_peer|uniform
  // overrides it. Equal on every rank. Not used by Create on an existing device.
  TransportPolicy transport_policy = TransportPolicy::kPerPeer;
  // The identity of this rank's host: ranks with equal ids use shm between them and share CPUs.
  // "" = the environment's PLEXUS_HOST_ID if set, else the host name. Tests use it to play
  // several hosts in one process.
  std::string host_id;
  // Ring order: a permutation of 0..size-1; rank ring_order[i+1] follows ring_order[i]. Ring,
  // halving-doubling and tree all lay out ranks in this order. Empty = identity.
  std::vector<int> ring_order;
  // Independent connection sets ("channels") the data of a large collective is striped over.
  // 0 = backend default (tcp 2, others 1); at most kMaxChannels. Reconfiguration::channels
  // changes it live.
  int channels = 0;
  // Pipelining unit: messages are at most this many bytes. 0 = backend default (tcp 512 KiB,
  // shm 1 MiB, inproc 1 MiB).
  size_t chunk_bytes = 0;
  // Chunks in flight per connection and direction (receive slots of chunk_bytes each).
  int pipeline_depth = 4;
  // Collectives on CUDA device buffers run on pinned host copies (one per buffer of the call);
  // the communicator keeps up to this many bytes of them for later calls, since allocating
  // pinned memory is slow (docs/collectives.md, "CUDA buffers"). 0: allocate and free per call.
  size_t staging_cache_bytes = size_t{256} << 20;
  // A call that makes no progress for this long fails with DeadlineExceeded naming the silent
  // rank (within 1.1x this); also device.op_timeout, the transport's per-operation timeout, of
  // the device the communicator creates (a caller's device keeps its own op_timeout).
  absl::Duration timeout = absl::Seconds(60);
  // How long a waiting call spins on the completion queue before it starts yielding the CPU
  // between polls (it sleeps in the transport after 2 ms without progress). Not used when this
  // host runs more ranks than the process may use CPUs: waiting ranks yield at once there
  // (PLEXUS_COLL_YIELD=1 or 0 forces either behaviour).
  absl::Duration spin = absl::Microseconds(50);
  // Per-communicator algorithm choices (kAuto entries leave the choice to the table).
  AlgorithmOverrides algorithms;
  // The selector table; empty rules = the file named by PLEXUS_COLL_TABLE if set, else
  // AlgorithmTable::Default(tcp), tcp: some pair of ranks talks over tcp.
  AlgorithmTable table;
  // Logs every selection and the table at creation (base::Log, info; also PLEXUS_COLL_DEBUG=1).
  bool debug = false;
  // Time allowed to connect every rank at creation and at Split (also device.connect_timeout).
  absl::Duration connect_timeout = absl::Minutes(1);
  // Per-channel source addresses (tcp peers only; this rank's own, so they may differ between
  // ranks): channel c listens on and connects from channel_local_addresses[c % size()], which
  // steers the channel's connections onto a path where the fabric routes by source address
  // (source-based policy routing, or the ECMP hash of the 5-tuple: Maestro-style IP aliases).
  // Empty entries, or an empty list: device.local_address. Ignored by Create on an existing
  // device. The strategy provider (plexus/collectives/provider.hpp) fills it from flow
  // assignment. docs/collectives.md, "Strategy provider".
  std::vector<std::string> channel_local_addresses;
  // QoS time windows (plexus/collectives/qos.hpp): when enabled, every send (every
  // qos.gate_every-th) waits for an allowed instant of the schedule, at most `timeout`; a call
  // whose sends the schedule cannot admit within `timeout` fails with DeadlineExceeded naming the
  // schedule. PLEXUS_COLL_QOS (its text form; "off" disables) overrides it. Split children
  // inherit it.
  QosTimetable qos;
  // Records every call's issue, start and end (off by default; trace.hpp,
  // docs/collectives_operations.md "Tracing"). PLEXUS_COLL_TRACE=<prefix> turns it on. options()
  // reports the effective values.
  TraceOptions trace;
};

// Per-call settings.
struct CallOptions {
  CallOptions() = default;
  // `{Algorithm::kRing}` forces an algorithm, as it did when that was the only field (a
  // constructor, so that the brace form leaves the other fields default without a warning).
  CallOptions(Algorithm forced) : algorithm(forced) {}  // NOLINT(google-explicit-constructor)
  // kAuto: the selector decides. Otherwise forced for this call (takes precedence over
  // PLEXUS_COLL_ALGO, the communicator's overrides and the table). An algorithm a collective
  // does not implement falls back as documented in docs/collectives.md.
  Algorithm algorithm = Algorithm::kAuto;
  // Fused cast: an f32 AllReduce, Broadcast or AllGather whose messages travel as kBF16 or kF16,
  // half the bytes, converted while packing and on arrival (no pass over the whole buffer); every
  // rank ends with the same bits. nullopt (or dtype itself): as the data. Small calls travel
  // uncast. InvalidArgument for another collective, a dtype other than kF32, or another wire
  // type. Every rank must pass the same value (the header carries it: a difference fails the
  // call as mismatched). Error bounds and paths: docs/collectives.md, "Fused casts".
  std::optional<DataType> wire_dtype;
  // Broadcast and AllGather: recv holds elements of this type (kBF16 or kF16) while send holds
  // dtype (kF32): an f32 source cast on the way into half-width destinations. The root (for
  // AllGather each rank, for its own block) converts its source straight into its recv, which
  // then travels as it is: half the bytes, and no other rank converts anything. recv =
  // wire(send) bit for bit. nullopt (or dtype): as the data. wire_dtype must be unset or equal.
  // Host buffers only, and send must not overlap recv (InvalidArgument otherwise).
  std::optional<DataType> recv_dtype;
  // CUDA device buffers on a communicator whose peers are all on this host (shm or inproc):
  // true moves AllReduce, Broadcast and AllGather device to device (peers map each other's
  // buffers: CUDA IPC between processes, the pointers themselves between threads; reductions
  // by a kernel), false stages them through pinned host memory as on any other communicator
  // ("CUDA buffers" in docs/collectives.md). Every rank must pass the same value, and with true
  // device buffers on every rank: a rank whose buffers are host memory (or that passed false)
  // fails the call as mismatched, naming both sides.
  bool device_peer_access = true;
};

// The handle of an asynchronous call.
class Work {
 public:
  virtual ~Work() = default;
  // Waits until the call finished or `timeout` passed. Returns the call's status; when it is
  // still running after `timeout`, DeadlineExceeded (the call itself goes on).
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;
  // True once the call finished (successfully or not); never blocks.
  virtual bool Test() const = 0;
  // The call's status once Test() is true; Unavailable("still running") before.
  virtual absl::Status status() const = 0;
};

class Communicator {
 public:
  // Connects the ranks of `rendezvous` (collective: every rank calls it, with equal options
  // apart from device.local_address). InvalidArgument for a ring_order that is not a
  // permutation or bad channel/chunk settings; Unavailable when the backend or a peer cannot be
  // reached.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(transport::Rendezvous& rendezvous,
                                                              CommunicatorOptions options = {});

  // As above, over `device`, which the caller created and may share (rpc, multipath, other
  // communicators). Any transport::Device subclass works, including one defined outside the
  // transport library that wraps another device (the communicator only calls its public
  // interface: CreateCompletionQueue, Listen, Connect, Progress and the connections' calls).
  //  - Ownership is shared: this communicator and every communicator Split from it keep a
  //    reference until destroyed; the caller may drop its own at any time.
  //  - The device decides the connections: every peer is reached over it (transport_policy and
  //    host ids do not choose), its backend() sets the backend defaults of channels and chunk_bytes
  //    and must be the same on every rank, and its own settings (progress mode, local address,
  //    sockets per connection, op_timeout, connect_timeout, shm thresholds) apply as they are.
  //    options.device is ignored; options().device reports the device's options. Every other
  //    option applies (`timeout` still bounds a call that makes no progress, independently of
  //    the device's op_timeout).
  //  - Split children use the same device (new connections, same device).
  //  - Progress: with ProgressMode::kCaller the communicator's waiting calls drive the device
  //    (moving bytes of every connection of the device, other users' included, as any caller
  //    of Progress does); with kThread the device's thread moves the bytes and waiting calls
  //    poll, yield and then sleep on the completion queue.
  // InvalidArgument for a null device, plus the errors of the overload above.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      transport::Rendezvous& rendezvous, std::shared_ptr<transport::Device> device,
      CommunicatorOptions options = {});

  // Collective, like MPI_Comm_free: waits for queued calls to finish, then for every rank to
  // reach its destructor (a barrier bounded by `timeout`; skipped when the communicator is
  // broken), so that no peer loses messages still in flight; then closes the connections.
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The ring order in use (the option, or the identity; after a reconfiguration the new one).
  // Updated by the thread running collectives: from other threads read configuration().
  virtual const std::vector<int>& ring_order() const = 0;
  virtual const CommunicatorOptions& options() const = 0;
  // The backend of the connections to rank `peer` (for this rank itself: device.backend). A live
  // transport change updates it from the thread running collectives: from other threads read
  // configuration().peer_backends.
  virtual transport::Backend peer_backend(int peer) const = 0;
  // The algorithm a call of `kind` moving `bytes` (see SelectorRule) would use with `forced`.
  virtual Algorithm SelectAlgorithm(CollectiveKind kind, size_t bytes,
                                    Algorithm forced = Algorithm::kAuto) const = 0;
  // OK while usable; the error that broke the communicator otherwise.
  virtual absl::Status health() const = 0;
  // The calls recorded so far (CommunicatorOptions::trace; enabled false and no events when
  // tracing is off). Thread-safe, at any time, also while calls run.
  virtual CollectiveTrace Trace() const;
  // Trace() in Chrome's trace-event format (what PLEXUS_COLL_TRACE writes; an admin endpoint's
  // `coll-trace` command serves this).
  std::string TraceJson() const;

  // Every operation comes in two forms: the blocking one (written once, here) and its *Async
  // form (what an implementation provides). A blocking call runs through RunBlocking, which by
  // default issues the *Async form and waits for it.

  // recv[i] = op over ranks of send[i], on every rank. `count` elements each.
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                         CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kAllReduce,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .op = op,
                        .options = call});
  }
  virtual std::shared_ptr<Work> AllReduceAsync(const void* send, void* recv, size_t count,
                                               DataType dtype, ReduceOp op,
                                               CallOptions call = {}) = 0;

  // recv[i] = op over ranks of send[i], on `root` only (recv is ignored elsewhere, may be null).
  absl::Status Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                      int root, CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kReduce,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .op = op,
                        .root = root,
                        .options = call});
  }
  virtual std::shared_ptr<Work> ReduceAsync(const void* send, void* recv, size_t count,
                                            DataType dtype, ReduceOp op, int root,
                                            CallOptions call = {}) = 0;

  // recv = root's send on every rank (send is read on root only; in place when equal).
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                         CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kBroadcast,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .root = root,
                        .options = call});
  }
  virtual std::shared_ptr<Work> BroadcastAsync(const void* send, void* recv, size_t count,
                                               DataType dtype, int root, CallOptions call = {}) = 0;

  // recv[r*count + i] = send of rank r [i]. `count` is per rank; recv holds size()*count.
  absl::Status AllGather(const void* send, void* recv, size_t count, DataType dtype,
                         CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kAllGather,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .options = call});
  }
  virtual std::shared_ptr<Work> AllGatherAsync(const void* send, void* recv, size_t count,
                                               DataType dtype, CallOptions call = {}) = 0;

  // recv[i] = op over ranks of send[rank()*count + i]. send holds size()*count; `count` is the
  // per-rank output.
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op, CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kReduceScatter,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .op = op,
                        .options = call});
  }
  virtual std::shared_ptr<Work> ReduceScatterAsync(const void* send, void* recv, size_t count,
                                                   DataType dtype, ReduceOp op,
                                                   CallOptions call = {}) = 0;

  // recv[r*count + i] = send of rank r [rank()*count + i]; both hold size()*count.
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype,
                        CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kAllToAll,
                        .send = send,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .options = call});
  }
  virtual std::shared_ptr<Work> AllToAllAsync(const void* send, void* recv, size_t count,
                                              DataType dtype, CallOptions call = {}) = 0;

  // Per-peer counts and displacements (elements), as MPI_Alltoallv: send_counts[r] elements at
  // send + send_displs[r] go to rank r, which receives them at its recv + recv_displs[rank()];
  // recv_counts[r] must equal rank r's send_counts[rank()] (checked: a mismatch is an error).
  // Every span has size() entries. Not in place.
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DataType dtype, CallOptions call = {}) {
    return RunBlocking({.kind = CollectiveKind::kAllToAllV,
                        .send = send,
                        .recv = recv,
                        .dtype = dtype,
                        .options = call,
                        .send_counts = send_counts,
                        .send_displs = send_displs,
                        .recv_counts = recv_counts,
                        .recv_displs = recv_displs});
  }
  virtual std::shared_ptr<Work> AllToAllVAsync(const void* send,
                                               absl::Span<const size_t> send_counts,
                                               absl::Span<const size_t> send_displs, void* recv,
                                               absl::Span<const size_t> recv_counts,
                                               absl::Span<const size_t> recv_displs, DataType dtype,
                                               CallOptions call = {}) = 0;

  // Point to point, matched in issue order per pair of ranks (a Send of n elements pairs with
  // the peer's Recv of n elements of the same type; a mismatch is an error).
  absl::Status Send(const void* send, size_t count, DataType dtype, int peer) {
    return RunBlocking({.kind = CollectiveKind::kSendRecv,
                        .send = send,
                        .count = count,
                        .dtype = dtype,
                        .peer = peer,
                        .is_send = true});
  }
  virtual std::shared_ptr<Work> SendAsync(const void* send, size_t count, DataType dtype,
                                          int peer) = 0;
  absl::Status Recv(void* recv, size_t count, DataType dtype, int peer) {
    return RunBlocking({.kind = CollectiveKind::kSendRecv,
                        .recv = recv,
                        .count = count,
                        .dtype = dtype,
                        .peer = peer,
                        .is_send = false});
  }
  virtual std::shared_ptr<Work> RecvAsync(void* recv, size_t count, DataType dtype, int peer) = 0;

  // A receive from any source (MPI_ANY_SOURCE; torch.distributed's recv without a source): takes
  // the next Send to this rank from whichever peer's has arrived and returns that peer (the Async
  // form sets *source before the work completes). Matching stays per pair and in order: the
  // message taken is that peer's next Send to this rank, so a later Recv from it gets the one
  // after; the count and type must match as for Recv. When several wait, the lowest rank is
  // taken. A peer whose next message to this rank belongs to a collective this rank has not
  // reached is not a candidate until then. Blocks like Recv; DeadlineExceeded when no Send comes
  // within CommunicatorOptions::timeout; Unavailable when every peer's connection is down;
  // Unimplemented over a device whose connections cannot look ahead (Connection::PeekNext).
  absl::StatusOr<int> RecvFromAny(void* recv, size_t count, DataType dtype) {
    int source = -1;
    if (absl::Status s = RecvFromAnyAsync(recv, count, dtype, &source)->Wait(); !s.ok()) return s;
    return source;
  }
  virtual std::shared_ptr<Work> RecvFromAnyAsync(void* recv, size_t count, DataType dtype,
                                                 int* source) = 0;

  // Returns once every rank has entered the barrier.
  absl::Status Barrier() { return RunBlocking({.kind = CollectiveKind::kBarrier}); }
  virtual std::shared_ptr<Work> BarrierAsync() = 0;

  // Collective over this communicator: ranks with equal `color` form a new communicator, ranked
  // by (key, rank here). A negative color (kNoColor) takes part but gets nullptr. The child
  // inherits the options (ring order: the parent's order restricted to the child's ranks).
  static constexpr int kNoColor = -1;
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // Live reconfiguration (docs/collectives_operations.md, "Live reconfiguration"). Any rank, any
  // thread, any time (not collective): the change is published on the rendezvous store and takes
  // effect on every rank at the same collective, the first one that no rank had launched when it
  // learnt of the change (MCCS's sequence-number barrier); collectives already launched or queued
  // before it finish with the old configuration. Concurrent requests are applied one after the
  // other in the order the store numbered them, on every rank alike. Returns the change's epoch
  // (1, 2, ...). InvalidArgument for an empty change, a ring order that is not a permutation,
  // channels outside 1..kMaxChannels, or a transport whose backend this machine lacks;
  // FailedPrecondition for a transport change of a communicator created on the caller's device;
  // the communicator's error when it is broken; the store's error when publishing fails.
  // A transport or channel change that cannot connect fails the collective it lands on (and
  // breaks the communicator) within CommunicatorOptions::connect_timeout, naming the rank or
  // peer.
  virtual absl::StatusOr<uint64_t> RequestReconfiguration(const Reconfiguration& change) = 0;
  // Waits until every rank agreed where change `epoch` lands; returns the sequence number of the
  // first collective that runs with it (the same on every rank). DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<uint64_t> AwaitReconfiguration(uint64_t epoch, absl::Duration timeout) = 0;
  // The configuration in effect (a copy; safe from any thread).
  virtual ActiveConfiguration configuration() const = 0;
  // Collectives issued so far on this rank (the sequence number the next one issued gets).
  virtual uint64_t collective_sequence() const = 0;
  // Calls on device buffers that tried the device-to-device path on this rank (see
  // CallOptions::device_peer_access): those that went device to device, and those the ranks
  // agreed to stage through the host instead (CommunicatorOptions::debug logs why).
  struct DevicePathCounts {
    uint64_t device_to_device = 0;
    uint64_t staged = 0;
  };
  virtual DevicePathCounts device_path_counts() const = 0;

 protected:
  Communicator() = default;

  // The arguments of one blocking call; which fields it reads depends on `kind` (kSendRecv: a
  // Send when is_send, else a Recv).
  struct BlockingCall {
    CollectiveKind kind = CollectiveKind::kAllReduce;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    DataType dtype = DataType::kU8;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    int peer = -1;
    bool is_send = false;
    CallOptions options = {};
    absl::Span<const size_t> send_counts = {};
    absl::Span<const size_t> send_displs = {};
    absl::Span<const size_t> recv_counts = {};
    absl::Span<const size_t> recv_displs = {};
  };
  // Runs a blocking call. The default issues its *Async form (IssueAsync) and waits for it; an
  // implementation may run it in the caller's thread instead (the latency path).
  virtual absl::Status RunBlocking(const BlockingCall& call);
  // The *Async form of `call`.
  std::shared_ptr<Work> IssueAsync(const BlockingCall& call);
};

}  // namespace plexus::collectives
