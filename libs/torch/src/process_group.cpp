#include "plexus/torch/process_group.hpp"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include <ATen/core/ivalue.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/config.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "store_adapter.hpp"

namespace plexus::torch {
namespace {

namespace pc = plexus::collectives;

const base::Param<std::string> kTransportParam(
    "PLEXUS_TORCH_TRANSPORT", "",
    "transport of the torch backend: tcp or shm (default: shm when every rank is on one host)");
const base::Param<std::string> kProgressParam(
    "PLEXUS_TORCH_PROGRESS", "",
    "who moves the torch backend's bytes: thread (the transport's progress thread) or caller");

// Throws the RuntimeError Python sees for invalid arguments.
[[noreturn]] void Refuse(int rank, std::string_view op, std::string_view why) {
  TORCH_CHECK(false, "plexus (rank ", rank, "): ", std::string(op), ": ", std::string(why));
}

std::optional<pc::DataType> ReducibleType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return pc::DataType::kF32;
    case at::kDouble:
      return pc::DataType::kF64;
    case at::kHalf:
      return pc::DataType::kF16;
    case at::kBFloat16:
      return pc::DataType::kBF16;
    case at::kInt:
      return pc::DataType::kI32;
    case at::kLong:
      return pc::DataType::kI64;
    case at::kByte:
      return pc::DataType::kU8;
    default:
      return std::nullopt;
  }
}

std::optional<pc::ReduceOp> PlexusOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return pc::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return pc::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return pc::ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return pc::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return pc::ReduceOp::kMax;
    default:
      return std::nullopt;
  }
}

// One blocking communicator call of a Work (run by whichever thread executes the Work).
using Call = std::function<absl::Status()>;

class PlexusWork;

// The group's queue of issued calls, shared with its Works (a Work may outlive the group). The
// calls run one at a time in issue order, in the group's executor thread or in a thread blocked
// in Work::wait() on one of them (it runs the queue up to its own call itself, so that a
// synchronous call costs no thread hand-off). Each call is a blocking communicator call made in
// the running thread: no thread of the communicator is involved. Results are completed (the
// future's callbacks run) after the executing role is released, so a callback may wait() on a
// later call.
struct Scheduler {
  int rank = 0;
  int size = 1;
  std::mutex mu;
  std::condition_variable cv;  // queue, executing and completions changed
  std::deque<c10::intrusive_ptr<PlexusWork>> queue;
  uint64_t issued = 0;     // sequence number of the last queued Work
  bool executing = false;  // a thread runs a call of the queue's head
  bool stop = false;

  // Runs the head of the queue (its calls, copies out, completion). Called with `lock` held,
  // !executing and a non-empty queue; returns with it held.
  void RunHead(std::unique_lock<std::mutex>& lock);
};

