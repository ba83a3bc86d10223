#include "plexus/collectives/communicator.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "blame.hpp"
#include "cuda_staging.hpp"
#include "plan.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/mesh.hpp"
#include "reduce.hpp"
#include "wire.hpp"

namespace plexus::collectives {
namespace {

using internal::Block;
using internal::CallHeader;
using internal::Layout;
using internal::Plan;
using transport::Completion;
using transport::ConstBuffer;
using transport::MutableBuffer;

constexpr size_t kHeaderBytes = CallHeader::kEncodedSize;

// The header of a mailbox message: enough to check that both ranks are in the same call (the
// fields CallHeader::SameCall compares, but the communicator id: mailboxes are per connection).
struct MailHeader {
  static constexpr uint8_t kMagic = 0xC5;
  uint8_t magic = kMagic;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t algorithm = 0;
  uint8_t reserved[3] = {};
  uint32_t count = 0;
  int32_t root = -1;
  uint64_t sequence = 0;

  static MailHeader Of(const CallHeader& h) {
    MailHeader m;
    m.kind = static_cast<uint8_t>(h.kind);
    m.dtype = static_cast<uint8_t>(h.dtype);
    m.op = static_cast<uint8_t>(h.op);
    m.algorithm = static_cast<uint8_t>(h.algorithm);
    m.count = static_cast<uint32_t>(h.count);
    m.root = h.root;
    m.sequence = h.sequence;
    return m;
  }
  bool operator==(const MailHeader&) const = default;
  bool Valid() const {
    return magic == kMagic && kind < kNumCollectiveKinds && dtype < kNumDataTypes &&
           op < kNumReduceOps && algorithm < kNumAlgorithms;
  }
  // "allreduce #3 (count 2, f32, sum, halving_doubling)" for the peer's side of a mismatch.
  std::string Describe() const {
    if (!Valid()) return "a message that is not a Plexus collective";
    return absl::StrCat(std::string(CollectiveName(static_cast<CollectiveKind>(kind))), " #",
                        sequence, " (count ", count, ", ",
                        std::string(DataTypeName(static_cast<DataType>(dtype))), ", ",
                        std::string(ReduceOpName(static_cast<ReduceOp>(op))), ", ",
                        std::string(AlgorithmName(static_cast<Algorithm>(algorithm))),
                        root >= 0 ? absl::StrCat(", root ", root) : std::string(), ")");
  }
};
static_assert(sizeof(MailHeader) == 24);
constexpr size_t kMailHeaderBytes = sizeof(MailHeader);
constexpr size_t kMailFragmentBytes = transport::Mailbox::kMaxMessageBytes - kMailHeaderBytes;
// Fragments hold whole elements of every type: each is reduced on its own, in place.
static_assert(kMailFragmentBytes % 8 == 0);
// Allreduces up to this size go by mailbox when every peer has one: below it the mailbox's
// in-place polling beats a plan over the transport's rings (measured: the plan path takes over
// from 16 KiB on shm, docs/collectives.md).
constexpr size_t kMailboxPathBytes = 8192;

// Why a call failed, before Abort works out whom to blame (see blame.hpp).
struct Failure {
  enum class Kind {
    kOwn,    // this rank's own finding (mismatched calls): `own` is the error
    kPeer,   // the connection to `peer` failed with `why`
    kStall,  // no progress for the timeout while waiting for `waiting`
  };
  Kind kind = Kind::kOwn;
  absl::Status own;
  int peer = -1;
  absl::Status why;
  std::vector<int> waiting;

