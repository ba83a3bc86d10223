// plexus-bench-multipath: multipath channels on a netbed (two namespaces joined by K veth paths
// shaped with tbf) against single-path TCP, K independent TCP streams and kernel MPTCP:
// aggregate throughput against the sum of path rates, each path's share against its capacity
// share, failover outage (longest gap in delivered bytes) over link-down and blackhole trials,
// bytes lost or duplicated, and a 2-rank ring allreduce over MultipathDevices (K paths) against
// the same over one path. Needs root (network namespaces).
//
// This file: the throughput and failover sections and main; allreduce_bench.cpp and
// mptcp_bench.cpp hold the others (bench_common.hpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench_common.hpp"
#include "failover_series.hpp"
#include "multipath_bed.hpp"
#include "netbed.hpp"
#include "order.hpp"
#include "plexus/multipath/device.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "sockets.hpp"

namespace pt = plexus::transport;
namespace nb = plexus::netbed;
namespace tooling = plexus::tooling;

namespace plexus::mpbench {

namespace {

using plexus::mpbench::ConnectFrom;
using plexus::mpbench::ListenOn;

// ---- Raw TCP references ----

// Streams over `flows` (path k from 10.77.k.1 to 10.77.k.2, or MPTCP over path 1 with subflows)
// for warmup + seconds; returns the receivers' goodput in Mbit/s over the measured window, or
// DataLoss when a received byte differs from the one sent.
absl::StatusOr<double> TcpStreams(nb::Bed& bed, const std::vector<size_t>& paths, int protocol,
                                  double seconds) {
  std::vector<int> listeners(paths.size()), ports(paths.size()), servers(paths.size()),
      clients(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    PLEXUS_RETURN_IF_ERROR(nb::InNetns(bed.ns('b'), [&]() -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(listeners[i],
                              ListenOn(nb::Bed::Address('b', paths[i]), protocol, &ports[i]));
      return absl::OkStatus();
    }));
    PLEXUS_RETURN_IF_ERROR(nb::InNetns(bed.ns('a'), [&]() -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(
          clients[i], ConnectFrom(nb::Bed::Address('a', paths[i]), nb::Bed::Address('b', paths[i]),
                                  ports[i], protocol));
      return absl::OkStatus();
    }));
    // The listener stays open while the flows run: MPTCP subflows join through it.
    servers[i] = accept(listeners[i], nullptr, nullptr);
    if (servers[i] < 0) return absl::UnavailableError("accept failed");
  }
  // Byte o of each stream is o mod 251 (a prime, so no power-of-two period hides a misplaced
  // block); the receivers check every byte.
  constexpr size_t kPeriod = 251;
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> received(paths.size());
  std::atomic<uint64_t> wrong{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < paths.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> buf(kPeriod * 4177);  // ~1 MiB
      for (size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<uint8_t>(j % kPeriod);
      uint64_t sent = 0;
      while (!stop.load()) {
        const size_t at = sent % kPeriod;
        const ssize_t n = send(clients[i], buf.data() + at, buf.size() - at, MSG_NOSIGNAL);
        if (n < 0) break;
        sent += static_cast<uint64_t>(n);
      }
    });
    threads.emplace_back([&, i] {
      std::vector<uint8_t> buf(1 << 20);
      timeval tv{0, 200000};
      setsockopt(servers[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      uint64_t offset = 0, bad = 0;
      while (!stop.load()) {
        const ssize_t n = recv(servers[i], buf.data(), buf.size(), 0);
        if (n == 0) break;
        if (n < 0) continue;
        size_t expect = offset % kPeriod;
        for (ssize_t j = 0; j < n; ++j) {
          bad += buf[static_cast<size_t>(j)] != expect;
          if (++expect == kPeriod) expect = 0;
        }
        offset += static_cast<uint64_t>(n);
        received[i] += static_cast<uint64_t>(n);
      }
      wrong += bad;
    });
  }
  auto total = [&] {
    uint64_t t = 0;
    for (auto& r : received) t += r.load();
    return t;
  };
  absl::SleepFor(absl::Milliseconds(700));  // slow start, MPTCP subflows joining
  const uint64_t b0 = total();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  const uint64_t b1 = total();
  const absl::Time t1 = absl::Now();
  stop = true;
  for (int fd : clients) shutdown(fd, SHUT_RDWR);
  for (int fd : servers) shutdown(fd, SHUT_RDWR);
  for (auto& t : threads) t.join();
  for (int fd : clients) close(fd);
  for (int fd : servers) close(fd);
  for (int fd : listeners) close(fd);
  if (wrong.load() > 0) {
    return absl::DataLossError(absl::StrCat("raw ", protocol == 0 ? "tcp" : "mptcp", " stream: ",
                                            wrong.load(), " bytes differ from what was sent"));
  }
  return static_cast<double>(b1 - b0) * 8 / absl::ToDoubleSeconds(t1 - t0) / 1e6;
}

}  // namespace

