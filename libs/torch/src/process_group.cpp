// ProcessGroupPlexus: creation (rendezvous on torch's store, the communicator, the executor),
// destruction, and the broadcast / reduction / allgather calls. The exchanges (reduce-scatter,
// all-to-all, gather, scatter, send/recv, barrier) are in process_group_exchange.cpp.
#include "plexus/torch/process_group.hpp"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "process_group_impl.hpp"
#include "store_adapter.hpp"

namespace plexus::torch {
namespace {

namespace pc = plexus::collectives;
using internal::Call;
using internal::PlexusWork;
using internal::Refuse;

const base::Param<std::string> kTransportParam(
    "PLEXUS_TORCH_TRANSPORT", "",
    "transport of the torch backend: tcp or shm (default: shm when every rank is on one host)");
const base::Param<std::string> kLoopbackCcParam(
    "PLEXUS_TORCH_LOOPBACK_CC", "",
    "tcp congestion control between ranks of one host: a kernel algorithm's name, or system "
    "(the system's, as Gloo uses); default: the transport's (reno)");

}  // namespace

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
  auto cc = kLoopbackCcParam.Get();
  if (!cc.ok()) fail("reading PLEXUS_TORCH_LOOPBACK_CC", cc.status());
  if (!cc->empty()) options.device.tcp.loopback_congestion_control = *cc == "system" ? "" : *cc;
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
    : GroupBase(rank, size), impl_(std::move(impl)) {}

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
  m.CheckFlat("_allgather_base", output, "output", input, "input");
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", {output});
  return m.StartOneToOne(work, Impl::Input(input), output, [&](at::Tensor& send, at::Tensor& recv) {
    return Call([=, c = m.comm.get()] {
      return c->AllGather(send.data_ptr(), recv.data_ptr(), send.nbytes(), pc::DataType::kU8);
    });
  });
}

}  // namespace plexus::torch
