// A torch.distributed backend over plexus::collectives: a c10d::ProcessGroup under PyTorch 1.13,
// a c10d::Backend under PyTorch 2.x (the same class and semantics; see GroupBase).
//
//   import torch.distributed as dist, plexus_torch      # registers backend "plexus"
//   dist.init_process_group("plexus", rank=r, world_size=n, init_method="tcp://...")
//
// Semantics (docs/torch.md):
//  - The rendezvous runs over the c10d::Store torch hands the backend (a prefixed store per
//    group, so new_group works); no second store is opened.
//  - Ranks on one host connect over shm, others over tcp (PLEXUS_TORCH_TRANSPORT overrides).
//  - Every call is queued in call order and runs as blocking communicator calls, one at a time,
//    in the group's executor thread, or in the caller's thread when it blocks in wait() before
//    the executor got to it (a synchronous call then costs no thread hand-off). The returned
//    Work (wait, isCompleted, getFuture) completes in the thread that ran it; future callbacks
//    run there too, after the next call may already have started.
//  - CPU tensors of any layout-strided dtype move as bytes; reductions take f32, f64, f16,
//    bf16, i32, i64 and u8 with SUM, AVG, PRODUCT, MIN and MAX; anything else is refused with a
//    RuntimeError saying what is supported. Non-contiguous tensors are staged through
//    contiguous copies. CUDA tensors need a CUDA build of Plexus (PLEXUS_HAVE_CUDA).
//  - A failed call raises RuntimeError naming this rank and the rank that failed first; the
//    group is broken afterwards (every later call fails the same way). The group's timeout
//    (init_process_group(timeout=...)) bounds every call and the connection setup.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

// PyTorch 2 split the user-facing c10d::ProcessGroup from the c10d::Backend that a third-party
// library implements (the ProcessGroup dispatches to one Backend per device type); PyTorch 1.13
// has only ProcessGroup. Both declare the same virtual calls, so one class serves either.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define PLEXUS_TORCH_C10D_BACKEND 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define PLEXUS_TORCH_C10D_BACKEND 0
#endif

namespace plexus::torch {

#if PLEXUS_TORCH_C10D_BACKEND
using GroupBase = c10d::Backend;
#else
using GroupBase = c10d::ProcessGroup;
#endif

// Set by the Python binding: returns a guard that releases the GIL while it lives when the
// calling thread holds it (else nullptr). The destructor blocks (it joins the completion thread,
// which may need the GIL to free tensors, and waits for the other ranks) and must not hold it.
using GilReleaser = std::shared_ptr<void> (*)();
void SetGilReleaser(GilReleaser releaser);

class ProcessGroupPlexus : public GroupBase {
 public:
  // Collective over the `size` ranks sharing `store`: connects them, within `timeout`.
  // Throws c10::Error (RuntimeError in Python) naming the rank and the cause on failure.
  static c10::intrusive_ptr<ProcessGroupPlexus> Create(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout);

  // Waits for the calls issued so far, then closes the connections (collective, like
  // MPI_Comm_free; bounded by the timeout, at once when the group is broken).
  ~ProcessGroupPlexus() override;

  const std::string getBackendName() const override { return "plexus"; }
  // The transport the ranks connected over: "shm" or "tcp".
  std::string transport() const;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  // Matched in issue order per pair of ranks; `tag` is not used for matching.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  // The next send to this rank from whichever rank's arrived first (Communicator::RecvFromAny);
  // the work's sourceRank() names it once complete.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  struct Impl;

 private:
  ProcessGroupPlexus(int rank, int size, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::torch
