// The communicator: creation (Make, Split), destruction, the order in which calls run, and the
// algorithm each call uses. The collectives themselves are in collective_tasks.cpp, the plan
// executor in executor.cpp, the mailbox path in mailbox_path.cpp, failures in abort.cpp.
#include "plexus/collectives/communicator.hpp"

#include <algorithm>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "communicator_impl.hpp"
#include "peer_transport.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/mesh.hpp"

namespace plexus::collectives::internal {

// ---------------------------------------------------------------------------------------------
// Work

class WorkImpl : public Work {
 public:
  absl::Status Wait(absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock, [&] { return done_; });
    } else if (!cv_.wait_for(lock,
                             absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())),
                             [&] { return done_; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("collective still running after ", absl::FormatDuration(timeout)));
    }
    return status_;
  }
  bool Test() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  absl::Status status() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) return absl::UnavailableError("still running");
    return status_;
  }
  void Complete(absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

namespace {

const base::Param<bool> kDebugParam("PLEXUS_COLL_DEBUG", false,
                                    "print each communicator's setup and algorithm choices");
const base::Param<std::string> kTableParam("PLEXUS_COLL_TABLE", "",
                                           "algorithm table file (docs/collectives.md)");
const base::Param<std::string> kAlgoParam("PLEXUS_COLL_ALGO", "",
                                          "algorithm overrides, e.g. allreduce=ring");
const base::Param<std::string> kYieldParam(
    "PLEXUS_COLL_YIELD", "", "waiting ranks yield the CPU: 1/0 (default: when oversubscribed)");
const base::Param<std::string> kTransportPolicyParam(
    "PLEXUS_COLL_TRANSPORT_POLICY", "",
    "per_peer (shm on a host, tcp/verbs across) or uniform (CommunicatorOptions::device.backend "
    "for every peer); overrides CommunicatorOptions::transport_policy");
const base::Param<std::string> kHostIdParam(
    "PLEXUS_HOST_ID", "", "this process's host identity for the collectives (default: host name)");
const base::Param<bool> kMailboxParam("PLEXUS_COLL_MAILBOX", true,
                                      "small collectives over shm/inproc mailboxes");

}  // namespace

std::shared_ptr<Work> FailedWork(absl::Status status) {
  auto work = std::make_shared<WorkImpl>();
  work->Complete(std::move(status));
  return work;
}

CommunicatorImpl::~CommunicatorImpl() {
  issue_.Stop();
  // Destruction is collective (as MPI_Comm_free): a peer may still be receiving what this rank
  // sent last, and closing now would fail its receives. After the barrier every rank has
  // finished every call it issued before.
  if (ready_ && layout_.n > 1 && health().ok()) {
    if (auto barrier = BarrierTask(); barrier.ok()) (void)issue_.RunOne(*barrier);
  }
  if (trace_ != nullptr) trace_->WriteIfAsked();
  reconfig_.Stop();
  // A healthy communicator leaves nothing on the store: the barrier's last progress retracted
  // any wait record; see that the removal is written. A broken one leaves its account (one key
  // per rank) for peers still resolving whom to blame.
  if (board_ != nullptr && health().ok()) {
    board_->Retract();
    board_->Flush(absl::Now() + std::min(options_.timeout, absl::Seconds(1)));
  }
  conns_.Close();
}

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorImpl::Make(
    transport::Rendezvous& rendezvous, CommunicatorOptions options, const std::string& tag,
    std::shared_ptr<transport::Device> device) {
  const int n = rendezvous.world_size();
  const int rank = rendezvous.rank();
  if (device != nullptr) {
    // The device decides how peers connect; options() reports what it uses.
    options.device = device->options();
    options.device.backend = device->backend();
  }
  // Validate and fill in defaults.
  if (options.ring_order.empty()) {
    options.ring_order.resize(n);
    std::iota(options.ring_order.begin(), options.ring_order.end(), 0);
  }
  if (static_cast<int>(options.ring_order.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("ring_order has ", options.ring_order.size(),
                                                   " entries; the world has ", n, " ranks"));
  }
  std::vector<int> position(n, -1);
  for (int i = 0; i < n; ++i) {
    const int r = options.ring_order[i];
    if (r < 0 || r >= n || position[r] != -1) {
      return absl::InvalidArgumentError(absl::StrCat("ring_order [",
                                                     absl::StrJoin(options.ring_order, ","),
                                                     "] is not a permutation of 0..", n - 1));
    }
    position[r] = i;
  }
  if (options.channels < 0 || options.channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be 0 (default) to ", kMaxChannels, ", got ", options.channels));
  }
  if (options.chunk_bytes != 0 &&
      (options.chunk_bytes < 64 || options.chunk_bytes > (size_t{1} << 30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be between 64 bytes and 1 GiB, got ", options.chunk_bytes));
  }
  if (options.pipeline_depth < 1 || options.pipeline_depth > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_depth must be 1 to 1024, got ", options.pipeline_depth));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  PLEXUS_ASSIGN_OR_RETURN(options.qos, ResolveQosTimetable(options.qos));

  std::unique_ptr<CommunicatorImpl> comm(new CommunicatorImpl());
  comm->layout_.rank = rank;
  comm->layout_.n = n;
  comm->layout_.order = options.ring_order;
  comm->layout_.position = position;
  comm->tag_ = tag;
  comm->store_ = rendezvous.store();
  comm->p2p_send_seq_.assign(n, 0);
  comm->p2p_recv_seq_.assign(n, 0);

  // Selector: table, environment overrides, debug switch.
  PLEXUS_ASSIGN_OR_RETURN(const bool env_debug, kDebugParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const std::string table_path, kTableParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const std::string algo_text, kAlgoParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const std::string yield_text, kYieldParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const bool use_mailboxes, kMailboxParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const std::string policy_text, kTransportPolicyParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const std::string env_host_id, kHostIdParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(options.trace, Tracer::Resolve(options.trace, rank));
  if (!policy_text.empty()) {
    auto policy = ParseTransportPolicy(policy_text);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kTransportPolicyParam.name(), ": ", std::string(policy.status().message())));
    }
    options.transport_policy = *policy;
  }
  std::optional<bool> yield;
  if (!yield_text.empty()) {
    PLEXUS_ASSIGN_OR_RETURN(yield, base::ParseBool(yield_text, kYieldParam.name()));
  }
  comm->debug_ = options.debug || env_debug;
  bool use_default_table = false;
  if (!options.table.rules().empty()) {
    comm->table_ = options.table;
  } else if (!table_path.empty()) {
    auto table = AlgorithmTable::Load(table_path);
    if (!table.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PLEXUS_COLL_TABLE: ", std::string(table.status().message())));
    }
    comm->table_ = *std::move(table);
  } else {
    use_default_table = true;  // set below, once the pairs' backends are known
  }
  if (!algo_text.empty()) {
    auto overrides = AlgorithmOverrides::Parse(algo_text);
    if (!overrides.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PLEXUS_COLL_ALGO: ", std::string(overrides.status().message())));
    }
    comm->env_overrides_ = *overrides;
  }

  // Every rank must agree on what shapes the messages; rank 0's nonce names the communicator.
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  // A caller's device connects every peer; otherwise the policy picks per pair of hosts.
  const TransportPolicy policy =
      device != nullptr ? TransportPolicy::kUniform : options.transport_policy;
  const std::string shape = absl::StrCat(
      std::string(transport::BackendName(options.device.backend)),
      policy == TransportPolicy::kPerPeer ? "/per_peer" : "/uniform", "/ch", options.channels,
      "/chunk", options.chunk_bytes, "/order", absl::StrJoin(options.ring_order, ","));
  // The host identity picks each peer's transport, counts the ranks sharing this machine and,
  // with their CPU sets, the CPUs they share (see yield_when_idle_).
  const std::string host = !options.host_id.empty() ? options.host_id
                           : !env_host_id.empty()   ? env_host_id
                                                    : base::HostName();
  if (host.find('|') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": host id '", host, "' contains '|'"));
  }
  PLEXUS_ASSIGN_OR_RETURN(
      const std::vector<std::string> shapes,
      rendezvous.AllGather(
          absl::StrCat("plexus/coll/create/", tag),
          absl::StrCat(nonce, "|", host, "|", absl::StrJoin(base::UsableCpus(), ","), "|", shape),
          options.connect_timeout));
  int local_ranks = 0;
  std::vector<int> local_cpus;
  std::vector<std::string> hosts(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<std::string> fields = absl::StrSplit(shapes[r], absl::MaxSplits('|', 3));
    if (fields.size() != 4 || fields[3] != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator options differ between ranks: rank ", rank, " has ", shape, ", rank ", r,
          " has ", fields.size() == 4 ? fields[3] : shapes[r],
          " (backend, transport policy, channels, chunk_bytes and ring_order must be equal on "
          "every rank)"));
    }
    if (r == 0 && !absl::SimpleAtoi(fields[0], &comm->uid_)) {
      return absl::DataLossError("malformed communicator id from rank 0");
    }
    hosts[r] = fields[1];
    if (fields[1] != host) continue;
    ++local_ranks;
    for (absl::string_view cpu : absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
      int id = 0;
      if (absl::SimpleAtoi(cpu, &id)) local_cpus.push_back(id);
    }
  }
  std::sort(local_cpus.begin(), local_cpus.end());
  const int shared_cpus =
      static_cast<int>(std::unique(local_cpus.begin(), local_cpus.end()) - local_cpus.begin());

  const bool oversubscribed = local_ranks > std::max(shared_cpus, 1);

  // Each pair's backend, the same on every rank (so are the defaults that follow from them).
  std::vector<std::vector<transport::Backend>> pairs =
      PairBackends(policy, options.device.backend, hosts);
  if (device != nullptr) {
    for (auto& row : pairs) row.assign(n, device->backend());
  }
  comm->peer_backend_ = pairs[rank];
  comm->peer_backend_[rank] = options.device.backend;
  bool any_tcp = options.device.backend == transport::Backend::kTcp && n == 1;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      any_tcp = any_tcp || (a != b && pairs[a][b] == transport::Backend::kTcp);
    }
  }
  if (use_default_table) comm->table_ = AlgorithmTable::Default(any_tcp);
  if (options.channels == 0) options.channels = any_tcp ? 2 : 1;
  if (options.chunk_bytes == 0) options.chunk_bytes = any_tcp ? size_t{512} << 10 : size_t{1} << 20;
  comm->layout_.channels = options.channels;
  comm->layout_.chunk_bytes = options.chunk_bytes;
  transport::DeviceOptions device_options = options.device;
  device_options.op_timeout = options.timeout;
  device_options.connect_timeout = options.connect_timeout;
  // Bulk shm messages stream through the ring (two copies) also when ranks outnumber CPUs: a
  // cross-memory-attach pull (one copy) from 256 KiB there made the sender wait for a receiver
  // that shares its CPU, and lost to the ring at 1 and 16 MiB (docs/measurements/collectives.md,
  // "What made the difference"). The transport's own threshold (2 MiB) stays. A lone one-way
  // message is pulled from 128 KiB when every rank can have a CPU: a 2-process broadcast's
  // whole message, or the first piece of a pipelined one (docs/measurements/collectives.md,
  // "Two ranks: one message, not two halves"); with 4 ranks on 2 CPUs it lost.
  if (!oversubscribed && device_options.shm.lone_cma_threshold == 0) {
    device_options.shm.lone_cma_threshold = kShmLonePullBytes;
  }
  comm->caller_device_ = device != nullptr;
  if (device == nullptr) {
    // options() reports the timeouts the devices use.
    options.device.op_timeout = device_options.op_timeout;
    options.device.connect_timeout = device_options.connect_timeout;
  }
  // What a live transport change rebuilds the connections from.
  comm->hosts_ = hosts;
  comm->device_options_ = device_options;
  comm->use_mailboxes_ = use_mailboxes;
  comm->use_default_table_ = use_default_table;
  ConnectionSpec spec = comm->MakeConnectionSpec(pairs, tag);
  spec.caller_device = device;  // options_ is not set yet: the fields read from it
  spec.channels = options.channels;
  spec.channel_local_addresses = options.channel_local_addresses;
  spec.timeout = options.connect_timeout;
  ConnectionSet set;
  // A rank whose devices do not open still takes part in the exchange: every rank fails at
  // once, naming it, instead of waiting for its addresses until the timeout.
  const absl::Status opened = OpenDevices(spec, {}, &set);
  MakeQueue(spec, &set);
  PLEXUS_RETURN_IF_ERROR(ConnectAll(rendezvous, spec, &set, set.cq.get(), opened));
  FindMailboxes(spec, &set);
  for (const auto& channel : set.conns) {
    for (const auto& c : channel) comm->connections_opened_ += c != nullptr ? 1 : 0;
  }
  comm->pair_backends_ = pairs;
  comm->conns_ = std::move(set);
  comm->call_layout_ = comm->layout_;
  CallEnv& env = comm->env_;
  env.rank = rank;
  env.n = n;
  env.timeout = options.timeout;
  // More ranks than CPUs on this host: a rank spinning for its peer takes the CPU the peer needs
  // to answer, so waiting ranks yield instead (as Open MPI does when oversubscribed).
  env.yield_when_idle = yield.value_or(oversubscribed);
  // How a waiting call waits: spin for options.spin (none when yielding at once), yield until
  // kYieldWindow, then sleep in the transport.
  env.wait =
      base::WaitPolicy(env.yield_when_idle ? absl::ZeroDuration() : options.spin, kYieldWindow);
  // A call without progress for timeout / 2 posts whom it waits for, and re-posts it every
  // timeout / 4 while it still waits.
  env.record_after = options.timeout / 2;
  env.record_every = options.timeout / 4;
  env.conns = &comm->conns_;
  env.peer_backend = &comm->peer_backend_;
  env.layout = &comm->layout_;
  CommunicatorImpl* self = comm.get();
  env.abort = [self](const CallHeader& header, Failure failure) {
    return self->Abort(header, std::move(failure));
  };
  comm->executor_.SetDepth(options.pipeline_depth);
  comm->executor_.SetChannels(options.channels);
  // A waiting rank refreshes its record every timeout / 4; one older than timeout / 2 (1 s at
  // least: a failing rank's announcement is not refreshed) belongs to a rank that stopped.
  comm->board_ = std::make_unique<internal::BlameBoard>(
      comm->store_, comm->uid_, rank, std::max(options.timeout / 2, absl::Seconds(1)));
  if (options.qos.enabled()) comm->qos_ = std::make_unique<QosGate>(options.qos, rank);
  comm->trace_ = Tracer::Create(options.trace, rank, n, comm->uid_, tag, host);
  comm->issue_.set_tracer(comm->trace_.get());
  env.board = comm->board_.get();
  env.qos = comm->qos_.get();
  env.trace = comm->trace_.get();
  comm->options_ = std::move(options);
  PLEXUS_RETURN_IF_ERROR(comm->StartReconfiguration());
  comm->ready_ = true;
  if (comm->debug_ && rank == 0) {
    base::Logf(base::LogLevel::kInfo,
               "[plexus-coll] communicator %llx: %d ranks over %s, %d channel(s), chunk %zu B, "
               "ring order [%s], %d rank(s) on %d CPU(s) here: %s\n[plexus-coll] selector "
               "table:\n%s",
               static_cast<unsigned long long>(comm->uid_), n,
               std::string(transport::BackendName(comm->options_.device.backend)).c_str(),
               comm->options_.channels, comm->options_.chunk_bytes,
               absl::StrJoin(comm->layout_.order, ",").c_str(), local_ranks, shared_cpus,
               env.yield_when_idle ? "waiting ranks yield" : "waiting ranks spin first",
               std::string(absl::StripTrailingAsciiWhitespace(comm->table_.ToString())));
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

// ---------------------------------------------------------------------------------------------
// Issue order

void IssueQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

absl::Status IssueQueue::RunOne(const Fn& fn, int64_t issued_ns) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      if (trace_ != nullptr) trace_->Refused(issued_ns, broken_);
      return broken_;
    }
  }
  if (trace_ == nullptr) return fn();
  trace_->Begin(issued_ns);
  absl::Status status = fn();
  trace_->End(status);
  return status;
}