  static Failure Own(absl::Status status) {
    Failure f;
    f.own = std::move(status);
    return f;
  }
  static Failure Peer(int peer, absl::Status why) {
    Failure f;
    f.kind = Kind::kPeer;
    f.peer = peer;
    f.why = std::move(why);
    return f;
  }
  static Failure Stall(std::vector<int> waiting) {
    Failure f;
    f.kind = Kind::kStall;
    f.waiting = std::move(waiting);
    return f;
  }
};
// The blame for a failed connection to `peer`, worded to follow "rank <peer> ".
internal::Blame ConnectionBlame(int self, int peer, const absl::Status& why) {
  internal::Blame b;
  b.ranks = {peer};
  b.reporter = self;
  const std::string text(why.message());
  if (absl::IsDataLoss(why)) {
    b.code = absl::StatusCode::kDataLoss;
    b.reason = absl::StrCat("sent malformed data (", text, ")");
  } else if (absl::IsDeadlineExceeded(why)) {
    b.code = absl::StatusCode::kDeadlineExceeded;
    b.reason = absl::StrCat("made no progress (", text, "): hung or unreachable");
  } else if (absl::IsAborted(why)) {
    b.code = absl::StatusCode::kUnavailable;
    b.reason = absl::StrCat("closed its connection (", text, "): it aborted");
  } else {
    b.code = absl::StatusCode::kUnavailable;
    b.reason = absl::StrCat("died or is unreachable (connection failed: ", text, ")");
  }
  return b;
}
absl::Status MismatchedCalls(int rank, const std::string& call, int peer, const std::string& theirs,
                             const std::string& why = "") {
  return absl::FailedPreconditionError(absl::StrCat("mismatched collective calls: rank ", rank,
                                                    " is in ", call, " but rank ", peer, " sent ",
                                                    theirs, why));
}
// How long a waiting call polls the transport (yielding the CPU between polls) before it sleeps.
constexpr absl::Duration kYieldWindow = absl::Milliseconds(2);

const base::Param<bool> kDebugParam("PLEXUS_COLL_DEBUG", false,
                                    "print each communicator's setup and algorithm choices");
const base::Param<std::string> kTableParam("PLEXUS_COLL_TABLE", "",
                                           "algorithm table file (docs/collectives.md)");
const base::Param<std::string> kAlgoParam("PLEXUS_COLL_ALGO", "",
                                          "algorithm overrides, e.g. allreduce=ring");
const base::Param<std::string> kYieldParam(
    "PLEXUS_COLL_YIELD", "", "waiting ranks yield the CPU: 1/0 (default: when oversubscribed)");
const base::Param<bool> kMailboxParam("PLEXUS_COLL_MAILBOX", true,
                                      "small collectives over shm/inproc mailboxes");

bool IsReducing(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kReduceScatter;
}

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

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

std::shared_ptr<Work> FailedWork(absl::Status status) {
  auto work = std::make_shared<WorkImpl>();
  work->Complete(std::move(status));
  return work;
}

// ---------------------------------------------------------------------------------------------
// Host staging of device buffers for one call.

class Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    for (void* p : pinned_) internal::FreePinned(p);
  }
  // A host pointer holding `bytes` of `user` (copied in when `copy_in`); `user` itself when it
  // is host memory.
  absl::StatusOr<uint8_t*> In(const void* user, size_t bytes, bool copy_in) {
    if (user == nullptr || !internal::IsDevicePointer(user)) {
      return static_cast<uint8_t*>(const_cast<void*>(user));
    }
    void* host = internal::AllocPinned(bytes);
    if (host == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of pinned host memory for staging"));
    }
    pinned_.push_back(host);
    if (copy_in) {
      if (absl::Status s = internal::CopyDeviceToHost(host, user, bytes); !s.ok()) return s;
    }
    staged_.push_back({const_cast<void*>(user), host, bytes});
    return static_cast<uint8_t*>(host);
  }
  // Registers `user` as an output: Out() copies the host bytes back.
  absl::StatusOr<uint8_t*> Output(void* user, size_t bytes, bool copy_in) {
    auto host = In(user, bytes, copy_in);
    if (host.ok() && *host != user) outputs_.push_back(staged_.back());
    return host;
  }
  absl::Status CopyOut() {
    for (const Entry& e : outputs_) {
      if (absl::Status s = internal::CopyHostToDevice(e.user, e.host, e.bytes); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  bool any() const { return !staged_.empty(); }

 private:
  struct Entry {
    void* user;
    void* host;
    size_t bytes;
  };
  std::vector<void*> pinned_;
  std::vector<Entry> staged_;
  std::vector<Entry> outputs_;
};

// ---------------------------------------------------------------------------------------------
// The communicator

struct Task {
  std::function<absl::Status()> run;
  std::shared_ptr<WorkImpl> work;
};

class CommunicatorImpl : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<Communicator>> Make(transport::Rendezvous& rendezvous,
                                                            CommunicatorOptions options,
                                                            const std::string& tag);
  ~CommunicatorImpl() override;

  int rank() const override { return layout_.rank; }
  int size() const override { return layout_.n; }
  const std::vector<int>& ring_order() const override { return layout_.order; }
  const CommunicatorOptions& options() const override { return options_; }
  Algorithm SelectAlgorithm(CollectiveKind kind, size_t bytes, Algorithm forced) const override;
  absl::Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                         CallOptions call) override {
    if (absl::Status s = CheckCommon("AllReduce", send, recv, count, dtype, op); !s.ok()) return s;
    if (auto done = TryInline([&] { return RunAllReduce(send, recv, count, dtype, op, call); })) {
      return *std::move(done);
    }
    return Blocking(AllReduceTask(send, recv, count, dtype, op, call));
  }
  std::shared_ptr<Work> AllReduceAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       ReduceOp op, CallOptions call) override {
    return Async(AllReduceTask(send, recv, count, dtype, op, call));
  }
  absl::Status Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                      int root, CallOptions call) override {
    return Blocking(ReduceTask(send, recv, count, dtype, op, root, call));
  }
  std::shared_ptr<Work> ReduceAsync(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op, int root, CallOptions call) override {
    return Async(ReduceTask(send, recv, count, dtype, op, root, call));
  }
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                         CallOptions call) override {
    return Blocking(BroadcastTask(send, recv, count, dtype, root, call));
  }
  std::shared_ptr<Work> BroadcastAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       int root, CallOptions call) override {
    return Async(BroadcastTask(send, recv, count, dtype, root, call));
  }
  absl::Status AllGather(const void* send, void* recv, size_t count, DataType dtype,
                         CallOptions call) override {
    return Blocking(AllGatherTask(send, recv, count, dtype, call));
  }
  std::shared_ptr<Work> AllGatherAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       CallOptions call) override {
    return Async(AllGatherTask(send, recv, count, dtype, call));
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op, CallOptions call) override {
    return Blocking(ReduceScatterTask(send, recv, count, dtype, op, call));
  }
  std::shared_ptr<Work> ReduceScatterAsync(const void* send, void* recv, size_t count,
                                           DataType dtype, ReduceOp op, CallOptions call) override {
    return Async(ReduceScatterTask(send, recv, count, dtype, op, call));
  }
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype,
                        CallOptions call) override {
    return Blocking(AllToAllTask(send, recv, count, dtype, call));
  }
  std::shared_ptr<Work> AllToAllAsync(const void* send, void* recv, size_t count, DataType dtype,
                                      CallOptions call) override {
    return Async(AllToAllTask(send, recv, count, dtype, call));
  }
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DataType dtype, CallOptions call) override {
    return Blocking(
        AllToAllVTask(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, call));
  }
  std::shared_ptr<Work> AllToAllVAsync(const void* send, absl::Span<const size_t> send_counts,
                                       absl::Span<const size_t> send_displs, void* recv,
                                       absl::Span<const size_t> recv_counts,
                                       absl::Span<const size_t> recv_displs, DataType dtype,
                                       CallOptions call) override {
    return Async(
        AllToAllVTask(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, call));
  }
  absl::Status Send(const void* send, size_t count, DataType dtype, int peer) override {
    return Blocking(PointToPointTask(const_cast<void*>(send), count, dtype, peer, true));
  }
  std::shared_ptr<Work> SendAsync(const void* send, size_t count, DataType dtype,
                                  int peer) override {
    return Async(PointToPointTask(const_cast<void*>(send), count, dtype, peer, true));
  }
  absl::Status Recv(void* recv, size_t count, DataType dtype, int peer) override {
    return Blocking(PointToPointTask(recv, count, dtype, peer, false));
  }
  std::shared_ptr<Work> RecvAsync(void* recv, size_t count, DataType dtype, int peer) override {
    return Async(PointToPointTask(recv, count, dtype, peer, false));
  }
  absl::Status Barrier() override {
    if (auto done = TryInline([&] { return RunBarrier(); })) return *std::move(done);
    return Blocking(BarrierTask());
  }
  std::shared_ptr<Work> BarrierAsync() override { return Async(BarrierTask()); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  // A task, or the validation error that stops it from being queued.
  using TaskOr = absl::StatusOr<std::function<absl::Status()>>;

  CommunicatorImpl() = default;

  absl::Status Blocking(TaskOr task);
  // Runs fn in the caller's thread when no call is queued or running (the latency path: no
  // closure, no thread hop); nullopt when it must queue.
  template <typename Fn>
  std::optional<absl::Status> TryInline(Fn&& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || busy_) return std::nullopt;
    if (!broken_.ok()) return broken_;
    busy_ = true;
    lock.unlock();
    absl::Status status = fn();
    lock.lock();
    busy_ = false;
    const bool worker = worker_.joinable();
    lock.unlock();
    if (worker) cv_.notify_all();
    return status;
  }
  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                            CallOptions call);
  absl::Status RunBarrier();
  std::shared_ptr<Work> Async(TaskOr task);
  absl::Status RunOne(const std::function<absl::Status()>& fn);
  void WorkerLoop();

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
  TaskOr BarrierTask();

  absl::Status CheckCommon(const char* what, const void* send, const void* recv, size_t count,
                           DataType dtype, ReduceOp op = ReduceOp::kSum, int root = 0) const;
  // The algorithm used, after falling back from ones the collective does not implement.
  Algorithm Resolve(CollectiveKind kind, size_t bytes, Algorithm forced) const;
  // The layout for elements of `dtype` (valid until the next call; calls run one at a time).
  // With `segment_bytes` (what one ring step moves), chunks shrink so that each step still
  // spreads over every channel and reductions overlap transfers.
  const Layout& MakeLayout(DataType dtype, size_t segment_bytes = 0);
  // An empty plan reusing the previous call's storage (no allocations on the latency path).
  Plan& NewPlan();
  CallHeader Header(CollectiveKind kind, DataType dtype, ReduceOp op, Algorithm algorithm, int root,
                    size_t count);
  uint8_t* Scratch(size_t bytes);

  // Small allreduce (and barrier) by recursive doubling over the connections' mailboxes, when
  // every peer connection has one (shm, inproc) and the vector fits one mailbox message:
  // polled in place, no completion queue. Same pairs and reduction order as the plan-based
  // recursive doubling, so the results are the same bits.
  bool FitsMailbox(size_t bytes) const { return mailboxes_ready_ && bytes <= kMailboxPathBytes; }
  absl::Status MailboxAllReduce(uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                                const CallHeader& header);
  // What arrives in a MailExchange: from rank `from` (-1: nothing), placed at `dst` or, with
  // `reduce`, folded into it (dst = dst op incoming; incoming op dst with src_first).
  struct MailInbound {
    int from = -1;
    uint8_t* dst = nullptr;
    bool reduce = false;
    bool src_first = false;
  };
  // Sends `bytes` of `data` to rank `to` (-1: nothing) and receives as many as `in` says, as
  // fragments of one mailbox message each, interleaved so that two ranks exchanging more than an
  // inbox holds never wait on each other. Incoming fragments are reduced straight from the
  // peer's slot; fragment k only after this rank's fragment k left (data may be dst).
  absl::Status MailExchange(int to, const uint8_t* data, const MailInbound& in, size_t bytes,
                            DataType dtype, ReduceOp op, const CallHeader& header);
  // A peer that sent this call's first message by mailbox while this rank runs a plan: the
  // ranks disagree on the call. OK when no such message waits.
  absl::Status CheckMailboxes(const CallHeader& header);

  // Runs a plan to completion over the connections; the first message of the call on each
  // connection carries `header`.
  absl::Status Execute(const Plan& plan, const CallHeader& header, DataType dtype, ReduceOp op);
  // Works out whom `failure` blames (the rank that failed first, not one that aborted in
  // reaction: see blame.hpp), publishes that for the peers, marks the communicator broken with
  // the resulting error (naming every rank whose connection is down) and closes every
  // connection so that the peers fail fast too. Takes at most the blame grace (stalls) or
  // ~0.3 s (failed connections) beyond the failure.
  absl::Status Abort(const CallHeader& header, Failure failure);
  std::string DownRanks();
  // The ranks a stalled plan waits for: those with a receive posted but not arrived or a send
  // in flight (what is not posted yet waits for these); failing that, any with work left.
  std::vector<int> WaitingFor(int channels) const;

  CommunicatorOptions options_;
  Layout layout_;
  std::string tag_;
  uint64_t uid_ = 0;
  int split_count_ = 0;
  std::shared_ptr<transport::Store> store_;
  // This rank's wait records and failure account on the store (blame.hpp).
  std::unique_ptr<internal::BlameBoard> board_;
  // A call without progress for this long posts whom it waits for, and re-posts it this often
  // while it still waits (timeout / 2 and / 4).
  absl::Duration wait_record_after_;
  absl::Duration wait_record_every_;
  AlgorithmTable table_;
  AlgorithmOverrides env_overrides_;
  bool debug_ = false;

  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  // conns_[channel][rank]; null for this rank.
  std::vector<std::vector<std::unique_ptr<transport::Connection>>> conns_;
  absl::flat_hash_map<uint64_t, int> peer_of_connection_;

  // Issue-order execution.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
  absl::Status broken_;  // guarded by mu_

  // State of the executing call (one at a time).
  uint64_t collective_seq_ = 0;
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  std::vector<uint8_t> scratch_;
  struct Link {
    std::vector<int> sends, recvs;  // op indices in order
    size_t next_send = 0, next_recv = 0, low_recv = 0;
    int sends_in_flight = 0;
    size_t slot_stride = 0;
    std::vector<uint8_t> slots;
    size_t slots_taken = 0;       // receives posted into slots (slot = slots_taken % depth)
    std::vector<int> slot_owner;  // per slot: the receive using it, -1 if none yet
    uint8_t tx_header[kHeaderBytes];
  };
  std::vector<Link> links_;
  Layout call_layout_;
  Plan plan_;
  // Execute's per-call state, kept to reuse its storage.
  std::vector<size_t> max_recv_;
  std::vector<int> reduce_order_;
  enum : uint8_t { kIdle = 0, kPosted = 1, kArrived = 2, kDone = 3 };  // per send / receive
  std::vector<uint8_t> send_state_, recv_state_;
  std::vector<uint8_t*> recv_landing_;
  std::vector<int> slot_copies_;
  uint64_t epoch_ = 0;
  // Oversubscribed host (or PLEXUS_COLL_YIELD=1): waiting ranks yield at once instead of
  // spinning for options_.spin first.
  bool yield_when_idle_ = false;
  bool ready_ = false;  // fully connected (Make succeeded)
  // mailboxes_[rank]: the channel-0 connection's mailbox (null for this rank).
  std::vector<transport::Mailbox*> mailboxes_;
  bool mailboxes_ready_ = false;  // every peer connection has one
};