// ---- Multipath stream ----

absl::StatusOr<StreamResult> MultipathStream(std::unique_ptr<nb::BedChannels> owned,
                                             const Args& args, double seconds,
                                             std::function<void()> event, double event_at) {
  const size_t n = args.message_bytes;
  const int depth = args.depth;
  std::vector<std::vector<uint8_t>> src(depth, std::vector<uint8_t>(n)),
      dst(depth, std::vector<uint8_t>(n));
  // The channels go before the buffers their posted operations point into.
  std::unique_ptr<nb::BedChannels> holder = std::move(owned);
  nb::BedChannels& ch = *holder;
  for (int s = 0; s < depth; ++s) {
    for (size_t i = 0; i < n; ++i) src[s][i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  }
  auto stamp = [&](int slot, uint64_t index) { std::memcpy(src[slot].data(), &index, 8); };
  std::atomic<bool> stop{false};
  StreamResult result;
  std::vector<absl::Time> done_at;
  std::vector<uint64_t> delivered_index;
  std::thread receiver([&] {
    for (int s = 0; s < depth; ++s) (void)ch.b->Recv({dst[s].data(), n}, s);
    uint64_t expect = 0;
    while (!stop.load()) {
      auto c = ch.cq_b.Wait(absl::Milliseconds(50));
      if (!c.ok()) continue;
      if (!c->status.ok() || c->opcode != pt::Opcode::kRecv) {
        ++result.missing;
        continue;
      }
      const int slot = static_cast<int>(c->wr_id);
      uint64_t index = 0;
      std::memcpy(&index, dst[slot].data(), 8);
      if (index != expect) {
        if (index < expect)
          ++result.duplicates;
        else
          result.missing += index - expect;
      }
      expect = index + 1;
      // After the 8-byte index, every message carries the same pattern (slots complete out of
      // order at the sender, so the slot a message came from is not known here).
      const std::vector<uint8_t>& want = src[0];
      for (size_t i = 8; i < n; i += 4096) {
        const size_t len = std::min<size_t>(4096, n - i);
        if (std::memcmp(dst[slot].data() + i, want.data() + i, len) != 0) {
          for (size_t j = 0; j < len; ++j) result.bad_bytes += dst[slot][i + j] != want[i + j];
        }
      }
      done_at.push_back(absl::Now());
      delivered_index.push_back(index);
      (void)ch.b->Recv({dst[slot].data(), n}, slot);
    }
  });
  uint64_t next = 0;
  for (int s = 0; s < depth; ++s) {
    stamp(s, next);
    PLEXUS_RETURN_IF_ERROR(ch.a->Send({src[s].data(), n}, s));
    ++next;
  }
  std::thread sender([&] {
    while (!stop.load()) {
      auto c = ch.cq_a.Wait(absl::Milliseconds(50));
      if (!c.ok() || !c->status.ok()) continue;
      const int slot = static_cast<int>(c->wr_id);
      stamp(slot, next);
      if (!ch.a->Send({src[slot].data(), n}, slot).ok()) break;
      ++next;
    }
  });
  auto acked = [&] {
    std::vector<uint64_t> v;
    for (const auto& p : ch.a->Stats().paths) v.push_back(p.bytes_acked);
    return v;
  };
  absl::SleepFor(absl::Milliseconds(700));
  const auto a0 = acked();
  const size_t i0 = done_at.size();  // read racily: only for the window's start
  const absl::Time t0 = absl::Now();
  if (event) {
    absl::SleepFor(absl::Seconds(event_at));
    event();
    absl::SleepFor(absl::Seconds(seconds - event_at));
  } else {
    absl::SleepFor(absl::Seconds(seconds));
  }
  const auto a1 = acked();
  const absl::Time t1 = absl::Now();
  stop = true;
  if (std::getenv("PLEXUS_BENCH_VERBOSE") != nullptr) {
    for (const auto& p : ch.a->Stats().paths) {
      std::fprintf(stderr,
                   "  path %d up=%d acked=%llu reposted=%llu inflight=%d cap=%d cong=%llu %s\n",
                   p.index, p.up, static_cast<unsigned long long>(p.bytes_acked),
                   static_cast<unsigned long long>(p.chunks_reposted), p.in_flight, p.cap,
                   static_cast<unsigned long long>(p.congestion_signals), p.error.c_str());
    }
  }
  sender.join();
  receiver.join();
  holder.reset();
  uint64_t total = 0;
  for (size_t i = 0; i < a1.size(); ++i) total += a1[i] - (i < a0.size() ? a0[i] : 0);
  for (size_t i = 0; i < a1.size(); ++i) {
    result.path_share.push_back(
        total == 0 ? 0 : static_cast<double>(a1[i] - (i < a0.size() ? a0[i] : 0)) / total);
  }
  // The longest time in [t0, t1] without a message delivered (the window's ends count).
  uint64_t delivered = 0;
  absl::Time last = t0;
  result.longest_gap = absl::ZeroDuration();
  for (size_t i = i0; i < done_at.size() && done_at[i] <= t1; ++i) {
    if (done_at[i] < t0) continue;
    delivered += n;
    result.longest_gap = std::max(result.longest_gap, done_at[i] - last);
    last = done_at[i];
  }
  result.longest_gap = std::max(result.longest_gap, t1 - last);
  result.messages = done_at.size();
  result.window_start = t0;
  result.window_end = t1;
  result.done_at = std::move(done_at);
  result.mbit = static_cast<double>(delivered) * 8 / absl::ToDoubleSeconds(t1 - t0) / 1e6;
  return result;
}

absl::Status RunThroughput(const Args& args, tooling::FigureWriter& out) {
  for (int k = 2; k <= static_cast<int>(args.rates.size()); ++k) {
    const std::vector<int> rates(args.rates.begin(), args.rates.begin() + k);
    const double sum = std::accumulate(rates.begin(), rates.end(), 0.0);
    PLEXUS_ASSIGN_OR_RETURN(auto bed, nb::Bed::Create(args.netbed, BedName(), rates));
    const std::string rates_text = absl::StrJoin(rates, "/");
    std::vector<double> mp, single, streams, mptcp;
    std::vector<std::vector<double>> shares(k);
    // The systems of one run, launched in a balanced order run after run (a disturbance or a
    // warm cache falls on each alike).
    const size_t fastest = 1 + std::max_element(rates.begin(), rates.end()) - rates.begin();
    std::vector<size_t> all;
    for (int p = 1; p <= k; ++p) all.push_back(p);
    const std::vector<std::function<absl::Status()>> systems = {
        [&]() -> absl::Status {
          PLEXUS_ASSIGN_OR_RETURN(auto ch, nb::BedChannels::Create(*bed, BenchOptions()));
          for (int p = 1; p <= k; ++p) PLEXUS_RETURN_IF_ERROR(ch->Connect(p).status());
          PLEXUS_RETURN_IF_ERROR(ch->WaitLive(k));
          PLEXUS_ASSIGN_OR_RETURN(StreamResult r,
                                  MultipathStream(std::move(ch), args, args.seconds));
          if (r.bad_bytes + r.duplicates + r.missing > 0) {
            return absl::DataLossError(absl::StrCat(
                "multipath stream over ", k, " paths: ", r.bad_bytes, " corrupt bytes, ",
                r.duplicates, " duplicate and ", r.missing, " missing messages"));
          }
          mp.push_back(r.mbit);
          for (int p = 0; p < k; ++p) shares[p].push_back(r.path_share[p]);
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          PLEXUS_ASSIGN_OR_RETURN(double one, TcpStreams(*bed, {fastest}, 0, args.seconds));
          single.push_back(one);
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          PLEXUS_ASSIGN_OR_RETURN(double many, TcpStreams(*bed, all, 0, args.seconds));
          streams.push_back(many);
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          PLEXUS_RETURN_IF_ERROR(bed->Run({"mptcp"}));
          auto m = TcpStreams(*bed, {1}, IPPROTO_MPTCP, args.seconds);
          if (m.ok()) mptcp.push_back(*m);  // a kernel without MPTCP: no line
          return absl::OkStatus();
        }};
    for (int run = 0; run < args.runs; ++run) {
      for (size_t i : plexus::bench::BalancedOrder(args.compare ? systems.size() : 1,
                                                   static_cast<size_t>(run))) {
        PLEXUS_RETURN_IF_ERROR(systems[i]());
      }
    }
    auto add = [&](const std::string& figure, const std::vector<double>& v, bool target) {
      if (v.empty()) return;
      tooling::Figure f;
      f.figure = figure;
      f.value = Median(v) / sum;
      f.unit = "fraction of sum of rates";
      if (target) {
        f.target = ">= 0.95";
        f.met = f.value >= 0.95;
      }
      f.extra = {{"paths", k},
                 {"rates_mbit", rates_text},
                 {"runs", v.size()},
                 {"median_mbit", Median(v)},
                 {"min_mbit", *std::min_element(v.begin(), v.end())},
                 {"max_mbit", *std::max_element(v.begin(), v.end())}};
      out.Add(f);
    };
    add("multipath_aggregate", mp, true);
    add("single_path_tcp", single, false);
    add("k_tcp_streams", streams, false);
    add("mptcp", mptcp, false);
    for (int p = 0; p < k; ++p) {
      tooling::Figure f;
      f.figure = "path_share";
      const double capacity = rates[p] / sum;
      f.value = Median(shares[p]);
      f.unit = "fraction";
      f.target = absl::StrCat("within 0.05 of ", capacity);
      f.met = std::abs(f.value - capacity) <= 0.05;
      f.extra = {{"paths", k},
                 {"path", p + 1},
                 {"rate_mbit", rates[p]},
                 {"capacity_share", capacity},
                 {"runs", shares[p].size()}};
      out.Add(f);
    }
  }
  return absl::OkStatus();
}

// Failover trials of the multipath channel and, with --compare, of kernel MPTCP on the same bed,
// interleaved in a balanced order trial after trial.
absl::Status RunFailover(const Args& args, tooling::FigureWriter& out) {
  const std::vector<int> rates(args.rates.begin(), args.rates.begin() + 3);
  PLEXUS_ASSIGN_OR_RETURN(auto bed, nb::Bed::Create(args.netbed, BedName(), rates));
  for (const std::string event : {"link-down", "blackhole"}) {
    std::vector<double> outages, mbits;
    uint64_t bad = 0, dup = 0, missing = 0;
    MptcpFailoverTrials mptcp;
    auto multipath_trial = [&](int trial) -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(auto ch, nb::BedChannels::Create(*bed, BenchOptions()));
      for (int p = 1; p <= 3; ++p) PLEXUS_RETURN_IF_ERROR(ch->Connect(p).status());
      PLEXUS_RETURN_IF_ERROR(ch->WaitLive(3));
      absl::Status event_status;
      PLEXUS_ASSIGN_OR_RETURN(StreamResult r, MultipathStream(
                                                  std::move(ch), args, 2.0,
                                                  [&] {
                                                    event_status = bed->Run({event, "2"});
                                                  },
                                                  0.8));
      PLEXUS_RETURN_IF_ERROR(event_status);
      PLEXUS_RETURN_IF_ERROR(bed->Run({"restore", "2"}));
      outages.push_back(absl::ToDoubleSeconds(r.longest_gap));
      if (std::getenv("PLEXUS_BENCH_VERBOSE") != nullptr) {
        std::fprintf(stderr, "%s trial %d: outage %.3f s, %.1f Mbit/s\n", event.c_str(), trial,
                     outages.back(), r.mbit);
      }
      mbits.push_back(r.mbit);
      bad += r.bad_bytes;
      dup += r.duplicates;
      missing += r.missing;
      return absl::OkStatus();
    };
    for (int trial = 0; trial < args.runs; ++trial) {
      for (size_t i :
           plexus::bench::BalancedOrder(args.compare ? 2 : 1, static_cast<size_t>(trial))) {
        PLEXUS_RETURN_IF_ERROR(i == 0 ? multipath_trial(trial)
                                      : MptcpFailoverTrial(*bed, event, args, trial, mptcp));
      }
    }
    tooling::Figure f;
    f.figure = absl::StrCat("failover_outage_", event);
    f.value = *std::max_element(outages.begin(), outages.end());
    f.unit = "s";
    f.target = "<= 0.2 in every trial";
    f.met = f.value <= 0.2;
    f.extra = {{"trials", outages.size()},
               {"outages_s", outages},
               {"median_s", Median(outages)},
               {"min_s", *std::min_element(outages.begin(), outages.end())},
               {"rates_mbit", absl::StrJoin(rates, "/")},
               {"path_timeout_ms", 100},
               {"median_mbit", Median(mbits)},
               {"message_bytes", args.message_bytes}};
    out.Add(f);
    tooling::Figure loss;
    loss.figure = absl::StrCat("bytes_lost_or_duplicated_", event);
    loss.value = static_cast<double>(bad + (dup + missing) * args.message_bytes);
    loss.unit = "bytes";
    loss.target = 0;
    loss.met = loss.value == 0;
    loss.extra = {{"trials", outages.size()},
                  {"corrupt_bytes", bad},
                  {"duplicate_messages", dup},
                  {"missing_messages", missing}};
    out.Add(loss);
    if (args.compare) EmitMptcpFailover(args, rates, event, mptcp, out);
  }
  return absl::OkStatus();
}

}  // namespace plexus::mpbench