absl::Status IssueQueue::Blocking(absl::StatusOr<Fn> task) {
  const int64_t issued = trace_ != nullptr ? Tracer::Now() : 0;
  PLEXUS_ASSIGN_OR_RETURN(Fn run, std::move(task));
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !busy_) {
    // Nothing queued before us: run in the caller's thread (no thread hop on the latency path).
    busy_ = true;
    lock.unlock();
    absl::Status status = RunOne(run, issued);
    lock.lock();
    busy_ = false;
    lock.unlock();
    cv_.notify_all();
    return status;
  }
  auto work = std::make_shared<WorkImpl>();
  queue_.push_back(Task{std::move(run), work, issued});
  if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  lock.unlock();
  cv_.notify_all();
  return work->Wait(absl::InfiniteDuration());
}

std::shared_ptr<Work> IssueQueue::Async(absl::StatusOr<Fn> task) {
  const int64_t issued = trace_ != nullptr ? Tracer::Now() : 0;
  if (!task.ok()) return FailedWork(task.status());
  auto work = std::make_shared<WorkImpl>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{*std::move(task), work, issued});
    if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  }
  cv_.notify_all();
  return work;
}

void IssueQueue::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    absl::Status status = RunOne(task.run, task.issued_ns);
    task.work->Complete(std::move(status));
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

