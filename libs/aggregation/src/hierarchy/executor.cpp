#include "plexus/aggregation/executor.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/aggregation/plink.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"

namespace plexus::aggregation {

using collectives::DataType;

absl::Status ExecutePlan(collectives::Communicator& comm, const Plan& plan, std::span<float> buffer,
                         const ExecuteOptions& options) {
  const int me = comm.rank();
  const std::string who = absl::StrCat("plan executor, rank ", me);
  if (comm.size() != plan.nodes) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": the communicator has ", comm.size(),
                                                   " ranks, the plan ", plan.nodes, " nodes"));
  }
  PLEXUS_RETURN_IF_ERROR(base::Annotate(VerifyPlan(plan), who));
  const int64_t total =
      plan.chunks.empty() ? 0 : plan.chunks.back().offset + plan.chunks.back().elements;
  if (static_cast<int64_t>(buffer.size()) != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": buffer of ", buffer.size(), " elements, the plan covers ", total));
  }
  const std::vector<int> round = CommunicationRounds(plan);
  const int rounds = round.empty() ? 0 : *std::max_element(round.begin(), round.end());
  std::vector<int> mine;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].node == me) mine.push_back(static_cast<int>(i));
  }
  std::vector<std::vector<float>> merge;
  for (const PlanChunk& c : plan.chunks) {
    merge.emplace_back(buffer.begin() + c.offset, buffer.begin() + c.offset + c.elements);
  }
  std::vector<char> done(plan.steps.size(), 0), delivered(plan.steps.size(), 0);
  std::vector<std::vector<float>> inbox(plan.steps.size());
  // Per round and peer, the staged payload of this rank's sends.
  std::vector<std::vector<float>> outgoing(plan.nodes);

  auto ready = [&](int i, int r) {
    const Step& s = plan.steps[i];
    for (int a : s.after) {
      if (!done[a]) return false;
    }
    if (s.kind == StepKind::kReceive) return static_cast<bool>(delivered[i]);
    if (s.kind == StepKind::kSend || s.kind == StepKind::kBroadcast) return round[i] <= r;
    return true;
  };
  auto run = [&](int i) {
    const Step& s = plan.steps[i];
    std::vector<float>& value = merge[s.chunk];
    switch (s.kind) {
      case StepKind::kSend:
      case StepKind::kBroadcast:
        for (int p : s.peers) outgoing[p].insert(outgoing[p].end(), value.begin(), value.end());
        break;
      case StepKind::kReceive:
        if (s.install) value = inbox[i];
        break;
      case StepKind::kAggregate:
        for (int a : s.after) {
          const Step& r = plan.steps[a];
          if (r.kind != StepKind::kReceive || r.install) continue;
          for (size_t k = 0; k < value.size(); ++k) value[k] += inbox[a][k];
        }
        break;
      case StepKind::kOptimize:
        for (float& x : value) x *= options.scale;
        break;
    }
    done[i] = 1;
  };
  auto progress = [&](int r) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int i : mine) {
        if (!done[i] && ready(i, r)) {
          run(i);
          moved = true;
        }
      }
    }
  };

  const size_t n = plan.nodes;
  for (int r = 1; r <= rounds; ++r) {
    for (auto& o : outgoing) o.clear();
    progress(r);
    std::vector<size_t> send_counts(n), send_displs(n), recv_counts(n, 0), recv_displs(n);
    std::vector<float> send_buf;
    for (size_t p = 0; p < n; ++p) {
      send_displs[p] = send_buf.size();
      send_counts[p] = outgoing[p].size();
      send_buf.insert(send_buf.end(), outgoing[p].begin(), outgoing[p].end());
    }
    for (int i : mine) {
      if ((plan.steps[i].kind == StepKind::kSend || plan.steps[i].kind == StepKind::kBroadcast) &&
          round[i] == r && !done[i]) {
        return absl::FailedPreconditionError(
            absl::StrCat(who, ": step ", i, " of round ", r, " could not run before the exchange"));
      }
    }
    std::vector<int> incoming;  // this round's receives, in step order
    for (int i : mine) {
      const Step& s = plan.steps[i];
      if (s.kind == StepKind::kReceive && round[i] == r) {
        incoming.push_back(i);
        recv_counts[s.peers[0]] += plan.chunks[s.chunk].elements;
      }
    }
    size_t recv_total = 0;
    for (size_t p = 0; p < n; ++p) {
      recv_displs[p] = recv_total;
      recv_total += recv_counts[p];
    }
    std::vector<float> recv_buf(recv_total);
    send_buf.resize(std::max<size_t>(send_buf.size(), 1));
    recv_buf.resize(std::max<size_t>(recv_buf.size(), 1));
    PLEXUS_RETURN_IF_ERROR(
        base::Annotate(comm.AllToAllV(send_buf.data(), send_counts, send_displs, recv_buf.data(),
                                      recv_counts, recv_displs, DataType::kF32),
                       absl::StrCat(who, ", round ", r)));
    std::vector<size_t> cursor = recv_displs;
    for (int i : incoming) {
      const Step& s = plan.steps[i];
      const size_t len = plan.chunks[s.chunk].elements;
      size_t& at = cursor[s.peers[0]];
      inbox[i].assign(recv_buf.begin() + at, recv_buf.begin() + at + len);
      at += len;
      delivered[i] = 1;
    }
  }
  progress(rounds + 1);
  for (int i : mine) {
    if (!done[i]) {
      return absl::InternalError(absl::StrCat(who, ": step ", i, " never became ready"));
    }
  }
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    std::copy(merge[c].begin(), merge[c].end(), buffer.begin() + plan.chunks[c].offset);
  }
  return absl::OkStatus();
}

