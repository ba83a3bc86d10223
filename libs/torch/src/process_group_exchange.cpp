// ProcessGroupPlexus's exchanges: reduce-scatter, all-to-all, gather, scatter, send/recv and
// barrier (see process_group.cpp for creation and the broadcast / reduction / allgather calls).
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "process_group_impl.hpp"

namespace plexus::torch {
namespace {

namespace pc = plexus::collectives;
using internal::Call;
using internal::PlexusWork;
using internal::Refuse;

}  // namespace

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
  m.CheckFlat("_reduce_scatter_base", input, "input", output, "output");
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

c10::intrusive_ptr<c10d::Work> ProcessGroupPlexus::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int) {
  Impl& m = *impl_;
  m.CheckSingle("recvAnysource", tensors);
  std::lock_guard<std::mutex> issue(m.issue_mu);
  auto work = m.NewWork(c10d::OpType::RECVANYSOURCE, "recvAnysource", tensors);
  std::vector<std::function<void()>> posts;
  at::Tensor buf = Impl::InOut(tensors[0], posts);
  work->keep_alive = {buf};
  // The work outlives the execution of its parts, which it owns.
  PlexusWork* w = work.get();
  work->parts.push_back(Call([=, c = m.comm.get()] {
    absl::StatusOr<int> source = c->RecvFromAny(buf.data_ptr(), buf.nbytes(), pc::DataType::kU8);
    if (!source.ok()) return source.status();
    w->source_rank.store(*source);
    return absl::OkStatus();
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