absl::Status CommunicatorImpl::RunBlocking(const BlockingCall& c) {
  if (c.kind == CollectiveKind::kAllReduce) {
    PLEXUS_RETURN_IF_ERROR(CheckCommon("AllReduce", c.send, c.recv, c.count, c.dtype, c.op));
    PLEXUS_RETURN_IF_ERROR(CheckWire("AllReduce", c.dtype, c.options, true));
    if (auto done = TryInline(
            [&] { return RunAllReduce(c.send, c.recv, c.count, c.dtype, c.op, c.options); })) {
      return *std::move(done);
    }
  } else if (c.kind == CollectiveKind::kBarrier) {
    if (auto done = TryInline([&] { return RunBarrier(); })) return *std::move(done);
  }
  return Blocking(TaskOf(c));
}

CommunicatorImpl::TaskOr CommunicatorImpl::TaskOf(const BlockingCall& c) {
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      return AllReduceTask(c.send, c.recv, c.count, c.dtype, c.op, c.options);
    case CollectiveKind::kReduce:
      return ReduceTask(c.send, c.recv, c.count, c.dtype, c.op, c.root, c.options);
    case CollectiveKind::kBroadcast:
      return BroadcastTask(c.send, c.recv, c.count, c.dtype, c.root, c.options);
    case CollectiveKind::kAllGather:
      return AllGatherTask(c.send, c.recv, c.count, c.dtype, c.options);
    case CollectiveKind::kReduceScatter:
      return ReduceScatterTask(c.send, c.recv, c.count, c.dtype, c.op, c.options);
    case CollectiveKind::kAllToAll:
      return AllToAllTask(c.send, c.recv, c.count, c.dtype, c.options);
    case CollectiveKind::kAllToAllV:
      return AllToAllVTask(c.send, c.send_counts, c.send_displs, c.recv, c.recv_counts,
                           c.recv_displs, c.dtype, c.options);
    case CollectiveKind::kSendRecv:
      return c.is_send ? PointToPointTask(const_cast<void*>(c.send), c.count, c.dtype, c.peer, true)
                       : PointToPointTask(c.recv, c.count, c.dtype, c.peer, false);
    case CollectiveKind::kBarrier:
      return BarrierTask();
  }
  return absl::InvalidArgumentError("unknown collective");
}