absl::StatusOr<Matrix> ProbeLatencies(collectives::Communicator& comm, const ProbeOptions& o) {
  const int n = comm.size();
  const int me = comm.rank();
  if (o.probes_per_pair < 2 || !(o.percentile >= 0 && o.percentile <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("probe: probes_per_pair (", o.probes_per_pair,
                                                   ") >= 2 and percentile in [0, 1]"));
  }
  const absl::Time deadline = absl::Now() + o.deadline;
  std::vector<double> row(n, 0);
  const int even = n + (n % 2);  // the circle method; node `n` (odd n) is a bye
  std::vector<int> circle(even);
  for (int i = 0; i < even; ++i) circle[i] = i;
  for (int r = 0; r + 1 < even; ++r) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("probe, rank ", me, ": deadline of ", absl::FormatDuration(o.deadline),
                       " passed before round ", r, " of ", even - 1));
    }
    int peer = -1;
    for (int k = 0; k < even / 2; ++k) {
      const int a = circle[k], b = circle[even - 1 - k];
      if (a == me) peer = b;
      if (b == me) peer = a;
    }
    if (peer >= 0 && peer < n) {
      // Each side starts half the ping-pongs and times its own.
      std::vector<double> rtt;
      int64_t token = me;
      for (int p = 0; p < o.probes_per_pair; ++p) {
        const bool lead = (p % 2 == 0) == (me < peer);
        if (lead) {
          const auto t0 = std::chrono::steady_clock::now();
          PLEXUS_RETURN_IF_ERROR(base::Annotate(comm.Send(&token, 1, DataType::kI64, peer),
                                                absl::StrCat("probe, rank ", me, " -> ", peer)));
          PLEXUS_RETURN_IF_ERROR(base::Annotate(comm.Recv(&token, 1, DataType::kI64, peer),
                                                absl::StrCat("probe, rank ", me, " <- ", peer)));
          rtt.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        } else {
          PLEXUS_RETURN_IF_ERROR(base::Annotate(comm.Recv(&token, 1, DataType::kI64, peer),
                                                absl::StrCat("probe, rank ", me, " <- ", peer)));
          PLEXUS_RETURN_IF_ERROR(base::Annotate(comm.Send(&token, 1, DataType::kI64, peer),
                                                absl::StrCat("probe, rank ", me, " -> ", peer)));
        }
      }
      std::sort(rtt.begin(), rtt.end());
      const size_t at =
          std::min(rtt.size() - 1, static_cast<size_t>(o.percentile * (rtt.size() - 1) + 0.5));
      row[peer] = rtt[at] / 2;
    }
    std::rotate(circle.begin() + 1, circle.begin() + even - 1, circle.end());
  }
  std::vector<double> all(static_cast<size_t>(n) * n);
  PLEXUS_RETURN_IF_ERROR(base::Annotate(comm.AllGather(row.data(), all.data(), n, DataType::kF64),
                                        absl::StrCat("probe, rank ", me, ": sharing the matrix")));
  Matrix m(n, std::vector<double>(n, 0));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) m[i][j] = std::max(all[i * n + j], all[j * n + i]);
    }
  }
  return m;
}

}  // namespace plexus::aggregation
