// The latency prober: a full mesh over the transport, then a round-robin tournament in which
// each pair of ranks times `probes` round trips in each direction (the lower rank pings first),
// then every rank's row is gathered through the store.
#include "plexus/collectives/probe.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "plexus/base/host.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/mesh.hpp"

namespace plexus::collectives {
namespace pt = plexus::transport;
using netmodel::CostMatrix;

std::vector<std::vector<std::pair<int, int>>> TournamentRounds(int n) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (n < 2) return rounds;
  const int m = n % 2 == 0 ? n : n + 1;  // m - 1 is a dummy (a bye) when n is odd
  for (int r = 0; r < m - 1; ++r) {
    std::vector<std::pair<int, int>> pairs;
    auto add = [&](int a, int b) {
      if (a >= n || b >= n) return;
      pairs.emplace_back(std::min(a, b), std::max(a, b));
    };
    add(r, m - 1);
    for (int k = 1; k < m / 2; ++k) add((r + k) % (m - 1), (r - k + m - 1) % (m - 1));
    std::sort(pairs.begin(), pairs.end());
    rounds.push_back(std::move(pairs));
  }
  return rounds;
}

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(std::clamp(p, 0.0, 1.0) * samples.size());
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return samples[std::min(index, samples.size() - 1)];
}

CostMatrix LatencyMatrixFromRtts(std::vector<std::string> labels, const std::vector<double>& rtt,
                                 const std::vector<double>& self, bool subtract_self) {
  CostMatrix m;
  m.n = static_cast<int>(labels.size());
  m.labels = std::move(labels);
  const size_t n = m.labels.size();
  m.latency_us.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      double v = std::max(rtt[i * n + j], rtt[j * n + i]);
      if (subtract_self) v -= (self[i] + self[j]) / 2;
      m.latency_us[i * n + j] = std::max(0.0, v);
    }
  }
  return m;
}

namespace {

using Clock = std::chrono::steady_clock;

// The 8-byte payload of a probe: round and sequence number, checked on the echo.
struct Payload {
  uint32_t round;
  uint32_t seq;
};

// Completions of one rank's probe operations arrive in any order (an echo may complete before
// its ping's send is reported): those that are not yet waited for are kept.
struct Waiter {
  pt::CompletionQueue* cq;
  absl::Duration timeout;
  std::vector<uint64_t> early = {};

  // Waits for the completion of wr_id. `what` describes the wait for errors.
  absl::Status Wait(uint64_t wr_id, const std::function<std::string()>& what) {
    if (auto it = std::find(early.begin(), early.end(), wr_id); it != early.end()) {
      early.erase(it);
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat(what(), ": nothing within ", absl::FormatDuration(timeout)));
      }
      auto c = cq->Wait(left, absl::Microseconds(200));
      if (!c.ok()) {
        if (absl::IsDeadlineExceeded(c.status())) continue;
        return base::Annotate(c.status(), what());
      }
      if (!c->status.ok()) return base::Annotate(c->status, what());
      if (c->wr_id == wr_id) return absl::OkStatus();
      early.push_back(c->wr_id);
    }
  }
};