// ---------------------------------------------------------------------------------------------
// Selection

Algorithm CommunicatorImpl::SelectAlgorithm(CollectiveKind kind, size_t bytes,
                                            Algorithm forced) const {
  return Resolve(kind, bytes, forced);
}

Algorithm CommunicatorImpl::Resolve(CollectiveKind kind, size_t bytes, Algorithm forced) const {
  Algorithm a = forced;
  if (a == Algorithm::kAuto) a = env_overrides_.Get(kind);
  if (a == Algorithm::kAuto) a = options_.algorithms.Get(kind);
  if (a == Algorithm::kAuto) a = table_.Select(kind, layout_.n, bytes);
  // Whole-vector doubling is an allreduce of its own; elsewhere it means halving-doubling.
  if (kind != CollectiveKind::kAllReduce && a == Algorithm::kRecursiveDoubling) {
    a = Algorithm::kHalvingDoubling;
  }
  switch (kind) {
    case CollectiveKind::kBroadcast:
      if (a == Algorithm::kHalvingDoubling) a = Algorithm::kTree;
      break;
    case CollectiveKind::kReduce:
      // Halving needs a power of two (each rank owns one block); elsewhere the tree.
      if (a == Algorithm::kHalvingDoubling && FindPlanBuilder(kind, a, layout_.n) == nullptr) {
        a = Algorithm::kTree;
      }
      break;
    case CollectiveKind::kBarrier:
      return Algorithm::kHalvingDoubling;
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kAllToAllV:
    case CollectiveKind::kSendRecv:
      return Algorithm::kRing;  // pairwise exchange; reported as ring
    default:
      break;
  }
  // One the collective does not implement at this world size (halving/doubling of AllGather and
  // ReduceScatter needs a power of two: each rank owns exactly one block) falls back to the ring.
  return FindPlanBuilder(kind, a, layout_.n) != nullptr ? a : Algorithm::kRing;
}