// The Work a call returns: completed once its communicator calls ran (in issue order, see
// Scheduler) and the post step (copies into the caller's tensors) ran.
class PlexusWork final : public c10d::Work {
 public:
  PlexusWork(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        what_(std::move(what)),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Filled by the issuing call before the work is queued; read by the executing thread.
  std::vector<Call> parts;             // blocking communicator calls, in order
  std::function<void()> post;          // runs after every part succeeded
  std::vector<at::Tensor> keep_alive;  // staging buffers the parts read or write
  uint64_t sequence = 0;               // position in the group's issue order
  std::shared_ptr<Scheduler> scheduler;

  // Runs the parts (stopping at the first failure: the communicator is broken then) and the
  // post step; returns the work's status.
  absl::Status Execute() {
    for (const auto& part : parts) {
      PLEXUS_RETURN_IF_ERROR(part());
    }
    if (post) {
      try {
        post();
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat("copying the result out: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  // Completes the future (running its callbacks) and the work; drops the buffers.
  void Finish(const absl::Status& status, int rank, int size) {
    parts.clear();
    post = nullptr;
    keep_alive.clear();
    std::exception_ptr error;
    if (!status.ok()) {
      error = std::make_exception_ptr(std::runtime_error(absl::StrCat(
          "plexus: ", what_, " failed on rank ", rank, " of ", size, ": ", status.ToString())));
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

  // A blocking wait runs the queue up to this work in the calling thread when no other thread
  // executes it already (the GIL is released by torch's binding).
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout && scheduler != nullptr) {
      std::shared_ptr<Scheduler> s = scheduler;
      std::unique_lock<std::mutex> lock(s->mu);
      while (!isCompleted()) {
        if (!s->executing && !s->queue.empty() && s->queue.front()->sequence <= sequence) {
          s->RunHead(lock);
        } else {
          s->cv.wait(lock);
        }
      }
    }
    return c10d::Work::wait(timeout);
  }

 private:
  std::string what_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

void Scheduler::RunHead(std::unique_lock<std::mutex>& lock) {
  c10::intrusive_ptr<PlexusWork> work = std::move(queue.front());
  queue.pop_front();
  executing = true;
  lock.unlock();
  const absl::Status status = work->Execute();
  lock.lock();
  executing = false;
  lock.unlock();
  cv.notify_all();  // the next call may start while this one's callbacks run
  work->Finish(status, rank, size);
  work->scheduler.reset();
  lock.lock();
  cv.notify_all();  // isCompleted() changed: waiters re-check under `mu`
}

bool IsCuda(const at::Tensor& t) { return t.device().is_cuda(); }

}  // namespace

struct ProcessGroupPlexus::Impl {
  int rank = 0;
  int size = 1;
  std::string transport;
  std::unique_ptr<transport::Rendezvous> rendezvous;
  std::unique_ptr<pc::Communicator> comm;
  uint64_t sequence = 0;

  // Calls are issued under `issue_mu` and queued in that order.
  std::mutex issue_mu;
  std::shared_ptr<Scheduler> scheduler = std::make_shared<Scheduler>();
  std::thread executor;

  // The executor thread: runs queued calls no waiting caller runs itself.
  void Run() {
    Scheduler& s = *scheduler;
    std::unique_lock<std::mutex> lock(s.mu);
    for (;;) {
      s.cv.wait(lock, [&] { return !s.executing && (s.stop || !s.queue.empty()); });
      if (s.queue.empty()) return;
      s.RunHead(lock);
    }
  }

  // --- argument checks (throw RuntimeError) ---
  void CheckTensor(std::string_view op, const at::Tensor& t) const {
    if (!t.defined()) Refuse(rank, op, "undefined tensor");
    if (t.is_sparse()) Refuse(rank, op, "sparse tensors are not supported");
    if (t.layout() != at::kStrided) Refuse(rank, op, "only strided tensors are supported");
    if (IsCuda(t)) {
#if PLEXUS_HAVE_CUDA
      return;
#else
      Refuse(rank, op,
             "CUDA tensors need Plexus built with CUDA (PLEXUS_WITH_CUDA); this build moves CPU "
             "tensors only");
#endif
    }
    if (!t.device().is_cpu()) {
      Refuse(rank, op, absl::StrCat("tensors on ", t.device().str(), " are not supported"));
    }
  }
  void CheckSingle(std::string_view op, const std::vector<at::Tensor>& ts) const {
    if (ts.size() != 1) {
      Refuse(rank, op, absl::StrCat("expects exactly one tensor per call, got ", ts.size()));
    }
    CheckTensor(op, ts[0]);
  }
  void CheckRoot(std::string_view op, int64_t root) const {
    if (root < 0 || root >= size) {
      Refuse(rank, op, absl::StrCat("root ", root, " is not a rank of this group of ", size));
    }
  }
  // Gather's outputs and scatter's inputs: `per_rank` (one list of size() tensors each matching
  // `reference` in bytes and type) on the root, nothing elsewhere. `what` is "output"/"input".
  void CheckRootList(std::string_view op, int root,
                     const std::vector<std::vector<at::Tensor>>& per_rank,
                     const at::Tensor& reference, std::string_view what_view) const {
    const std::string what(what_view);
    if (rank != root) {
      if (!per_rank.empty() && !per_rank[0].empty()) {
        Refuse(rank, op, absl::StrCat("only the root takes ", what, " tensors"));
      }
      return;
    }
    if (per_rank.size() != 1 || static_cast<int>(per_rank[0].size()) != size) {
      Refuse(rank, op, absl::StrCat("the root expects one list of ", size, " ", what, " tensors"));
    }
    for (const auto& t : per_rank[0]) {
      CheckTensor(op, t);
      if (t.nbytes() != reference.nbytes() || t.scalar_type() != reference.scalar_type()) {
        Refuse(rank, op,
               absl::StrCat("every ", what, " tensor must match the ",
                            what == "output" ? "input" : "output", "'s size and type"));
      }
    }
  }
  void CheckPeer(std::string_view op, int peer) const {
    if (peer < 0 || peer >= size || peer == rank) {
      Refuse(rank, op, absl::StrCat("peer ", peer, " is not another rank of this group of ", size));
    }
  }
  pc::DataType Reducible(std::string_view op, const at::Tensor& t) const {
    auto type = ReducibleType(t.scalar_type());
    if (!type) {
      Refuse(rank, op,
             absl::StrCat("cannot reduce tensors of type ", c10::toString(t.scalar_type()),
                          "; supported: float32, float64, float16, bfloat16, int32, int64, uint8"));
    }
    return *type;
  }
  pc::ReduceOp Op(std::string_view op, const c10d::ReduceOp& reduce_op) const {
    auto o = PlexusOp(reduce_op);
    if (!o) {
      Refuse(rank, op,
             absl::StrCat("reduce op ", static_cast<int>(reduce_op.op_),
                          " is not supported; supported: SUM, AVG, PRODUCT, MIN, MAX"));
    }
    return *o;
  }

  // Data the communicator reads: `t` itself when contiguous, else a contiguous copy.
  static at::Tensor Input(const at::Tensor& t) { return t.contiguous(); }
  // Buffer the communicator writes in place of `t`: `t` when contiguous, else a contiguous copy
  // (with `t`'s values, for in-place calls) that `post` copies back.
  static at::Tensor InOut(const at::Tensor& t, std::vector<std::function<void()>>& posts) {
    if (t.is_contiguous()) return t;
    at::Tensor staged = t.contiguous();
    posts.push_back([t, staged]() mutable { t.copy_(staged); });
    return staged;
  }
  static void SyncIfCuda(const at::Tensor& t) {
#if PLEXUS_HAVE_CUDA
    if (IsCuda(t)) {
      const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      impl->synchronizeStream(impl->getStream(t.device()));
    }
#else
    (void)t;
#endif
  }

  c10::intrusive_ptr<PlexusWork> NewWork(c10d::OpType type, std::string what,
                                         std::vector<at::Tensor> outputs) {
    ++sequence;
    return c10::make_intrusive<PlexusWork>(rank, type, std::move(what), std::move(outputs));
  }
  static void SetPosts(PlexusWork& work, std::vector<std::function<void()>> posts) {
    if (posts.empty()) return;
    work.post = [posts = std::move(posts)] {
      for (const auto& p : posts) p();
    };
  }
  // The tail of a call with one staged send buffer and one output tensor: stages `output`, keeps
  // both alive, starts `start(send, recv)`, copies back into `output` when the call ends, queues.
  c10::intrusive_ptr<c10d::Work> StartOneToOne(
      c10::intrusive_ptr<PlexusWork> work, at::Tensor send, at::Tensor& output,
      const std::function<Call(at::Tensor&, at::Tensor&)>& start) {
    std::vector<std::function<void()>> posts;
    at::Tensor recv = InOut(output, posts);
    SyncIfCuda(send);
    work->keep_alive = {send, recv};
    work->parts.push_back(start(send, recv));
    SetPosts(*work, std::move(posts));
    return Queue(work);
  }
  c10::intrusive_ptr<c10d::Work> Queue(c10::intrusive_ptr<PlexusWork> work) {
    work->scheduler = scheduler;
    {
      std::lock_guard<std::mutex> lock(scheduler->mu);
      work->sequence = ++scheduler->issued;
      scheduler->queue.push_back(work);
    }
    scheduler->cv.notify_all();
    return work;
  }
};

c10::intrusive_ptr<ProcessGroupPlexus> ProcessGroupPlexus::Create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "plexus: no store given");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "plexus: rank ", rank,
              " is not in a group of ", size);
  const absl::Duration limit = timeout.count() > 0 ? absl::FromChrono(timeout) : absl::Minutes(30);
  auto fail = [&](std::string_view what, const absl::Status& s) {
    TORCH_CHECK(false, "plexus (rank ", rank, " of ", size, "): ", std::string(what), ": ",
                s.ToString());
  };
  auto rdv = transport::Rendezvous::Create(rank, size, AdaptStore(store));
  if (!rdv.ok()) fail("rendezvous over the torch store", rdv.status());
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->rendezvous = std::make_unique<transport::Rendezvous>(std::move(*rdv));

  auto forced = kTransportParam.Get();
  if (!forced.ok()) fail("reading PLEXUS_TORCH_TRANSPORT", forced.status());
  pc::CommunicatorOptions options;
  options.timeout = limit;
  options.connect_timeout = limit;
  if (forced->empty()) {
    // shm when every rank runs on this host, tcp otherwise.
    auto hosts = impl->rendezvous->AllGather("plexus/torch/hosts", base::HostName(), limit);
    if (!hosts.ok()) fail("exchanging host names", hosts.status());
    const bool one_host =
        std::all_of(hosts->begin(), hosts->end(), [&](const auto& h) { return h == (*hosts)[0]; });
    options.device.backend = one_host ? transport::Backend::kShm : transport::Backend::kTcp;
  } else {
    auto backend = transport::ParseBackend(*forced);
    if (!backend.ok() ||
        (*backend != transport::Backend::kTcp && *backend != transport::Backend::kShm)) {
      fail("PLEXUS_TORCH_TRANSPORT",
           absl::InvalidArgumentError(absl::StrCat("'", *forced, "' is not tcp or shm")));
    }
    options.device.backend = *backend;
    options.transport_policy = pc::TransportPolicy::kUniform;
  }
  auto progress = kProgressParam.Get();
  if (!progress.ok()) fail("reading PLEXUS_TORCH_PROGRESS", progress.status());
  if (*progress == "caller") options.device.progress = transport::ProgressMode::kCaller;
  impl->transport = std::string(transport::BackendName(options.device.backend));
  auto comm = pc::Communicator::Create(*impl->rendezvous, options);
  if (!comm.ok()) fail("connecting the ranks", comm.status());
  impl->comm = std::move(*comm);
  impl->scheduler->rank = rank;
  impl->scheduler->size = size;
  impl->executor = std::thread([p = impl.get()] { p->Run(); });
  pthread_setname_np(impl->executor.native_handle(), "plexus-torch");
  return c10::intrusive_ptr<ProcessGroupPlexus>::unsafe_steal_from_new(
      new ProcessGroupPlexus(rank, size, std::move(impl)));
}

ProcessGroupPlexus::ProcessGroupPlexus(int rank, int size, std::unique_ptr<Impl> impl)
    : c10d::ProcessGroup(rank, size), impl_(std::move(impl)) {}

namespace {
std::atomic<GilReleaser> gil_releaser{nullptr};
}  // namespace

void SetGilReleaser(GilReleaser releaser) { gil_releaser.store(releaser); }

ProcessGroupPlexus::~ProcessGroupPlexus() {
  const GilReleaser releaser = gil_releaser.load();
  std::shared_ptr<void> no_gil = releaser != nullptr ? releaser() : nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->scheduler->mu);
    impl_->scheduler->stop = true;
  }
  impl_->scheduler->cv.notify_all();
  // The executor drains the queue (and waits for a caller running a call) before it returns.
  if (impl_->executor.joinable()) impl_->executor.join();
  impl_->comm.reset();
}