CommunicatorImpl::~CommunicatorImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Destruction is collective (as MPI_Comm_free): a peer may still be receiving what this rank
  // sent last, and closing now would fail its receives. After the barrier every rank has
  // finished every call it issued before.
  if (ready_ && layout_.n > 1 && health().ok()) {
    (void)RunOne(BarrierTask().value());
  }
  // A healthy communicator leaves nothing on the store: the barrier's last progress retracted
  // any wait record; see that the removal is written. A broken one leaves its account (one key
  // per rank) for peers still resolving whom to blame.
  if (board_ != nullptr && health().ok()) {
    board_->Retract();
    board_->Flush(absl::Now() + std::min(options_.timeout, absl::Seconds(1)));
  }
  for (auto& channel : conns_) {
    for (auto& c : channel) {
      if (c) c->Close();
    }
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> CommunicatorImpl::Make(
    transport::Rendezvous& rendezvous, CommunicatorOptions options, const std::string& tag) {
  const int n = rendezvous.world_size();
  const int rank = rendezvous.rank();
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
  if (options.channels < 0 || options.channels > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be 0 (default) to 64, got ", options.channels));
  }
  if (options.channels == 0) options.channels = options.backend == transport::Backend::kTcp ? 2 : 1;
  if (options.chunk_bytes == 0) {
    options.chunk_bytes =
        options.backend == transport::Backend::kTcp ? size_t{512} << 10 : size_t{1} << 20;
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes > (size_t{1} << 30)) {
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

  std::unique_ptr<CommunicatorImpl> comm(new CommunicatorImpl());
  comm->layout_.rank = rank;
  comm->layout_.n = n;
  comm->layout_.order = options.ring_order;
  comm->layout_.position = position;
  comm->layout_.channels = options.channels;
  comm->layout_.chunk_bytes = options.chunk_bytes;
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
  std::optional<bool> yield;
  if (!yield_text.empty()) {
    PLEXUS_ASSIGN_OR_RETURN(yield, base::ParseBool(yield_text, kYieldParam.name()));
  }
  comm->debug_ = options.debug || env_debug;
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
    comm->table_ = AlgorithmTable::Default();
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
  const std::string shape =
      absl::StrCat(std::string(transport::BackendName(options.backend)), "/ch", options.channels,
                   "/chunk", options.chunk_bytes, "/order", absl::StrJoin(options.ring_order, ","));
  // The host name counts the ranks sharing this machine and their CPU sets the CPUs they share
  // (see yield_when_idle_).
  const std::string host = base::HostName();
  auto shapes = rendezvous.AllGather(
      absl::StrCat("plexus/coll/create/", tag),
      absl::StrCat(nonce, "|", host, "|", absl::StrJoin(base::UsableCpus(), ","), "|", shape),
      options.connect_timeout);
  if (!shapes.ok()) return shapes.status();
  int local_ranks = 0;
  std::vector<int> local_cpus;
  for (int r = 0; r < n; ++r) {
    const std::vector<std::string> fields = absl::StrSplit((*shapes)[r], absl::MaxSplits('|', 3));
    if (fields.size() != 4 || fields[3] != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator options differ between ranks: rank ", rank, " has ", shape, ", rank ", r,
          " has ", fields.size() == 4 ? fields[3] : (*shapes)[r],
          " (backend, channels, chunk_bytes and ring_order must be equal on every rank)"));
    }
    if (r == 0 && !absl::SimpleAtoi(fields[0], &comm->uid_)) {
      return absl::DataLossError("malformed communicator id from rank 0");
    }
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
  transport::DeviceOptions device_options;
  device_options.backend = options.backend;
  device_options.progress = options.progress;
  device_options.local_address = options.local_address;
  device_options.sockets_per_connection = options.sockets_per_connection;
  device_options.op_timeout = options.timeout;
  device_options.connect_timeout = options.connect_timeout;
  // Ranks outnumber the CPUs they share: every copy costs a CPU some rank is waiting for, so
  // bulk shm messages take one copy (cross-memory attach) rather than two through the ring from
  // 256 KiB (measured, 4 ranks on 2 CPUs: 1 MiB allreduce 2.6 -> 3.0-3.3 GB/s busbw; with a CPU
  // per rank the ring stays faster below 2 MiB).
  if (oversubscribed) device_options.shm_cma_threshold = size_t{256} << 10;
  if (n > 1) {
    auto device = transport::Device::Create(device_options);
    if (!device.ok()) return device.status();
    comm->device_ = *std::move(device);
    comm->cq_ = comm->device_->CreateCompletionQueue();
    for (int c = 0; c < options.channels; ++c) {
      auto mesh = transport::ConnectFullMesh(rendezvous, *comm->device_, comm->cq_.get(),
                                             absl::StrCat(tag, "/ch", c), options.connect_timeout);
      if (!mesh.ok()) {
        return absl::Status(mesh.status().code(),
                            absl::StrCat("connecting channel ", c, " of the communicator: ",
                                         std::string(mesh.status().message())));
      }
      for (int r = 0; r < n; ++r) {
        if ((*mesh)[r]) comm->peer_of_connection_[(*mesh)[r]->id()] = r;
      }
      comm->conns_.push_back(*std::move(mesh));
    }
  }
  comm->links_.resize(static_cast<size_t>(n) * options.channels);
  comm->mailboxes_.assign(n, nullptr);
  comm->mailboxes_ready_ = n > 1 && !comm->conns_.empty();
  for (int r = 0; r < n && comm->mailboxes_ready_; ++r) {
    if (r == rank) continue;
    comm->mailboxes_[r] = comm->conns_[0][r]->mailbox();
    comm->mailboxes_ready_ = comm->mailboxes_[r] != nullptr;
  }
  if (!use_mailboxes) comm->mailboxes_ready_ = false;
  comm->call_layout_ = comm->layout_;
  // More ranks than CPUs on this host: a rank spinning for its peer takes the CPU the peer needs
  // to answer, so waiting ranks yield instead (as Open MPI does when oversubscribed).
  comm->yield_when_idle_ = yield.value_or(oversubscribed);
  comm->wait_record_after_ = options.timeout / 2;
  comm->wait_record_every_ = options.timeout / 4;
  // A waiting rank refreshes its record every timeout / 4; one older than timeout / 2 (1 s at
  // least: a failing rank's announcement is not refreshed) belongs to a rank that stopped.
  comm->board_ = std::make_unique<internal::BlameBoard>(
      comm->store_, comm->uid_, rank, std::max(options.timeout / 2, absl::Seconds(1)));
  comm->options_ = std::move(options);
  comm->ready_ = true;
  if (comm->debug_ && rank == 0) {
    std::fprintf(stderr,
                 "[plexus-coll] communicator %llx: %d ranks over %s, %d channel(s), chunk %zu B, "
                 "ring order [%s], %d rank(s) on %d CPU(s) here: %s\n[plexus-coll] selector "
                 "table:\n%s",
                 static_cast<unsigned long long>(comm->uid_), n,
                 std::string(transport::BackendName(comm->options_.backend)).c_str(),
                 comm->options_.channels, comm->options_.chunk_bytes,
                 absl::StrJoin(comm->layout_.order, ",").c_str(), local_ranks, shared_cpus,
                 comm->yield_when_idle_ ? "waiting ranks yield" : "waiting ranks spin first",
                 comm->table_.ToString().c_str());
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

// ---------------------------------------------------------------------------------------------
// Issue order

absl::Status CommunicatorImpl::RunOne(const std::function<absl::Status()>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
  }
  return fn();
}

absl::Status CommunicatorImpl::Blocking(TaskOr task) {
  if (!task.ok()) return task.status();
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !busy_) {
    // Nothing queued before us: run in the caller's thread (no thread hop on the latency path).
    busy_ = true;
    lock.unlock();
    absl::Status status = RunOne(*task);
    lock.lock();
    busy_ = false;
    lock.unlock();
    cv_.notify_all();
    return status;
  }
  auto work = std::make_shared<WorkImpl>();
  queue_.push_back(Task{*std::move(task), work});
  if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  lock.unlock();
  cv_.notify_all();
  return work->Wait(absl::InfiniteDuration());
}

std::shared_ptr<Work> CommunicatorImpl::Async(TaskOr task) {
  if (!task.ok()) return FailedWork(task.status());
  auto work = std::make_shared<WorkImpl>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{*std::move(task), work});
    if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  }
  cv_.notify_all();
  return work;
}

void CommunicatorImpl::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    absl::Status status = RunOne(task.run);
    task.work->Complete(std::move(status));
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
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
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return a;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce:
      return a == Algorithm::kHalvingDoubling ? Algorithm::kTree : a;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      // Halving/doubling needs a power of two here (each rank owns exactly one block).
      return a == Algorithm::kHalvingDoubling && IsPowerOfTwo(layout_.n) ? a : Algorithm::kRing;
    case CollectiveKind::kBarrier:
      return Algorithm::kHalvingDoubling;
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kAllToAllV:
    case CollectiveKind::kSendRecv:
      return Algorithm::kRing;  // pairwise exchange; reported as ring
  }
  return a;
}