const Layout& CommunicatorImpl::MakeLayout(DataType dtype, size_t segment_bytes) {
  call_layout_.esize = DataTypeSize(dtype);
  call_layout_.chunk_bytes = layout_.chunk_bytes;
  call_layout_.channels = layout_.channels;
  if (segment_bytes > 0 && layout_.channels > 1) {
    constexpr size_t kMinChunk = size_t{64} << 10;
    const size_t per_channel = (segment_bytes + layout_.channels - 1) / layout_.channels;
    const size_t rounded = (per_channel + 4095) & ~size_t{4095};
    call_layout_.chunk_bytes =
        std::clamp(rounded, std::min(kMinChunk, layout_.chunk_bytes), layout_.chunk_bytes);
  }
  return call_layout_;
}

Plan& CommunicatorImpl::NewPlan() {
  plan_.sends.clear();
  plan_.recvs.clear();
  plan_.tx_extra.clear();
  plan_.rx_extra.clear();
  plan_.wire.reset();
  return plan_;
}

CallHeader CommunicatorImpl::Header(CollectiveKind kind, DataType dtype, ReduceOp op,
                                    Algorithm algorithm, int root, size_t count) {
  CallHeader h;
  h.kind = kind;
  h.dtype = dtype;
  h.op = IsReducing(kind) ? op : ReduceOp::kSum;
  h.algorithm = algorithm;
  h.root = root;
  h.sender = layout_.rank;
  h.count = count;
  h.communicator = uid_;
  h.sequence = collective_seq_++;
  h.epoch = config_epoch_;
  if (trace_ != nullptr) trace_->Describe(h);
  if (debug_) {
    base::Logf(base::LogLevel::kInfo, "[plexus-coll rank %d] %s -> %s", layout_.rank,
               h.Describe().c_str(), std::string(AlgorithmName(algorithm)).c_str());
  }
  return h;
}