std::string ProcessGroupPlexus::transport() const { return impl_->transport; }

void ProcessGroupPlexus::setSequenceNumberForGroup() { impl_->sequence = 0; }
uint64_t ProcessGroupPlexus::getSequenceNumberForGroup() { return impl_->sequence; }

// ---------------------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("broadcast", tensors);
  m.CheckRoot("broadcast", opts.rootRank);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::BROADCAST, "broadcast", tensors);
  std::vector<std::function<void()>> posts;
  at::Tensor buf = Impl::InOut(tensors[0], posts);
  Impl::SyncIfCuda(buf);
  work->keep_alive = {buf};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->Broadcast(buf.data_ptr(), buf.data_ptr(), buf.nbytes(), pc::DataType::kU8,
                        static_cast<int>(opts.rootRank));
  }));
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("allreduce", tensors);
  const pc::DataType dtype = m.Reducible("allreduce", tensors[0]);
  const pc::ReduceOp op = m.Op("allreduce", opts.reduceOp);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::ALLREDUCE, "allreduce", tensors);
  std::vector<std::function<void()>> posts;
  at::Tensor buf = Impl::InOut(tensors[0], posts);
  Impl::SyncIfCuda(buf);
  work->keep_alive = {buf};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->AllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dtype, op);
  }));
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Impl& m = *impl_;
  if (tensors.empty()) Refuse(m.rank, "allreduce_coalesced", "no tensors given");
  std::vector<pc::DataType> dtypes;
  for (const auto& t : tensors) {
    m.CheckTensor("allreduce_coalesced", t);
    dtypes.push_back(m.Reducible("allreduce_coalesced", t));
  }
  const pc::ReduceOp op = m.Op("allreduce_coalesced", opts.reduceOp);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors);
  std::vector<std::function<void()>> posts;
  // One allreduce per tensor: no flattening copy, and mixed dtypes work.
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor buf = Impl::InOut(tensors[i], posts);
    Impl::SyncIfCuda(buf);
    work->keep_alive.push_back(buf);
    const pc::DataType d = dtypes[i];
    work->parts.push_back(Call([=, c = m.comm.get()] {
      return c->AllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), d, op);
    }));
  }
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("reduce", tensors);
  m.CheckRoot("reduce", opts.rootRank);
  const pc::DataType dtype = m.Reducible("reduce", tensors[0]);
  const pc::ReduceOp op = m.Op("reduce", opts.reduceOp);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::REDUCE, "reduce", tensors);
  std::vector<std::function<void()>> posts;
  const bool root = opts.rootRank == m.rank;
  at::Tensor buf = root ? Impl::InOut(tensors[0], posts) : Impl::Input(tensors[0]);
  Impl::SyncIfCuda(buf);
  work->keep_alive = {buf};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->Reduce(buf.data_ptr(), root ? buf.data_ptr() : nullptr, buf.numel(), dtype, op,
                     static_cast<int>(opts.rootRank));
  }));
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