const Layout& CommunicatorImpl::MakeLayout(DataType dtype, size_t segment_bytes) {
  call_layout_.esize = DataTypeSize(dtype);
  call_layout_.chunk_bytes = layout_.chunk_bytes;
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
  if (debug_) {
    std::fprintf(stderr, "[plexus-coll rank %d] %s -> %s\n", layout_.rank, h.Describe().c_str(),
                 std::string(AlgorithmName(algorithm)).c_str());
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
// Collectives

CommunicatorImpl::TaskOr CommunicatorImpl::AllReduceTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, ReduceOp op,
                                                         CallOptions call) {
  if (absl::Status s = CheckCommon("AllReduce", send, recv, count, dtype, op); !s.ok()) return s;
  return [=, this] { return RunAllReduce(send, recv, count, dtype, op, call); };
}

absl::Status CommunicatorImpl::RunAllReduce(const void* send, void* recv, size_t count,
                                            DataType dtype, ReduceOp op, CallOptions call) {
  const size_t bytes = count * DataTypeSize(dtype);
  const Algorithm algo = Resolve(CollectiveKind::kAllReduce, bytes, call.algorithm);
  const CallHeader header = Header(CollectiveKind::kAllReduce, dtype, op, algo, -1, count);
  if (count == 0) return absl::OkStatus();
  Staging staging;
  auto buf = staging.Output(recv, bytes, send == recv);
  if (!buf.ok()) return buf.status();
  const Layout& L =
      MakeLayout(dtype, algo == Algorithm::kRing ? bytes / static_cast<size_t>(layout_.n) : 0);
  // Below a block per rank (or when latency dominates) whole-vector doubling is cheaper.
  const bool recursive_doubling = bytes <= 16384 || count < static_cast<size_t>(L.n);
  const uint8_t* input = nullptr;  // out of place: where this rank's operand is
  if (send != recv) {
    auto in = staging.In(send, bytes, true);
    if (!in.ok()) return in.status();
    input = *in;
    // Ring and halving-doubling (power-of-two worlds) read their operand straight from the
    // input: every block of the output is written by a reduction or a receive. The others
    // start from a copy.
    const bool overlap = input < *buf + bytes && *buf < input + bytes;
    const bool direct = algo == Algorithm::kRing || (algo == Algorithm::kHalvingDoubling &&
                                                     IsPowerOfTwo(L.n) && !recursive_doubling);
    if (!direct || L.n == 1 || overlap) {
      std::memmove(*buf, input, bytes);
      input = nullptr;
    }
  }
  if (algo == Algorithm::kHalvingDoubling && recursive_doubling && FitsMailbox(bytes)) {
    if (absl::Status s = MailboxAllReduce(*buf, count, dtype, op, header); !s.ok()) return s;
  } else {
    Plan& plan = NewPlan();
    switch (algo) {
      case Algorithm::kHalvingDoubling:
        if (recursive_doubling) {
          internal::BuildRecursiveDoubling(L, *buf, count, &plan);
        } else {
          internal::BuildHalvingDoubling(L, *buf, count, &plan, input);
        }
        break;
      case Algorithm::kTree:
        internal::BuildDoubleTreeAllReduce(L, *buf, count, &plan);
        break;
      default:
        internal::BuildRing(L, *buf, internal::EvenBlocks(count, L.n), true, true, &plan, input);
        break;
    }
    if (absl::Status s = Execute(plan, header, dtype, op); !s.ok()) return s;
  }
  if (op == ReduceOp::kAvg && staging.any()) {
    // A device result: copy the sum back and divide it there (reduce_kernels.cu).
    if (absl::Status s = staging.CopyOut(); !s.ok()) return s;
    return internal::DeviceDivide(dtype, recv, count, L.n);
  }
  if (op == ReduceOp::kAvg) internal::DivideInPlace(dtype, *buf, count, L.n);
  return staging.CopyOut();
}

CommunicatorImpl::TaskOr CommunicatorImpl::ReduceTask(const void* send, void* recv, size_t count,
                                                      DataType dtype, ReduceOp op, int root,
                                                      CallOptions call) {
  const bool is_root = root == layout_.rank;
  if (absl::Status s = CheckCommon("Reduce", send, is_root ? recv : send, count, dtype, op, root);
      !s.ok()) {
    return s;
  }
  return [=, this]() -> absl::Status {
    const size_t bytes = count * DataTypeSize(dtype);
    const Algorithm algo = Resolve(CollectiveKind::kReduce, bytes, call.algorithm);
    const CallHeader header = Header(CollectiveKind::kReduce, dtype, op, algo, root, count);
    if (count == 0) return absl::OkStatus();
    Staging staging;
    auto in = staging.In(send, bytes, true);
    if (!in.ok()) return in.status();
    uint8_t* buf = nullptr;
    if (is_root) {
      auto out = staging.Output(recv, bytes, false);
      if (!out.ok()) return out.status();
      buf = *out;
    } else {
      buf = Scratch(bytes);
    }
    if (buf != *in) std::memmove(buf, *in, bytes);
    const Layout& L = MakeLayout(dtype);
    const int root_pos = L.position[root];
    Plan& plan = NewPlan();
    if (algo == Algorithm::kRing) {
      internal::BuildChainReduce(L, buf, count, root_pos, &plan);
    } else {
      internal::BuildTreeReduce(L, buf, count, root_pos, &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, op); !s.ok()) return s;
    if (!is_root) return absl::OkStatus();
    if (op == ReduceOp::kAvg) internal::DivideInPlace(dtype, buf, count, L.n);
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::BroadcastTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, int root,
                                                         CallOptions call) {
  const bool is_root = root == layout_.rank;
  if (absl::Status s =
          CheckCommon("Broadcast", is_root ? send : recv, recv, count, dtype, ReduceOp::kSum, root);
      !s.ok()) {
    return s;
  }
  return [=, this]() -> absl::Status {
    const size_t bytes = count * DataTypeSize(dtype);
    const Algorithm algo = Resolve(CollectiveKind::kBroadcast, bytes, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, algo, root, count);
    if (count == 0) return absl::OkStatus();
    Staging staging;
    auto buf = staging.Output(recv, bytes, is_root && send == recv);
    if (!buf.ok()) return buf.status();
    if (is_root && send != recv) {
      auto in = staging.In(send, bytes, true);
      if (!in.ok()) return in.status();
      std::memmove(*buf, *in, bytes);
    }
    const Layout& L = MakeLayout(dtype);
    if (algo == Algorithm::kTree && FitsMailbox(bytes)) {
      // Small: a binary tree over the positions counted from the root, by mailbox.
      const int i = ((L.pos() - L.position[root]) % L.n + L.n) % L.n;
      auto rank_at = [&](int index) { return L.at(L.position[root] + index); };
      if (i != 0) {
        if (absl::Status s = MailExchange(-1, nullptr, {rank_at((i - 1) / 2), *buf, false, false},
                                          bytes, dtype, ReduceOp::kSum, header);
            !s.ok()) {
          return s;
        }
      }
      for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
        if (absl::Status s =
                MailExchange(rank_at(child), *buf, {}, bytes, dtype, ReduceOp::kSum, header);
            !s.ok()) {
          return s;
        }
      }
      return staging.CopyOut();
    }
    Plan& plan = NewPlan();
    if (algo == Algorithm::kRing) {
      internal::BuildChainBroadcast(L, *buf, count, L.position[root], &plan);
    } else {
      internal::BuildTreeBroadcast(L, *buf, count, L.position[root], &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, ReduceOp::kSum); !s.ok()) return s;
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllGatherTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, CallOptions call) {
  if (absl::Status s = CheckCommon("AllGather", send, recv, count, dtype); !s.ok()) return s;
  return [=, this]() -> absl::Status {
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t total = count * n * esize;
    const Algorithm algo = Resolve(CollectiveKind::kAllGather, total, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kAllGather, dtype, ReduceOp::kSum, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    const size_t mine = static_cast<size_t>(layout_.rank) * count * esize;
    const bool in_place = send == static_cast<uint8_t*>(recv) + mine;
    Staging staging;
    auto buf = staging.Output(recv, total, in_place);
    if (!buf.ok()) return buf.status();
    if (!in_place) {
      auto in = staging.In(send, count * esize, true);
      if (!in.ok()) return in.status();
      std::memmove(*buf + mine, *in, count * esize);
    }
    const Layout& L = MakeLayout(dtype);
    if (algo == Algorithm::kHalvingDoubling && FitsMailbox(count * esize)) {
      // Small (the selector's halving-doubling range): pairwise exchange by mailbox (step d: to
      // rank + d, from rank - d); log2(n) doubling steps would move the same bytes, later.
      const int me = layout_.rank;
      for (int d = 1; d < n; ++d) {
        const int to = (me + d) % n;
        const int from = (me - d + n) % n;
        const MailInbound in{from, *buf + static_cast<size_t>(from) * count * esize, false, false};
        if (absl::Status s =
                MailExchange(to, *buf + mine, in, count * esize, dtype, ReduceOp::kSum, header);
            !s.ok()) {
          return s;
        }
      }
      return staging.CopyOut();
    }
    // Ring segment j / halving block b belongs to the rank that owns it at the end.
    std::vector<Block> blocks(n);
    Plan& plan = NewPlan();
    if (algo == Algorithm::kHalvingDoubling) {
      for (int b = 0; b < n; ++b) blocks[b] = Block{L.order[b] * count, count};
      internal::BuildDoubling(L, *buf, blocks, &plan);
    } else {
      for (int j = 0; j < n; ++j) blocks[j] = Block{L.at(j - 1) * count, count};
      internal::BuildRing(L, *buf, blocks, false, true, &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, ReduceOp::kSum); !s.ok()) return s;
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::ReduceScatterTask(const void* send, void* recv,
                                                             size_t count, DataType dtype,
                                                             ReduceOp op, CallOptions call) {
  if (absl::Status s = CheckCommon("ReduceScatter", send, recv, count, dtype, op); !s.ok()) {
    return s;
  }
  return [=, this]() -> absl::Status {
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t total = count * n * esize;
    const Algorithm algo = Resolve(CollectiveKind::kReduceScatter, total, call.algorithm);
    const CallHeader header = Header(CollectiveKind::kReduceScatter, dtype, op, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    Staging staging;
    auto in = staging.In(send, total, true);
    if (!in.ok()) return in.status();
    // Work on a copy: the send buffer is the caller's and recv may lie inside it.
    uint8_t* work = Scratch(total);
    std::memcpy(work, *in, total);
    const Layout& L = MakeLayout(dtype);
    std::vector<Block> blocks(n);
    Plan& plan = NewPlan();
    if (algo == Algorithm::kHalvingDoubling) {
      for (int b = 0; b < n; ++b) blocks[b] = Block{L.order[b] * count, count};
      internal::BuildHalving(L, work, blocks, &plan);
    } else {
      for (int j = 0; j < n; ++j) blocks[j] = Block{L.at(j - 1) * count, count};
      internal::BuildRing(L, work, blocks, true, false, &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, op); !s.ok()) return s;
    uint8_t* mine = work + static_cast<size_t>(layout_.rank) * count * esize;
    if (op == ReduceOp::kAvg) internal::DivideInPlace(dtype, mine, count, n);
    auto out = staging.Output(recv, count * esize, false);
    if (!out.ok()) return out.status();
    std::memmove(*out, mine, count * esize);
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllToAllTask(const void* send, void* recv, size_t count,
                                                        DataType dtype, CallOptions call) {
  if (absl::Status s = CheckCommon("AllToAll", send, recv, count, dtype); !s.ok()) return s;
  return [=, this]() -> absl::Status {
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t block = count * esize;
    const size_t total = block * n;
    const Algorithm algo = Resolve(CollectiveKind::kAllToAll, total, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kAllToAll, dtype, ReduceOp::kSum, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    Staging staging;
    auto in = staging.In(send, total, true);
    if (!in.ok()) return in.status();
    auto out = staging.Output(recv, total, false);
    if (!out.ok()) return out.status();
    const uint8_t* src = *in;
    if (src == *out) {  // in place: send from a copy
      uint8_t* copy = Scratch(total);
      std::memcpy(copy, src, total);
      src = copy;
    }
    const int me = layout_.rank;
    std::memmove(*out + me * block, src + me * block, block);
    const Layout& L = MakeLayout(dtype);
    if (FitsMailbox(block)) {
      // Small: the same pairwise exchange, by mailbox.
      for (int d = 1; d < n; ++d) {
        const int to = (me + d) % n;
        const int from = (me - d + n) % n;
        if (absl::Status s =
                MailExchange(to, src + to * block, {from, *out + from * block, false, false}, block,
                             dtype, ReduceOp::kSum, header);
            !s.ok()) {
          return s;
        }
      }
      return staging.CopyOut();
    }
    Plan& plan = NewPlan();
    for (int d = 1; d < n; ++d) {
      const int to = (me + d) % n;
      const int from = (me - d + n) % n;
      internal::BuildSendTo(L, src + to * block, count, to, false, &plan);
      internal::BuildRecvFrom(L, *out + from * block, count, from, false, &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, ReduceOp::kSum); !s.ok()) return s;
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllToAllVTask(
    const void* send, absl::Span<const size_t> send_counts, absl::Span<const size_t> send_displs,
    void* recv, absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
    DataType dtype, CallOptions call) {
  const int n = layout_.n;
  if (absl::Status s = CheckCommon("AllToAllV", send, recv, 0, dtype); !s.ok()) return s;
  for (auto [span, name] : {std::pair{send_counts, "send_counts"},
                            {send_displs, "send_displs"},
                            {recv_counts, "recv_counts"},
                            {recv_displs, "recv_displs"}}) {
    if (static_cast<int>(span.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: ", name, " has ", span.size(),
                                                     " entries, need one per rank (", n, ")"));
    }
  }
  const size_t esize = DataTypeSize(dtype);
  size_t send_extent = 0, recv_extent = 0;
  for (int r = 0; r < n; ++r) {
    const size_t limit = (size_t{1} << 40) / esize;
    if (send_counts[r] > limit || send_displs[r] > limit || recv_counts[r] > limit ||
        recv_displs[r] > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllToAllV: count or displacement for rank ", r, " is too large"));
    }
    send_extent = std::max(send_extent, send_displs[r] + send_counts[r]);
    recv_extent = std::max(recv_extent, recv_displs[r] + recv_counts[r]);
  }
  if ((send_extent > 0 && send == nullptr) || (recv_extent > 0 && recv == nullptr)) {
    return absl::InvalidArgumentError("AllToAllV: null buffer with non-zero counts");
  }
  if (send_extent > 0 && send == recv) {
    return absl::InvalidArgumentError("AllToAllV cannot run in place: pass distinct buffers");
  }
  std::vector<size_t> sc(send_counts.begin(), send_counts.end());
  std::vector<size_t> sd(send_displs.begin(), send_displs.end());
  std::vector<size_t> rc(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> rd(recv_displs.begin(), recv_displs.end());
  return [=, this]() -> absl::Status {
    const Algorithm algo = Resolve(CollectiveKind::kAllToAllV, send_extent * esize, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kAllToAllV, dtype, ReduceOp::kSum, algo, -1, 0);
    Staging staging;
    auto in = staging.In(send, send_extent * esize, true);
    if (!in.ok()) return in.status();
    auto out = staging.Output(recv, recv_extent * esize, false);
    if (!out.ok()) return out.status();
    const int me = layout_.rank;
    if (sc[me] != rc[me]) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: rank ", me, " sends itself ",
                                                     sc[me], " elements but expects ", rc[me]));
    }
    if (sc[me] > 0) std::memmove(*out + rd[me] * esize, *in + sd[me] * esize, sc[me] * esize);
    const Layout& L = MakeLayout(dtype);
    Plan& plan = NewPlan();
    plan.tx_extra.assign(n, 0);
    plan.rx_extra.assign(n, 0);
    for (int d = 1; d < n; ++d) {
      const int to = (me + d) % n;
      const int from = (me - d + n) % n;
      plan.tx_extra[to] = sc[to];
      plan.rx_extra[from] = rc[from];
      internal::BuildSendTo(L, *in + sd[to] * esize, sc[to], to, true, &plan);
      internal::BuildRecvFrom(L, *out + rd[from] * esize, rc[from], from, true, &plan);
    }
    if (absl::Status s = Execute(plan, header, dtype, ReduceOp::kSum); !s.ok()) return s;
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::PointToPointTask(void* buf, size_t count, DataType dtype,
                                                            int peer, bool is_send) {
  const char* what = is_send ? "Send" : "Recv";
  if (absl::Status s = CheckCommon(what, buf, buf, count, dtype); !s.ok()) return s;
  if (peer < 0 || peer >= layout_.n || peer == layout_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": peer ", peer, " must be another rank of this ", layout_.n, "-rank communicator"));
  }
  return [=, this]() -> absl::Status {
    const size_t bytes = count * DataTypeSize(dtype);
    CallHeader header;
    header.kind = CollectiveKind::kSendRecv;
    header.dtype = dtype;
    header.algorithm = Algorithm::kRing;
    header.sender = is_send ? layout_.rank : peer;
    header.count = count;
    header.communicator = uid_;
    // Each direction of each pair numbers its messages: that is what matches a Send to a Recv.
    header.sequence = is_send ? p2p_send_seq_[peer]++ : p2p_recv_seq_[peer]++;
    Staging staging;
    const Layout& L = MakeLayout(dtype);
    Plan& plan = NewPlan();
    if (is_send) {
      auto in = staging.In(buf, bytes, true);
      if (!in.ok()) return in.status();
      internal::BuildSendTo(L, *in, count, peer, true, &plan);
      return Execute(plan, header, dtype, ReduceOp::kSum);
    }
    auto out = staging.Output(buf, bytes, false);
    if (!out.ok()) return out.status();
    internal::BuildRecvFrom(L, *out, count, peer, true, &plan);
    if (absl::Status s = Execute(plan, header, dtype, ReduceOp::kSum); !s.ok()) return s;
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::BarrierTask() {
  return [this] { return RunBarrier(); };
}

absl::Status CommunicatorImpl::RunBarrier() {
  const CallHeader header = Header(CollectiveKind::kBarrier, DataType::kU8, ReduceOp::kMax,
                                   Algorithm::kHalvingDoubling, -1, 1);
  uint8_t token[8] = {};
  if (FitsMailbox(1)) return MailboxAllReduce(token, 1, DataType::kU8, ReduceOp::kMax, header);
  const Layout& L = MakeLayout(DataType::kU8);
  Plan& plan = NewPlan();
  internal::BuildRecursiveDoubling(L, token, 1, &plan);
  return Execute(plan, header, DataType::kU8, ReduceOp::kMax);
}

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
  auto rendezvous = transport::Rendezvous::Create(child_rank_of[layout_.rank],
                                                  static_cast<int>(members.size()), store_);
  if (!rendezvous.ok()) return rendezvous.status();
  return Make(*rendezvous, std::move(options),
              absl::StrCat(tag_, "/", uid_, "/split", split, "/color", color));
}

// ---------------------------------------------------------------------------------------------
// Execution

std::string CommunicatorImpl::DownRanks() {
  std::vector<std::string> down;
  for (int r = 0; r < layout_.n; ++r) {
    for (auto& channel : conns_) {
      if (!channel[r]) continue;
      const absl::Status s = channel[r]->status();
      if (!s.ok()) {
        // The transport reports a deliberate close as Aborted: that rank is alive and gave up
        // (usually after an error of its own); anything else means it died or is unreachable.
        down.push_back(absl::IsAborted(s) ? absl::StrCat("rank ", r, " (closed its connection)")
                                          : absl::StrCat("rank ", r));
        break;
      }
    }
  }
  return absl::StrJoin(down, ", ");
}

std::vector<int> CommunicatorImpl::WaitingFor(int channels) const {
  std::vector<int> blocked, pending;
  auto add = [](std::vector<int>& v, int peer) {
    if (std::find(v.begin(), v.end(), peer) == v.end()) v.push_back(peer);
  };
  for (size_t l = 0; l < links_.size(); ++l) {
    const Link& link = links_[l];
    const int peer = static_cast<int>(l / channels);
    if (link.sends_in_flight > 0) add(blocked, peer);
    for (size_t k = link.low_recv; k < link.next_recv; ++k) {
      if (recv_state_[link.recvs[k]] == kPosted) add(blocked, peer);
    }
    if (link.low_recv < link.recvs.size() || link.next_send < link.sends.size()) {
      add(pending, peer);
    }
  }
  return blocked.empty() ? pending : blocked;
}

absl::Status CommunicatorImpl::Abort(const CallHeader& header, Failure failure) {
  const int self = layout_.rank;
  if (failure.kind == Failure::Kind::kPeer) {
    // Alive and failing because of that connection: a peer resolving a stall meanwhile must
    // not take this rank for the silent one.
    board_->PostWaiting({failure.peer}, absl::StatusCode::kUnavailable, "connection failed");
  }
  // A peer that closed on purpose published its account first: read it at once. Anything else
  // may be a death, which shows on every connection to that rank; give the transport a moment
  // to notice so that the error names the rank that died, not only the neighbour that told us.
  if (failure.kind == Failure::Kind::kPeer && !absl::IsAborted(failure.why) && device_ != nullptr) {
    const absl::Time until = absl::Now() + absl::Milliseconds(200);
    Completion drained[16];
    while (absl::Now() < until) {
      device_->Progress(absl::Milliseconds(5));
      cq_->Poll(absl::MakeSpan(drained));
    }
  }
  // Direct evidence first: a connection that failed other than by the peer's deliberate close
  // (Aborted) names a rank that died, hung or is unreachable. Ranks that closed on purpose did
  // so because of a failure of their own, which they published before closing.
  int died = -1;
  absl::Status died_why;
  std::vector<int> closed;
  for (int r = 0; r < layout_.n; ++r) {
    for (auto& channel : conns_) {
      if (!channel[r]) continue;
      const absl::Status s = channel[r]->status();
      if (s.ok() || absl::IsCancelled(s)) continue;
      if (absl::IsAborted(s)) {
        closed.push_back(r);
      } else if (died < 0 || r == failure.peer) {
        died = r;
        died_why = s;
      }
      break;
    }
  }
  internal::Blame local;
  std::vector<int> consult;
  absl::Time deadline = absl::Now();
  switch (failure.kind) {
    case Failure::Kind::kOwn:
      local.code = failure.own.ok() ? absl::StatusCode::kUnknown : failure.own.code();
      local.reporter = self;
      local.reason = std::string(failure.own.message());
      break;
    case Failure::Kind::kPeer:
      if (died >= 0) {
        local = ConnectionBlame(self, died, died_why);
      } else {
        local = ConnectionBlame(self, failure.peer, failure.why);
        consult = closed;
        auto it = std::find(consult.begin(), consult.end(), failure.peer);
        if (it != consult.end()) std::rotate(consult.begin(), it, it + 1);
        deadline += absl::Milliseconds(200);
      }
      break;
    case Failure::Kind::kStall:
      if (died >= 0) {
        local = ConnectionBlame(self, died, died_why);
      } else {
        local.final = false;
        local.code = absl::StatusCode::kDeadlineExceeded;
        local.ranks = failure.waiting;
        local.reporter = self;
        local.reason = absl::StrCat("made no progress for ", absl::FormatDuration(options_.timeout),
                                    " (hung, dead, or not in this call)");
        // Ranks blocked on the silent one time out at about the same moment; their accounts
        // show whom they wait for. A tenth of the timeout keeps detection within 1.1x of it.
        deadline +=
            std::clamp(options_.timeout / 10, absl::Milliseconds(20), absl::Milliseconds(1000));
      }
      break;
  }
  const internal::Blame blame = board_->Resolve(local, std::move(consult), deadline);

  const std::string call = header.Describe();
  std::string message;
  if (blame.ranks.empty()) {
    message = blame.reporter == self
                  ? blame.reason
                  : absl::StrCat(call, " failed on rank ", self, ": rank ", blame.reporter,
                                 " aborted the communicator: ", blame.reason);
  } else {
    message = absl::StrCat(call, " failed on rank ", self, ": rank ",
                           absl::StrJoin(blame.ranks, ", rank "), " ", blame.reason);
    if (blame.reporter != self &&
        std::find(blame.ranks.begin(), blame.ranks.end(), blame.reporter) == blame.ranks.end()) {
      absl::StrAppend(&message, "; reported by rank ", blame.reporter,
                      ", which aborted because of it");
    } else if (failure.kind == Failure::Kind::kStall && blame.ranks != failure.waiting) {
      absl::StrAppend(&message, "; this rank waited for rank(s) ",
                      absl::StrJoin(failure.waiting, ", "), ", blocked on it");
    }
  }
  const std::string down = DownRanks();
  if (!down.empty()) absl::StrAppend(&message, " [connections down: ", down, "]");
  absl::Status status(blame.code, message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = status;
  }
  for (auto& channel : conns_) {
    for (auto& c : channel) {
      if (c) c->Close();
    }
  }
  return status;
}

absl::Status CommunicatorImpl::MailExchange(int to, const uint8_t* data, const MailInbound& in,
                                            size_t bytes, DataType dtype, ReduceOp op,
                                            const CallHeader& header) {
  const MailHeader mine = MailHeader::Of(header);
  const size_t esize = DataTypeSize(dtype);
  // A zero-byte vector still travels as one (empty) fragment: it carries the header.
  const size_t fragments =
      std::max<size_t>(1, (bytes + kMailFragmentBytes - 1) / kMailFragmentBytes);
  auto fragment_length = [&](size_t k) {
    const size_t offset = k * kMailFragmentBytes;
    return std::min(kMailFragmentBytes, bytes - std::min(bytes, offset));
  };
  size_t sent = to < 0 ? fragments : 0;
  size_t received = in.from < 0 ? fragments : 0;
  const absl::Duration pure_spin = yield_when_idle_ ? absl::ZeroDuration() : options_.spin;
  absl::Time start = absl::InfinitePast();
  absl::Duration idle = absl::ZeroDuration();
  absl::Duration next_wait_record = wait_record_after_;  // idle time of the next wait record
  auto failed = [&](int peer, const absl::Status& why) {
    return Abort(header, Failure::Peer(peer, why));
  };
  uint32_t polls = 0;
  while (sent < fragments || received < fragments) {
    bool progress = false;
    if (sent < fragments) {
      const size_t length = fragment_length(sent);
      const ConstBuffer parts[2] = {{&mine, kMailHeaderBytes},
                                    {data + sent * kMailFragmentBytes, length}};
      absl::StatusOr<bool> ok = mailboxes_[to]->TrySend(absl::MakeConstSpan(parts, 2));
      if (!ok.ok()) return failed(to, ok.status());
      if (*ok) {
        ++sent;
        progress = true;
      }
    }
    if (received < fragments && (to < 0 || sent > received)) {
      transport::Mailbox* mailbox = mailboxes_[in.from];
      absl::StatusOr<std::optional<absl::Span<const uint8_t>>> got = mailbox->Peek();
      if (!got.ok()) return failed(in.from, got.status());
      if (got->has_value()) {
        const absl::Span<const uint8_t> message = **got;
        const size_t length = fragment_length(received);
        MailHeader theirs;
        if (message.size() >= kMailHeaderBytes) {
          std::memcpy(&theirs, message.data(), kMailHeaderBytes);
        }
        if (message.size() < kMailHeaderBytes || !(theirs == mine) ||
            message.size() != kMailHeaderBytes + length) {
          return Abort(header,
                       Failure::Own(MismatchedCalls(layout_.rank, header.Describe(), in.from,
                                                    message.size() < kMailHeaderBytes
                                                        ? std::string("a truncated message")
                                                        : theirs.Describe())));
        }
        uint8_t* dst = in.dst + received * kMailFragmentBytes;
        const uint8_t* payload = message.data() + kMailHeaderBytes;
        if (in.reduce) {
          internal::ReduceInto(dtype, op, dst, payload, length / esize, in.src_first);
        } else if (length > 0) {
          std::memcpy(dst, payload, length);
        }
        mailbox->Release();
        ++received;
        progress = true;
      }
    }
    if (progress) {
      start = absl::InfinitePast();
      idle = absl::ZeroDuration();
      polls = 0;
      next_wait_record = wait_record_after_;
      if (board_->posted()) board_->Retract();
      continue;
    }
    // Past the yield window every pass sleeps anyway: read the clock on each.
    if (++polls % 64 == 0 || idle >= kYieldWindow) {
      const absl::Time now = absl::Now();
      if (start == absl::InfinitePast()) start = now;
      idle = now - start;
      const int waited_for = sent < fragments ? to : in.from;
      if (idle > options_.timeout) return Abort(header, Failure::Stall({waited_for}));
      // Long without progress: publish whom this rank waits for (see Execute).
      if (idle >= next_wait_record) {
        board_->PostWaiting({waited_for}, absl::StatusCode::kDeadlineExceeded,
                            absl::StrCat("waiting for ", absl::FormatDuration(idle)));
        next_wait_record = idle + wait_record_every_;
      }
      Completion sink[4];
      cq_->Poll(absl::MakeSpan(sink));  // caller-mode progress notices a dead peer
      if (idle >= kYieldWindow) {
        // Long waits sleep: on the slot itself when only receiving (bounded, so that a dead
        // peer is still noticed); briefly when the peer's inbox is full (it drains as the peer
        // catches up, with no wake-up to wait for).
        if (sent == fragments) {
          mailboxes_[in.from]->Wait(std::min(options_.timeout - idle, absl::Milliseconds(10)));
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        continue;
      }
    }
    if (idle >= pure_spin) sched_yield();
  }
  return absl::OkStatus();
}

absl::Status CommunicatorImpl::MailboxAllReduce(uint8_t* buf, size_t count, DataType dtype,
                                                ReduceOp op, const CallHeader& header) {
  const Layout& L = layout_;
  const size_t bytes = count * DataTypeSize(dtype);
  auto exchange = [&](int to, MailInbound in) {
    return MailExchange(to, buf, in, bytes, dtype, op, header);
  };
  // Recursive doubling with the plan path's fold (internal::Fold) and reduction order: the
  // same bits.
  const internal::Fold f = internal::MakeFold(L);
  const int pos = L.pos();
  if (f.new_pos < 0) {  // folds out: hand the vector over, get the result back
    const int partner = L.at(pos + 1);
    if (absl::Status s = exchange(partner, {}); !s.ok()) return s;
    return exchange(-1, {partner, buf, false, false});
  }
  const bool folds_in = pos < 2 * f.rem;
  if (folds_in) {
    if (absl::Status s = exchange(-1, {L.at(pos - 1), buf, true, true}); !s.ok()) return s;
  }
  for (int mask = 1; mask < f.p2; mask *= 2) {
    const int partner = f.new_pos ^ mask;
    const int peer = f.Real(L, partner);
    if (absl::Status s = exchange(peer, {peer, buf, true, partner < f.new_pos}); !s.ok()) {
      return s;
    }
  }
  if (folds_in) return exchange(L.at(pos - 1), {});
  return absl::OkStatus();
}

absl::Status CommunicatorImpl::CheckMailboxes(const CallHeader& header) {
  if (!mailboxes_ready_) return absl::OkStatus();
  for (int peer = 0; peer < layout_.n; ++peer) {
    if (mailboxes_[peer] == nullptr) continue;
    auto got = mailboxes_[peer]->Peek();
    if (!got.ok() || !got->has_value() || (*got)->size() < kMailHeaderBytes) continue;
    MailHeader theirs;
    std::memcpy(&theirs, (*got)->data(), kMailHeaderBytes);
    // A message of a later call is the peer running ahead; one of this call means it chose the
    // mailbox path where this rank did not (different arguments); one of an earlier call was
    // never received here (a broadcast root that differed, say).
    if (!theirs.Valid() || theirs.sequence > header.sequence) continue;
    return MismatchedCalls(
        layout_.rank, header.Describe(), peer, theirs.Describe(),
        theirs.sequence < header.sequence ? ", which this rank never received" : "");
  }
  return absl::OkStatus();
}

absl::Status CommunicatorImpl::Execute(const Plan& plan, const CallHeader& header, DataType dtype,
                                       ReduceOp op) {
  const int n = layout_.n;
  const int channels = options_.channels;
  const int depth = options_.pipeline_depth;
  const size_t num_sends = plan.sends.size();
  const size_t num_recvs = plan.recvs.size();
  if (num_sends == 0 && num_recvs == 0) return absl::OkStatus();
  const uint64_t epoch = ++epoch_ & 0x7FFFFFFF;

  for (Link& link : links_) {
    link.sends.clear();
    link.recvs.clear();
    link.next_send = link.next_recv = link.low_recv = 0;
    link.sends_in_flight = 0;
    link.slots_taken = 0;
    link.slot_owner.assign(depth, -1);
  }
  std::vector<size_t>& max_recv = max_recv_;
  max_recv.assign(links_.size(), 0);
  for (size_t i = 0; i < num_sends; ++i) {
    const auto& op_ = plan.sends[i];
    links_[op_.peer * channels + op_.channel].sends.push_back(static_cast<int>(i));
  }
  std::vector<int>& reduce_order = reduce_order_;
  reduce_order.clear();
  for (size_t i = 0; i < num_recvs; ++i) {
    const auto& op_ = plan.recvs[i];
    const size_t l = op_.peer * channels + op_.channel;
    links_[l].recvs.push_back(static_cast<int>(i));
    max_recv[l] = std::max(max_recv[l], op_.bytes);
    if (op_.reduce) reduce_order.push_back(static_cast<int>(i));
  }
  for (size_t l = 0; l < links_.size(); ++l) {
    Link& link = links_[l];
    if (!link.sends.empty()) {
      CallHeader h = header;
      h.extra = plan.tx_extra.empty() ? 0 : plan.tx_extra[l / channels];
      h.Encode(link.tx_header);
    }
    if (!link.recvs.empty()) {
      // At least 4 KiB, so that a small oversized first message (a mismatched call) still fits
      // and its header can say which call the peer is in.
      link.slot_stride = (std::max(kHeaderBytes + max_recv[l], size_t{4096}) + 63) & ~size_t{63};
      const size_t need = link.slot_stride * depth;
      if (link.slots.size() < need) link.slots.resize(need);
    }
  }

  std::vector<uint8_t>& send_state = send_state_;
  std::vector<uint8_t>& recv_state = recv_state_;
  send_state.assign(num_sends, kIdle);
  recv_state.assign(num_recvs, kIdle);
  std::vector<uint8_t*>& recv_landing = recv_landing_;  // where the payload arrived
  recv_landing.assign(num_recvs, nullptr);
  size_t sends_done_prefix = 0, recvs_done_prefix = 0, sends_done = 0, recvs_done = 0;
  size_t reduce_cursor = 0;
  std::vector<int>& slot_copies = slot_copies_;  // arrived into a slot, to be copied out
  slot_copies.clear();

  auto describe = [&] { return header.Describe(); };
  auto advance_prefixes = [&] {
    while (sends_done_prefix < num_sends && send_state[sends_done_prefix] == kDone) {
      ++sends_done_prefix;
    }
    while (recvs_done_prefix < num_recvs && recv_state[recvs_done_prefix] == kDone) {
      ++recvs_done_prefix;
    }
  };
  auto finish_recv = [&](int i) {
    recv_state[i] = kDone;
    ++recvs_done;
    const auto& r = plan.recvs[i];
    Link& link = links_[r.peer * channels + r.channel];
    while (link.low_recv < link.recvs.size() && recv_state[link.recvs[link.low_recv]] == kDone) {
      ++link.low_recv;
    }
  };
  // Local work that became possible: copies out of slots, reductions in plan order.
  auto do_local = [&] {
    bool progress = true;
    while (progress) {
      progress = false;
      advance_prefixes();
      for (size_t j = 0; j < slot_copies.size();) {
        const int i = slot_copies[j];
        const auto& r = plan.recvs[i];
        if (sends_done_prefix >= static_cast<size_t>(r.war_prefix)) {
          if (r.bytes > 0) std::memcpy(r.data, recv_landing[i], r.bytes);
          finish_recv(i);
          slot_copies[j] = slot_copies.back();
          slot_copies.pop_back();
          progress = true;
        } else {
          ++j;
        }
      }
      while (reduce_cursor < reduce_order.size()) {
        const int i = reduce_order[reduce_cursor];
        const auto& r = plan.recvs[i];
        if (recv_state[i] != kArrived || sends_done_prefix < static_cast<size_t>(r.war_prefix)) {
          break;
        }
        const size_t elems = r.bytes / DataTypeSize(dtype);
        if (r.local == nullptr) {
          internal::ReduceInto(dtype, op, r.data, recv_landing[i], elems, r.src_first);
        } else if (recv_landing[i] == r.data) {
          // data holds the incoming operand: the same operation with the roles swapped.
          internal::ReduceInto(dtype, op, r.data, r.local, elems, !r.src_first);
        } else {
          if (r.bytes > 0) std::memcpy(r.data, r.local, r.bytes);
          internal::ReduceInto(dtype, op, r.data, recv_landing[i], elems, r.src_first);
        }
        finish_recv(i);
        ++reduce_cursor;
        progress = true;
      }
    }
    advance_prefixes();
  };

  Failure failure;
  auto post_all = [&]() -> bool {
    for (size_t l = 0; l < links_.size(); ++l) {
      Link& link = links_[l];
      const int peer = static_cast<int>(l / channels);
      transport::Connection* conn =
          link.sends.empty() && link.recvs.empty() ? nullptr : conns_[l % channels][peer].get();
      // Receives, in order. Those that land in a slot (a call's first message, with its header;
      // in-place reductions) wait for a free one of the link's `depth` slots; the others go
      // straight to their destination and are posted as early as their order allows, so that
      // a peer running ahead finds them posted rather than having its messages held.
      while (link.next_recv < link.recvs.size()) {
        const int i = link.recvs[link.next_recv];
        const auto& r = plan.recvs[i];
        MutableBuffer target;
        if (link.next_recv == 0 || (r.reduce && r.local == nullptr)) {
          int& owner = link.slot_owner[link.slots_taken % depth];
          if (owner >= 0 && recv_state[owner] != kDone) break;
          uint8_t* slot = link.slots.data() + (link.slots_taken % depth) * link.slot_stride;
          owner = i;
          ++link.slots_taken;
          // The first: header + payload, with room to see an oversized (mismatched) message.
          target = {slot, link.next_recv == 0 ? link.slot_stride : r.bytes};
        } else {  // placed, or reduced out of place: straight into the destination
          if (sends_done_prefix < static_cast<size_t>(r.war_prefix)) break;
          target = {r.data, r.bytes};
        }
        const uint64_t wr = (epoch << 32) | static_cast<uint64_t>(i);
        if (absl::Status s = conn->PostRecv(target, wr); !s.ok()) {
          failure = Failure::Peer(peer, s);
          return false;
        }
        recv_state[i] = kPosted;
        recv_landing[i] = static_cast<uint8_t*>(target.data);
        ++link.next_recv;
      }
      // Sends, in order, once their inputs are final.
      while (link.next_send < link.sends.size() && link.sends_in_flight < depth) {
        const int i = link.sends[link.next_send];
        const auto& s = plan.sends[i];
        if (s.dep >= 0 && recv_state[s.dep] != kDone) break;
        if (recvs_done_prefix < static_cast<size_t>(s.dep_prefix)) break;
        ConstBuffer parts[2];
        size_t nparts = 0;
        if (link.next_send == 0) parts[nparts++] = {link.tx_header, kHeaderBytes};
        if (s.bytes > 0) parts[nparts++] = {s.data, s.bytes};
        const uint64_t wr = (uint64_t{1} << 63) | (epoch << 32) | static_cast<uint64_t>(i);
        if (absl::Status st = conn->PostSend(absl::MakeConstSpan(parts, nparts), wr); !st.ok()) {
          failure = Failure::Peer(peer, st);
          return false;
        }
        send_state[i] = kPosted;
        ++link.sends_in_flight;
        ++link.next_send;
      }
    }
    return true;
  };

  auto on_completion = [&](const Completion& c) -> bool {
    const bool is_send = (c.wr_id >> 63) != 0;
    if (((c.wr_id >> 32) & 0x7FFFFFFF) != epoch) return true;  // a leftover of an older call
    const size_t i = c.wr_id & 0xFFFFFFFF;
    auto it = peer_of_connection_.find(c.connection_id);
    const int peer = it == peer_of_connection_.end() ? -1 : it->second;
    if (!c.status.ok() && !is_send && c.status.code() == absl::StatusCode::kResourceExhausted &&
        i < num_recvs) {
      failure = Failure::Own(absl::FailedPreconditionError(
          absl::StrCat("mismatched collective calls: rank ", peer, " sent rank ", layout_.rank,
                       " a message larger than its ", describe(), " expects (",
                       std::string(c.status.message()), "): the ranks' calls do not match")));
      return false;
    }
    if (!c.status.ok()) {
      failure = Failure::Peer(peer, c.status);
      return false;
    }
    if (is_send) {
      if (i >= num_sends) return true;
      const auto& s = plan.sends[i];
      send_state[i] = kDone;
      ++sends_done;
      --links_[s.peer * channels + s.channel].sends_in_flight;
      return true;
    }
    if (i >= num_recvs) return true;
    const auto& r = plan.recvs[i];
    Link& link = links_[r.peer * channels + r.channel];
    const bool first = !link.recvs.empty() && link.recvs[0] == static_cast<int>(i);
    size_t payload = c.bytes;
    if (first) {
      auto theirs = CallHeader::Decode(absl::MakeConstSpan(recv_landing[i], c.bytes));
      if (!theirs.ok()) {
        failure = Failure::Own(absl::FailedPreconditionError(
            absl::StrCat(describe(), " on rank ", layout_.rank, ": the message from rank ", r.peer,
                         " is not the start of a call (", std::string(theirs.status().message()),
                         "): the ranks issued different sequences of calls")));
        return false;
      }
      const uint64_t expected_extra = plan.rx_extra.empty() ? 0 : plan.rx_extra[r.peer];
      if (!theirs->SameCall(header) || theirs->sender != r.peer ||
          theirs->extra != expected_extra) {
        CallHeader mine = header;
        mine.extra = expected_extra;
        const bool algo_only = theirs->algorithm != header.algorithm &&
                               theirs->kind == header.kind && theirs->count == header.count &&
                               theirs->dtype == header.dtype;
        failure = Failure::Own(MismatchedCalls(
            layout_.rank, mine.Describe(), theirs->sender, theirs->Describe(),
            algo_only ? " (the ranks chose different algorithms: set the same "
                        "PLEXUS_COLL_ALGO, table and per-call algorithm on every rank)"
                      : ""));
        return false;
      }
      recv_landing[i] += kHeaderBytes;
      payload = c.bytes - kHeaderBytes;
    }
    if (payload != r.bytes) {
      failure = Failure::Own(absl::FailedPreconditionError(absl::StrCat(
          describe(), " on rank ", layout_.rank, ": rank ", r.peer, " sent a message of ", payload,
          " bytes where ", r.bytes,
          " were expected: the ranks' calls do not match (count, type or algorithm)")));
      return false;
    }
    recv_state[i] = kArrived;
    if (r.reduce) return true;  // reduced in plan order by do_local
    if (recv_landing[i] != r.data) {
      slot_copies.push_back(static_cast<int>(i));
    } else {
      finish_recv(static_cast<int>(i));
    }
    return true;
  };

  // The clock is read only when a poll finds nothing, and then only on every 16th such poll
  // (reading it cost ~4% of a small call) while spinning, but on every one once past the yield
  // window, where each pass sleeps anyway: last_progress is the first such moment after the
  // latest completion. (Reading it rarely there too let a timed-out Wait repeat 16 times with a
  // stale `left`: a hung peer was found after 16x the timeout.)
  absl::Time last_progress = absl::Now();
  absl::Duration idle = absl::ZeroDuration();
  bool progressed = false;
  uint32_t idle_polls = 0;
  const absl::Duration pure_spin = yield_when_idle_ ? absl::ZeroDuration() : options_.spin;
  absl::Duration next_wait_record = wait_record_after_;  // idle time of the next wait record
  Completion batch[32];
  for (;;) {
    do_local();
    if (!post_all()) break;
    if (sends_done == num_sends && recvs_done == num_recvs) {
      if (board_->posted()) board_->Retract();
      return absl::OkStatus();
    }
    size_t got = cq_->Poll(absl::MakeSpan(batch));  // moves bytes too, in caller mode
    if (got == 0) {
      if (progressed || ++idle_polls % 16 == 0 || idle >= kYieldWindow) {
        const absl::Time now = absl::Now();
        if (progressed) {
          last_progress = now;
          progressed = false;
          idle_polls = 0;
          next_wait_record = wait_record_after_;
          if (board_->posted()) board_->Retract();
        }
        idle = now - last_progress;
        // Long without progress: publish whom this rank waits for (off the fast path), so that
        // whichever rank times out first finds the wait-for graph on the store.
        if (idle >= next_wait_record && idle < options_.timeout) {
          board_->PostWaiting(WaitingFor(channels), absl::StatusCode::kDeadlineExceeded,
                              absl::StrCat("waiting for ", absl::FormatDuration(idle)));
          next_wait_record = idle + wait_record_every_;
        }
      }
      const absl::Duration left = options_.timeout - idle;
      if (left <= absl::ZeroDuration()) {
        failure = Failure::Stall(WaitingFor(channels));
        break;
      }
      // Send/Recv numbers its messages per pair, not per call: nothing to compare with.
      if (mailboxes_ready_ && header.kind != CollectiveKind::kSendRecv) {
        if (absl::Status s = CheckMailboxes(header); !s.ok()) {
          failure = Failure::Own(s);
          break;
        }
      }
      // Waiting: spin (lowest latency, unless the host is oversubscribed), then poll and yield
      // the CPU to whoever needs it (a peer rank, or anything else this host runs), and only
      // after kYieldWindow without progress sleep in the transport.
      if (idle < pure_spin) continue;
      if (idle < kYieldWindow) {
        sched_yield();
        continue;
      }
      // Wake for the next wait record too.
      absl::StatusOr<Completion> c =
          cq_->Wait(std::min(left, std::max(next_wait_record - idle, absl::Milliseconds(1))),
                    absl::ZeroDuration());
      if (!c.ok()) continue;  // timed out: the checks above report it or post the record
      batch[0] = *std::move(c);
      got = 1;
    }
    progressed = true;
    bool ok = true;
    for (size_t k = 0; k < got && ok; ++k) ok = on_completion(batch[k]);
    if (!ok) break;
  }
  (void)n;
  return Abort(header, std::move(failure));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    transport::Rendezvous& rendezvous, CommunicatorOptions options) {
  return CommunicatorImpl::Make(rendezvous, std::move(options), "coll");
}

}  // namespace plexus::collectives