uint8_t* CommunicatorImpl::Scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

absl::Status CommunicatorImpl::CheckCommon(const char* what, const void* send, const void* recv,
                                           size_t count, DataType dtype, ReduceOp op,
                                           int root) const {
  if (static_cast<unsigned>(dtype) >= kNumDataTypes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": invalid data type"));
  }
  if (static_cast<unsigned>(op) >= kNumReduceOps) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": invalid reduction"));
  }
  if (root < 0 || root >= layout_.n) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": root ", root, " is not a rank of this ",
                                                   layout_.n, "-rank communicator"));
  }
  if (count > (size_t{1} << 40) / DataTypeSize(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count ", count, " is too large"));
  }
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer with count ", count));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Split

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorImpl::Split(int color, int key) {
  const int n = layout_.n;
  std::vector<int64_t> mine = {color < 0 ? -1 : color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  if (absl::Status s = AllGather(mine.data(), all.data(), 2, DataType::kI64, {}); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("Split: exchanging colors: ", std::string(s.message())));
  }
  const int split = split_count_++;
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  std::vector<int> child_rank_of(n, -1);
  for (size_t i = 0; i < members.size(); ++i) child_rank_of[members[i]] = static_cast<int>(i);
  CommunicatorOptions options = options_;
  options.ring_order.clear();
  for (int r : layout_.order) {
    if (child_rank_of[r] >= 0) options.ring_order.push_back(child_rank_of[r]);
  }
  PLEXUS_ASSIGN_OR_RETURN(transport::Rendezvous rendezvous,
                          transport::Rendezvous::Create(child_rank_of[layout_.rank],
                                                        static_cast<int>(members.size()), store_));
  return Make(rendezvous, std::move(options),
              absl::StrCat(tag_, "/", uid_, "/split", split, "/color", color),
              caller_device_ ? conns_.devices.front() : nullptr);
}

}  // namespace plexus::collectives::internal