namespace {

// A contiguous buffer of `n` blocks shaped like `like`, flattened.
at::Tensor Blocks(const at::Tensor& like, int64_t n) {
  return at::empty({n * like.numel()}, like.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  Impl& m = *impl_;
  m.CheckSingle("allgather", inputs);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != m.size) {
    Refuse(m.rank, "allgather",
           absl::StrCat("expects one list of ", m.size, " output tensors (one per rank)"));
  }
  const at::Tensor& in = inputs[0];
  for (const auto& o : outputs[0]) {
    m.CheckTensor("allgather", o);
    if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type()) {
      Refuse(m.rank, "allgather",
             absl::StrCat("every output tensor must match the input (", in.numel(), " elements of ",
                          c10::toString(in.scalar_type()), "), got ", o.numel(), " of ",
                          c10::toString(o.scalar_type())));
    }
  }
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::ALLGATHER, "allgather", outputs[0]);
  at::Tensor send = Impl::Input(in);
  at::Tensor recv = Blocks(in, m.size);
  Impl::SyncIfCuda(send);
  work->keep_alive = {send, recv};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->AllGather(send.data_ptr(), recv.data_ptr(), send.nbytes(), pc::DataType::kU8);
  }));
  work->post = [outs = outputs[0], recv, n = in.numel()]() mutable {
    for (size_t r = 0; r < outs.size(); ++r) {
      outs[r].copy_(recv.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    }
  };
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Impl& m = *impl_;
  if (outputs.size() != static_cast<size_t>(m.size)) {
    Refuse(m.rank, "allgather_coalesced",
           absl::StrCat("expects ", m.size, " output lists (one per rank)"));
  }
  // One allgather per input: outputs[r][i] is rank r's inputs[i].
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<at::Tensor>> per_input(1);
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < m.size; ++r) {
      if (outputs[r].size() != inputs.size()) {
        Refuse(m.rank, "allgather_coalesced",
               absl::StrCat("output list ", r, " has ", outputs[r].size(), " tensors, expected ",
                            inputs.size()));
      }
      outs[0].push_back(outputs[r][i]);
    }
    std::vector<at::Tensor> in{inputs[i]};
    last = allgather(outs, in, opts);
  }
  if (!last) return barrier(c10d::BarrierOptions());
  // Calls complete in issue order: the last one completing means all did, but an earlier
  // failure breaks the communicator, so the last one fails too.
  return last;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::_allgather_base(at::Tensor& output,
                                                                   at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  Impl& m = *impl_;
  m.CheckTensor("_allgather_base", input);
  m.CheckTensor("_allgather_base", output);
  if (output.numel() != input.numel() * m.size || output.scalar_type() != input.scalar_type()) {
    Refuse(m.rank, "_allgather_base",
           absl::StrCat("output must hold ", m.size, " x ", input.numel(),
                        " elements of the input's type, got ", output.numel(), " of ",
                        c10::toString(output.scalar_type())));
  }
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", {output});
  return m.StartOneToOne(work, Impl::Input(input), output, [&](at::Tensor& send, at::Tensor& recv) {
    return Call([=, c = m.comm.get()] {
      return c->AllGather(send.data_ptr(), recv.data_ptr(), send.nbytes(), pc::DataType::kU8);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("reduce_scatter", outputs);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != m.size) {
    Refuse(m.rank, "reduce_scatter",
           absl::StrCat("expects one list of ", m.size, " input tensors (one per rank)"));
  }
  const at::Tensor& out = outputs[0];
  const pc::DataType dtype = m.Reducible("reduce_scatter", out);
  const pc::ReduceOp op = m.Op("reduce_scatter", opts.reduceOp);
  for (const auto& i : inputs[0]) {
    m.CheckTensor("reduce_scatter", i);
    if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type()) {
      Refuse(m.rank, "reduce_scatter", "every input tensor must match the output's size and type");
    }
  }
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs);
  std::vector<at::Tensor> flat;
  for (const auto& i : inputs[0]) flat.push_back(i.reshape({-1}));
  return m.StartOneToOne(work, at::cat(flat), outputs[0], [&](at::Tensor& send, at::Tensor& recv) {
    return Call([=, c = m.comm.get()] {
      return c->ReduceScatter(send.data_ptr(), recv.data_ptr(), recv.numel(), dtype, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Impl& m = *impl_;
  m.CheckTensor("_reduce_scatter_base", input);
  m.CheckTensor("_reduce_scatter_base", output);
  const pc::DataType dtype = m.Reducible("_reduce_scatter_base", output);
  const pc::ReduceOp op = m.Op("_reduce_scatter_base", opts.reduceOp);
  if (input.numel() != output.numel() * m.size || output.scalar_type() != input.scalar_type()) {
    Refuse(m.rank, "_reduce_scatter_base",
           absl::StrCat("input must hold ", m.size, " x ", output.numel(),
                        " elements of the output's type, got ", input.numel(), " of ",
                        c10::toString(input.scalar_type())));
  }
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output});
  return m.StartOneToOne(work, Impl::Input(input), output, [&](at::Tensor& send, at::Tensor& recv) {
    return Call([=, c = m.comm.get()] {
      return c->ReduceScatter(send.data_ptr(), recv.data_ptr(), recv.numel(), dtype, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) {
  Impl& m = *impl_;
  m.CheckTensor("alltoall_base", input);
  m.CheckTensor("alltoall_base", output);
  if (input.scalar_type() != output.scalar_type()) {
    Refuse(m.rank, "alltoall_base", "input and output must have the same type");
  }
  // Splits are rows of dim 0; empty splits mean equal parts.
  auto bytes_per = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
    std::vector<size_t> counts(m.size), displs(m.size);
    if (splits.empty()) {
      if (rows % m.size != 0) {
        Refuse(m.rank, "alltoall_base",
               absl::StrCat(which, " dim 0 (", rows, ") does not divide by the group size ", m.size,
                            " and no split sizes were given"));
      }
      for (int r = 0; r < m.size; ++r) counts[r] = row_bytes * (rows / m.size);
    } else {
      if (static_cast<int>(splits.size()) != m.size) {
        Refuse(m.rank, "alltoall_base",
               absl::StrCat(which, " split sizes have ", splits.size(), " entries, expected ",
                            m.size));
      }
      int64_t total = 0;
      for (int r = 0; r < m.size; ++r) {
        if (splits[r] < 0) Refuse(m.rank, "alltoall_base", "negative split size");
        total += splits[r];
        counts[r] = row_bytes * static_cast<size_t>(splits[r]);
      }
      if (total != rows) {
        Refuse(m.rank, "alltoall_base",
               absl::StrCat(which, " split sizes sum to ", total, " but dim 0 is ", rows));
      }
    }
    size_t at = 0;
    for (int r = 0; r < m.size; ++r) {
      displs[r] = at;
      at += counts[r];
    }
    return std::pair{counts, displs};
  };
  auto [send_counts, send_displs] = bytes_per(input, input_splits, "input");
  auto [recv_counts, recv_displs] = bytes_per(output, output_splits, "output");
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::ALLTOALL_BASE, "alltoall_base", {output});
  std::vector<std::function<void()>> posts;
  at::Tensor send = Impl::Input(input);
  at::Tensor recv = Impl::InOut(output, posts);
  Impl::SyncIfCuda(send);
  work->keep_alive = {send, recv};
  // The counts and displacements travel in the call (the communicator reads them as it runs).
  const std::vector<std::vector<size_t>> s = {std::move(send_counts), std::move(send_displs),
                                              std::move(recv_counts), std::move(recv_displs)};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->AllToAllV(send.data_ptr(), s[0], s[1], recv.data_ptr(), s[2], s[3],
                        pc::DataType::kU8);
  }));
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  Impl& m = *impl_;
  if (static_cast<int>(inputs.size()) != m.size || static_cast<int>(outputs.size()) != m.size) {
    Refuse(m.rank, "alltoall",
           absl::StrCat("expects ", m.size, " input and ", m.size, " output tensors, got ",
                        inputs.size(), " and ", outputs.size()));
  }
  std::vector<size_t> send_counts(m.size), send_displs(m.size), recv_counts(m.size),
      recv_displs(m.size);
  std::vector<at::Tensor> flat;
  size_t send_at = 0, recv_at = 0;
  for (int r = 0; r < m.size; ++r) {
    m.CheckTensor("alltoall", inputs[r]);
    m.CheckTensor("alltoall", outputs[r]);
    if (inputs[r].scalar_type() != inputs[0].scalar_type() ||
        outputs[r].scalar_type() != inputs[0].scalar_type()) {
      Refuse(m.rank, "alltoall", "every input and output tensor must have the same type");
    }
    flat.push_back(inputs[r].reshape({-1}));
    send_counts[r] = inputs[r].nbytes();
    send_displs[r] = send_at;
    send_at += send_counts[r];
    recv_counts[r] = outputs[r].nbytes();
    recv_displs[r] = recv_at;
    recv_at += recv_counts[r];
  }
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::ALLTOALL, "alltoall", outputs);
  at::Tensor send = at::cat(flat);
  at::Tensor recv = at::empty({static_cast<int64_t>(recv_at)}, send.options().dtype(at::kByte));
  Impl::SyncIfCuda(send);
  work->keep_alive = {send, recv};
  // The counts and displacements travel in the call (the communicator reads them as it runs).
  const std::vector<std::vector<size_t>> s = {std::move(send_counts), std::move(send_displs),
                                              std::move(recv_counts), std::move(recv_displs)};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->AllToAllV(send.data_ptr(), s[0], s[1], recv.data_ptr(), s[2], s[3],
                        pc::DataType::kU8);
  }));
  work->post = [outs = outputs, recv, displs = s[3], counts = s[2]]() mutable {
    for (size_t r = 0; r < outs.size(); ++r) {
      at::Tensor bytes =
          recv.narrow(0, static_cast<int64_t>(displs[r]), static_cast<int64_t>(counts[r]));
      outs[r].copy_(bytes.view(outs[r].scalar_type()).view(outs[r].sizes()));
    }
  };
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("gather", inputs);
  m.CheckRoot("gather", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor& in = inputs[0];
  m.CheckRootList("gather", root, outputs, in, "output");
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::GATHER, "gather",
                        m.rank == root ? outputs[0] : std::vector<at::Tensor>{});
  at::Tensor send = Impl::Input(in);
  Impl::SyncIfCuda(send);
  work->keep_alive.push_back(send);
  if (m.rank != root) {
    work->parts.push_back(Call([=, c = m.comm.get()] {
      return c->Send(send.data_ptr(), send.nbytes(), pc::DataType::kU8, root);
    }));
    return m.Queue(work);
  }
  // The root's own block is copied first, then staged outputs are copied back.
  std::vector<std::function<void()>> posts, copy_back;
  for (int r = 0; r < m.size; ++r) {
    at::Tensor out = Impl::InOut(outputs[0][r], copy_back);
    work->keep_alive.push_back(out);
    if (r == root) {
      posts.push_back([out, send]() mutable { out.view(-1).copy_(send.view(-1)); });
      continue;
    }
    work->parts.push_back(Call([=, c = m.comm.get()] {
      return c->Recv(out.data_ptr(), out.nbytes(), pc::DataType::kU8, r);
    }));
  }
  posts.insert(posts.end(), copy_back.begin(), copy_back.end());
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  Impl& m = *impl_;
  m.CheckSingle("scatter", outputs);
  m.CheckRoot("scatter", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor& out = outputs[0];
  m.CheckRootList("scatter", root, inputs, out, "input");
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::SCATTER, "scatter", outputs);
  std::vector<std::function<void()>> posts;
  at::Tensor recv = Impl::InOut(out, posts);
  work->keep_alive.push_back(recv);
  if (m.rank != root) {
    work->parts.push_back(Call([=, c = m.comm.get()] {
      return c->Recv(recv.data_ptr(), recv.nbytes(), pc::DataType::kU8, root);
    }));
  } else {
    for (int r = 0; r < m.size; ++r) {
      at::Tensor send = Impl::Input(inputs[0][r]);
      Impl::SyncIfCuda(send);
      work->keep_alive.push_back(send);
      if (r == root) {
        posts.insert(posts.begin(), [recv, send]() mutable { recv.view(-1).copy_(send.view(-1)); });
        continue;
      }
      work->parts.push_back(Call([=, c = m.comm.get()] {
        return c->Send(send.data_ptr(), send.nbytes(), pc::DataType::kU8, r);
      }));
    }
  }
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::send(std::vector<at::Tensor>& tensors, int dst,
                                                        int) {
  Impl& m = *impl_;
  m.CheckSingle("send", tensors);
  m.CheckPeer("send", dst);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::SEND, "send", tensors);
  at::Tensor buf = Impl::Input(tensors[0]);
  Impl::SyncIfCuda(buf);
  work->keep_alive = {buf};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->Send(buf.data_ptr(), buf.nbytes(), pc::DataType::kU8, dst);
  }));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::recv(std::vector<at::Tensor>& tensors, int src,
                                                        int) {
  Impl& m = *impl_;
  m.CheckSingle("recv", tensors);
  m.CheckPeer("recv", src);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::RECV, "recv", tensors);
  std::vector<std::function<void()>> posts;
  at::Tensor buf = Impl::InOut(tensors[0], posts);
  work->keep_alive = {buf};
  work->parts.push_back(Call([=, c = m.comm.get()] {
    return c->Recv(buf.data_ptr(), buf.nbytes(), pc::DataType::kU8, src);
  }));
  Impl::SetPosts(*work, std::move(posts));
  return m.Queue(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::barrier(const c10d::BarrierOptions&) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::BARRIER, "barrier", {});
  work->parts.push_back(Call([=, c = m.comm.get()] { return c->Barrier(); }));
  return m.Queue(work);
}

}  // namespace plexus::torch