// Times `warmup + probes` round trips: `ping` sends on `out` and the echo comes back on `back`
// (the same connection for a peer, the other end of a loopback pair for the self probe);
// `echo` (when not null) is the loopback's far end, answered in this thread.
absl::StatusOr<std::vector<double>> Ping(pt::Connection* out, pt::Connection* back,
                                         pt::Connection* echo_in, Waiter& w, uint32_t round,
                                         int warmup, int probes,
                                         const std::function<std::string()>& what) {
  std::vector<double> rtts;
  rtts.reserve(probes);
  Payload tx{}, rx{}, mid{};
  uint64_t id = 1;
  for (int k = 0; k < warmup + probes; ++k) {
    tx = {round, static_cast<uint32_t>(k)};
    const uint64_t recv_id = id++, send_id = id++;
    PLEXUS_RETURN_IF_ERROR(back->PostRecv({&rx, sizeof rx}, recv_id));
    const auto start = Clock::now();
    PLEXUS_RETURN_IF_ERROR(out->PostSend(pt::ConstBuffer{&tx, sizeof tx}, send_id));
    if (echo_in != nullptr) {  // loopback: answer on the far end ourselves
      const uint64_t mid_recv = id++, mid_send = id++;
      PLEXUS_RETURN_IF_ERROR(echo_in->PostRecv({&mid, sizeof mid}, mid_recv));
      PLEXUS_RETURN_IF_ERROR(w.Wait(send_id, what));
      PLEXUS_RETURN_IF_ERROR(w.Wait(mid_recv, what));
      PLEXUS_RETURN_IF_ERROR(echo_in->PostSend(pt::ConstBuffer{&mid, sizeof mid}, mid_send));
      PLEXUS_RETURN_IF_ERROR(w.Wait(mid_send, what));
    } else {
      PLEXUS_RETURN_IF_ERROR(w.Wait(send_id, what));
    }
    PLEXUS_RETURN_IF_ERROR(w.Wait(recv_id, what));
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (rx.round != tx.round || rx.seq != tx.seq) {
      return absl::DataLossError(absl::StrCat(what(), ": echo carries round ", rx.round, " probe ",
                                              rx.seq, ", expected round ", tx.round, " probe ",
                                              tx.seq));
    }
    if (k >= warmup) rtts.push_back(us);
  }
  return rtts;
}

// Answers `count` pings from the peer on `conn`.
absl::Status Echo(pt::Connection* conn, Waiter& w, int count,
                  const std::function<std::string()>& what) {
  Payload p{};
  uint64_t id = 1;
  for (int k = 0; k < count; ++k) {
    const uint64_t recv_id = id++, send_id = id++;
    PLEXUS_RETURN_IF_ERROR(conn->PostRecv({&p, sizeof p}, recv_id));
    PLEXUS_RETURN_IF_ERROR(w.Wait(recv_id, what));
    PLEXUS_RETURN_IF_ERROR(conn->PostSend(pt::ConstBuffer{&p, sizeof p}, send_id));
    PLEXUS_RETURN_IF_ERROR(w.Wait(send_id, what));
  }
  return absl::OkStatus();
}

// This rank's loopback RTT (percentile): two connections of one device to each other.
absl::StatusOr<double> SelfLatency(pt::Device& device, const ProbeOptions& o, int rank) {
  auto cq = device.CreateCompletionQueue();
  PLEXUS_ASSIGN_OR_RETURN(auto listener, device.Listen(""));
  absl::StatusOr<std::unique_ptr<pt::Connection>> accepted = absl::UnknownError("not accepted");
  std::thread acceptor([&] { accepted = listener->Accept(cq.get(), o.timeout); });
  auto connected = device.Connect(listener->address(), cq.get());
  acceptor.join();
  const std::string what_rank = absl::StrCat("latency probe: rank ", rank, " loopback");
  if (!connected.ok()) return base::Annotate(connected.status(), what_rank);
  if (!accepted.ok()) return base::Annotate(accepted.status(), what_rank);
  Waiter w{cq.get(), o.timeout};
  auto what = [&] { return what_rank; };
  PLEXUS_ASSIGN_OR_RETURN(auto rtts, Ping(connected->get(), connected->get(), accepted->get(), w, 0,
                                          o.warmup, o.probes, what));
  return Percentile(std::move(rtts), o.percentile);
}

}  // namespace

