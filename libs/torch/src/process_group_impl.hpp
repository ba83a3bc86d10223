// The torch backend's state shared by its source files: argument checks, tensor staging and the
// issue path (ProcessGroupPlexus::Impl). Private to libs/torch/src.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "absl/strings/str_cat.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/config.hpp"
#include "plexus/torch/process_group.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "work.hpp"

namespace plexus::torch {
namespace internal {

namespace pc = plexus::collectives;

// Throws the RuntimeError Python sees for invalid arguments.
[[noreturn]] inline void Refuse(int rank, std::string_view op, std::string_view why) {
  TORCH_CHECK(false, "plexus (rank ", rank, "): ", std::string(op), ": ", std::string(why));
}

inline std::optional<pc::DataType> ReducibleType(at::ScalarType t) {
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

inline std::optional<pc::ReduceOp> PlexusOp(const c10d::ReduceOp& op) {
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

inline bool IsCuda(const at::Tensor& t) { return t.device().is_cuda(); }

}  // namespace internal

struct ProcessGroupPlexus::Impl {
  using Call = internal::Call;
  using PlexusWork = internal::PlexusWork;
  using Scheduler = internal::Scheduler;

  int rank = 0;
  int size = 1;
  std::string transport;
  std::unique_ptr<transport::Rendezvous> rendezvous;
  std::unique_ptr<collectives::Communicator> comm;
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
  // The flat collectives (_allgather_base, _reduce_scatter_base): `whole` holds size x
  // `part`'s elements, of `part`'s type. `whole_name` / `part_name`: "output" / "input" or back.
  void CheckFlat(std::string_view op, const at::Tensor& whole, const char* whole_name,
                 const at::Tensor& part, const char* part_name) const {
    if (whole.numel() != part.numel() * size || whole.scalar_type() != part.scalar_type()) {
      internal::Refuse(rank, op,
                       absl::StrCat(whole_name, " must hold ", size, " x ", part.numel(),
                                    " elements of the ", part_name, "'s type, got ", whole.numel(),
                                    " of ", c10::toString(whole.scalar_type())));
    }
  }
  void CheckTensor(std::string_view op, const at::Tensor& t) const {
    if (!t.defined()) internal::Refuse(rank, op, "undefined tensor");
    if (t.is_sparse()) internal::Refuse(rank, op, "sparse tensors are not supported");
    if (t.layout() != at::kStrided)
      internal::Refuse(rank, op, "only strided tensors are supported");
    if (internal::IsCuda(t)) {
#if PLEXUS_HAVE_CUDA
      return;
#else
      internal::Refuse(
          rank, op,
          "CUDA tensors need Plexus built with CUDA (PLEXUS_WITH_CUDA); this build moves CPU "
          "tensors only");
#endif
    }
    if (!t.device().is_cpu()) {
      internal::Refuse(rank, op,
                       absl::StrCat("tensors on ", t.device().str(), " are not supported"));
    }
  }
  void CheckSingle(std::string_view op, const std::vector<at::Tensor>& ts) const {
    if (ts.size() != 1) {
      internal::Refuse(rank, op,
                       absl::StrCat("expects exactly one tensor per call, got ", ts.size()));
    }
    CheckTensor(op, ts[0]);
  }
  void CheckRoot(std::string_view op, int64_t root) const {
    if (root < 0 || root >= size) {
      internal::Refuse(rank, op,
                       absl::StrCat("root ", root, " is not a rank of this group of ", size));
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
        internal::Refuse(rank, op, absl::StrCat("only the root takes ", what, " tensors"));
      }
      return;
    }
    if (per_rank.size() != 1 || static_cast<int>(per_rank[0].size()) != size) {
      internal::Refuse(rank, op,
                       absl::StrCat("the root expects one list of ", size, " ", what, " tensors"));
    }
    for (const auto& t : per_rank[0]) {
      CheckTensor(op, t);
      if (t.nbytes() != reference.nbytes() || t.scalar_type() != reference.scalar_type()) {
        internal::Refuse(rank, op,
                         absl::StrCat("every ", what, " tensor must match the ",
                                      what == "output" ? "input" : "output", "'s size and type"));
      }
    }
  }
  void CheckPeer(std::string_view op, int peer) const {
    if (peer < 0 || peer >= size || peer == rank) {
      internal::Refuse(rank, op,
                       absl::StrCat("peer ", peer, " is not another rank of this group of ", size));
    }
  }
  collectives::DataType Reducible(std::string_view op, const at::Tensor& t) const {
    auto type = internal::ReducibleType(t.scalar_type());
    if (!type) {
      internal::Refuse(
          rank, op,
          absl::StrCat("cannot reduce tensors of type ", c10::toString(t.scalar_type()),
                       "; supported: float32, float64, float16, bfloat16, int32, int64, uint8"));
    }
    return *type;
  }
  collectives::ReduceOp Op(std::string_view op, const c10d::ReduceOp& reduce_op) const {
    auto o = internal::PlexusOp(reduce_op);
    if (!o) {
      internal::Refuse(rank, op,
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
    if (internal::IsCuda(t)) {
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

}  // namespace plexus::torch