namespace plexus::collectives {

absl::Status Communicator::RunBlocking(const BlockingCall& call) {
  return IssueAsync(call)->Wait(absl::InfiniteDuration());
}

std::shared_ptr<Work> Communicator::IssueAsync(const BlockingCall& c) {
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      return AllReduceAsync(c.send, c.recv, c.count, c.dtype, c.op, c.options);
    case CollectiveKind::kReduce:
      return ReduceAsync(c.send, c.recv, c.count, c.dtype, c.op, c.root, c.options);
    case CollectiveKind::kBroadcast:
      return BroadcastAsync(c.send, c.recv, c.count, c.dtype, c.root, c.options);
    case CollectiveKind::kAllGather:
      return AllGatherAsync(c.send, c.recv, c.count, c.dtype, c.options);
    case CollectiveKind::kReduceScatter:
      return ReduceScatterAsync(c.send, c.recv, c.count, c.dtype, c.op, c.options);
    case CollectiveKind::kAllToAll:
      return AllToAllAsync(c.send, c.recv, c.count, c.dtype, c.options);
    case CollectiveKind::kAllToAllV:
      return AllToAllVAsync(c.send, c.send_counts, c.send_displs, c.recv, c.recv_counts,
                            c.recv_displs, c.dtype, c.options);
    case CollectiveKind::kSendRecv:
      return c.is_send ? SendAsync(c.send, c.count, c.dtype, c.peer)
                       : RecvAsync(c.recv, c.count, c.dtype, c.peer);
    case CollectiveKind::kBarrier:
      return BarrierAsync();
  }
  return internal::FailedWork(absl::InvalidArgumentError("unknown collective"));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    transport::Rendezvous& rendezvous, CommunicatorOptions options) {
  return internal::CommunicatorImpl::Make(rendezvous, std::move(options), "coll");
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    transport::Rendezvous& rendezvous, std::shared_ptr<transport::Device> device,
    CommunicatorOptions options) {
  if (device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Communicator::Create on rank ", rendezvous.rank(), ": the device is null"));
  }
  return internal::CommunicatorImpl::Make(rendezvous, std::move(options), "coll",
                                          std::move(device));
}

}  // namespace plexus::collectives