absl::StatusOr<CostMatrix> ProbeLatency(pt::Rendezvous& rdv, const ProbeOptions& o) {
  const int n = rdv.world_size();
  const int me = rdv.rank();
  if (o.probes < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latency probe: probes must be >= 1 and warmup >= 0, got ", o.probes, " and ", o.warmup));
  }
  if (!(o.percentile >= 0 && o.percentile <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("latency probe: percentile must be in 0..1, got ", o.percentile));
  }
  pt::DeviceOptions dopt;
  dopt.backend = o.backend;
  dopt.progress = pt::ProgressMode::kCaller;  // no thread hop between the wire and the clock
  dopt.local_address = o.local_address;
  dopt.op_timeout = o.timeout;
  dopt.connect_timeout = o.timeout;
  PLEXUS_ASSIGN_OR_RETURN(auto device, pt::Device::Create(dopt));

  double self_us = 0;
  if (o.subtract_self) {
    PLEXUS_ASSIGN_OR_RETURN(self_us, SelfLatency(*device, o, me));
  }

  auto cq = device->CreateCompletionQueue();
  std::vector<double> row(n, 0);
  std::vector<std::string> rows;
  {
    auto mesh = pt::ConnectFullMesh(rdv, *device, cq.get(), o.tag, o.timeout);
    if (!mesh.ok()) {
      return base::Annotate(mesh.status(), absl::StrCat("latency probe: rank ", me, " connecting"));
    }
    Waiter w{cq.get(), o.timeout};
    const auto rounds = TournamentRounds(n);
    const int count = o.warmup + o.probes;
    for (size_t r = 0; r < rounds.size(); ++r) {
      for (auto [a, b] : rounds[r]) {
        if (a != me && b != me) continue;
        const int peer = a == me ? b : a;
        pt::Connection* conn = (*mesh)[peer].get();
        auto what = [&, a = a, b = b] {
          return absl::StrCat("latency probe round ", r + 1, "/", rounds.size(), ", pair (rank ", a,
                              ", rank ", b, "): rank ", me, " waiting for rank ", peer);
        };
        // The lower rank pings first, then echoes the higher rank's pings.
        for (int phase = 0; phase < 2; ++phase) {
          const bool pinger = (phase == 0) == (me == a);
          if (pinger) {
            PLEXUS_ASSIGN_OR_RETURN(
                auto rtts, Ping(conn, conn, nullptr, w, static_cast<uint32_t>(r + 1), o.warmup,
                                o.probes, what));
            row[peer] = Percentile(std::move(rtts), o.percentile);
          } else {
            PLEXUS_RETURN_IF_ERROR(Echo(conn, w, count, what));
          }
        }
      }
      if (o.progress) o.progress(static_cast<int>(r + 1), static_cast<int>(rounds.size()));
    }
    // Gathering the rows doubles as a barrier: no rank closes its connections before every
    // rank has received its last echo.
    std::string mine = absl::StrCat(base::HostName(), "\n", self_us, "\n", absl::StrJoin(row, " "));
    auto gathered = rdv.AllGather(absl::StrCat(o.tag, "/rows"), mine, o.timeout);
    if (!gathered.ok()) {
      return base::Annotate(gathered.status(),
                            absl::StrCat("latency probe: rank ", me, " gathering rows"));
    }
    rows = std::move(*gathered);
  }
  std::vector<std::string> labels;
  std::vector<double> rtt(static_cast<size_t>(n) * n, 0), self(n, 0);
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> parts = absl::StrSplit(rows[i], '\n');
    std::vector<std::string> cells = parts.size() == 3
                                         ? absl::StrSplit(parts[2], ' ', absl::SkipEmpty())
                                         : std::vector<std::string>{};
    bool ok = parts.size() == 3 && cells.size() == static_cast<size_t>(n) &&
              absl::SimpleAtod(parts[1], &self[i]);
    for (int j = 0; ok && j < n; ++j) ok = absl::SimpleAtod(cells[j], &rtt[size_t(i) * n + j]);
    if (!ok) {
      return absl::DataLossError(
          absl::StrCat("latency probe: rank ", i, "'s row is malformed: '", rows[i], "'"));
    }
    labels.push_back(parts[0].empty() ? absl::StrCat("rank", i) : parts[0]);
  }
  return LatencyMatrixFromRtts(std::move(labels), rtt, self, o.subtract_self);
}

}  // namespace plexus::collectives