int main(int argc, char** argv) {
  using namespace plexus::mpbench;  // NOLINT: the sections and Args
  tooling::Tool tool("plexus-bench-multipath",
                     "Multipath channels on a shaped netns bed against single-path TCP, K TCP "
                     "streams and MPTCP (needs root)");
  Args args;
  auto& app = tool.app();
  tooling::AddJsonFlag(&app, &args.json);
  app.add_flag("--compare", args.compare, "also measure single-path TCP, K streams and MPTCP");
  tooling::AddNumber(&app, "--runs", &args.runs, "runs (medians are reported)", 1, 100);
  tooling::AddNumber(&app, "--seconds", &args.seconds, "measured seconds per run", 0.5, 60.0);
  app.add_option("--netbed", args.netbed, "the netbed script");
  std::string what = "all";
  app.add_option("--only", what,
                 "throughput, failover (with --compare: MPTCP's trials too), timeline, allreduce, "
                 "or all (throughput, failover and allreduce)")
      ->check(CLI::IsMember({"throughput", "failover", "timeline", "allreduce", "all"}));
  tooling::AddNumber(&app, "--allreduce-mib", &args.allreduce_mib,
                     "MiB per allreduce of the allreduce line", 1, 4096);
  tooling::AddNumber(&app, "--allreduce-paths", &args.allreduce_paths,
                     "paths of the allreduce line (the first K rates)", 1, 4);
  tooling::AddNumber(&app, "--allreduce-iterations", &args.allreduce_iterations,
                     "timed allreduces per run (after one warm-up)", 1, 100);
  tooling::AddNumber(&app, "--allreduce-cap", &args.allreduce_cap,
                     "chunks in flight per path of the allreduce's channels (0: the default)", 0,
                     64);
  tooling::AddNumber(&app, "--allreduce-path-chunk-kb", &args.allreduce_path_chunk_kb,
                     "the allreduce channels' chunk size in KB (0: the default, 50)", 0, 256);
  tooling::AddNumber(&app, "--allreduce-ack-ahead", &args.allreduce_ack_ahead,
                     "1: the allreduce channels send acks ahead on the lowest-RTT path (the "
                     "default), 0: only on the chunk's path",
                     0, 1);
  tooling::AddNumber(&app, "--allreduce-depth", &args.allreduce_depth,
                     "the allreduce communicators' pipeline_depth (0: the default)", 0, 64);
  tooling::AddNumber(&app, "--allreduce-chunk-kib", &args.allreduce_chunk_kib,
                     "the allreduce communicators' chunk_bytes in KiB (0: the default)", 0, 65536);
  bool timeline = false;
  app.add_flag(
      "--timeline", timeline,
      "only the timeline: throughput per path over time through a failover and a "
      "restore, Plexus and MPTCP (same as --only timeline; plexus-plot failover draws it)");
  tooling::AddNumber(&app, "--interval-ms", &args.interval_ms, "the timeline's sampling interval",
                     10, 1000);
  if (auto code = tool.Parse(argc, argv)) return *code;
  const std::string why = nb::WhyNoBed();
  if (!why.empty()) return tool.Fail(why);
  tooling::FigureWriter out("multipath", args.json);
  if (timeline) what = "timeline";
  if (what == "all" || what == "throughput") {
    if (absl::Status s = RunThroughput(args, out); !s.ok()) return tool.Fail(s);
  }
  if (what == "all" || what == "failover") {
    if (absl::Status s = RunFailover(args, out); !s.ok()) return tool.Fail(s);
  }
  if (what == "timeline") {
    if (absl::Status s = RunTimeline(args, out); !s.ok()) return tool.Fail(s);
  }
  if (what == "all" || what == "allreduce") {
    if (absl::Status s = RunAllReduce(args, out); !s.ok()) return tool.Fail(s);
  }
  if (!args.json) out.PrintTable();
  return tooling::kExitOk;
}
