// plexus-bench-qos: two jobs (two communicators of 2 ranks each, ranks as threads of this
// process) run tcp allreduces at the same time over the same links; QoS time windows
// (CommunicatorOptions::qos) give job A priority by letting job B send only in the last
// --b-share of every epoch (MCCS's traffic scheduling: B fills A's gaps). Per run and mode, the
// jobs' times (figures a_s, b_s): job A alone ("solo"), A and B without windows ("shared"), A and
// B with B's windows ("qos", the timetable in qos_b); then the medians (a_solo_s, a_shared_s,
// b_shared_s, a_qos_s, b_qos_s) and their ratios (a_shared_over_solo, a_qos_over_solo,
// b_qos_over_shared). A table, or with --json one JSON line per figure (tooling::FigureWriter).
//
// Links: tcp over loopback by default (the jobs share the loopback path and this host's CPUs);
// with --bed-mbit N (root), a tools/netbed bed whose path 1 is shaped to N Mbit/s: each job's
// rank 0 runs in namespace a and rank 1 in b, both jobs bound to path 1's addresses, so the
// shaped veth is the link they share.
//
//   plexus-bench-qos --bytes 4M --iters 20 --runs 3 --epoch-ms 20 --b-share 0.25 --json
//   plexus-bench-qos --bed-mbit 1000 --bytes 8M --iters 10
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_common.hpp"
#include "netbed.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/qos.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace nb = plexus::netbed;
namespace tooling = plexus::tooling;

namespace {

struct Args {
  std::string bytes_text = "4M";
  size_t bytes = 4 << 20;
  int iters = 20;
  int runs = 3;
  double epoch_ms = 20;
  double b_share = 0.25;
  int channels = 1;
  int chunk_kib = 0;
  int depth = 4;
  int bed_mbit = 0;
  bool json = false;
};

// Runs one job per schedule at once (2 ranks each); returns each job's time for `iters`
// allreduces (the slower rank's, from a common start), or an error.
absl::StatusOr<std::vector<double>> RunJobs(const Args& a, nb::Bed* bed,
                                            const std::vector<pc::QosTimetable>& jobs) {
  const int n = static_cast<int>(jobs.size());
  // One store per job in a fresh directory (reachable from the bed's namespaces, unlike a tcp
  // store on loopback).
  std::vector<std::shared_ptr<pt::Store>> stores;
  std::vector<std::string> dirs;
  for (int j = 0; j < n; ++j) {
    std::string dir = "/tmp/plexus-bench-qos-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    dirs.push_back(dir);
    auto store = pt::FileStore::Open(dir);
    if (!store.ok()) return store.status();
    stores.push_back(*std::move(store));
  }
  std::latch ready(2 * n);
  std::vector<double> seconds(2 * n, 0);
  std::vector<absl::Status> status(2 * n);
  std::vector<std::thread> threads;
  for (int j = 0; j < n; ++j) {
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, j, r] {
        const int slot = 2 * j + r;
        bool counted = false;
        auto body = [&]() -> absl::Status {
          PLEXUS_ASSIGN_OR_RETURN(pt::Rendezvous rdv, pt::Rendezvous::Create(r, 2, stores[j]));
          pc::CommunicatorOptions o;
          o.device.backend = pt::Backend::kTcp;
          o.transport_policy = pc::TransportPolicy::kUniform;
          o.channels = a.channels;
          o.chunk_bytes = static_cast<size_t>(a.chunk_kib) << 10;
          o.pipeline_depth = a.depth;
          o.qos = jobs[j];
          o.timeout = absl::Seconds(120);
          if (bed != nullptr) {
            o.channel_local_addresses = {nb::Bed::Address(r == 0 ? 'a' : 'b', 1)};
          } else {
            o.device.local_address = "127.0.0.1";
          }
          PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pc::Communicator> comm,
                                  pc::Communicator::Create(rdv, o));
          std::vector<float> v(a.bytes / sizeof(float));
          plexus::bench::FillInput(v.data(), v.size(), r);
          PLEXUS_RETURN_IF_ERROR(comm->AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32,
                                                 pc::ReduceOp::kSum));  // warm-up
          counted = true;
          ready.arrive_and_wait();
          const absl::Time start = absl::Now();
          for (int it = 0; it < a.iters; ++it) {
            plexus::bench::FillInput(v.data(), v.size(), r);
            PLEXUS_RETURN_IF_ERROR(comm->AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32,
                                                   pc::ReduceOp::kSum));
          }
          seconds[slot] = absl::ToDoubleSeconds(absl::Now() - start);
          if (plexus::bench::CountWrong(v.data(), v.size(), 2) != 0) {
            return absl::DataLossError("wrong allreduce result");
          }
          return comm->Barrier();
        };
        status[slot] = bed != nullptr ? nb::InNetns(bed->ns(r == 0 ? 'a' : 'b'), body) : body();
        if (!counted) ready.count_down();
      });
    }
  }
  for (auto& t : threads) t.join();
  stores.clear();
  for (const std::string& dir : dirs) std::filesystem::remove_all(dir);
  std::vector<double> out(n);
  for (int j = 0; j < n; ++j) {
    for (int r = 0; r < 2; ++r) {
      if (!status[2 * j + r].ok()) {
        return absl::Status(
            status[2 * j + r].code(),
            absl::StrCat("job ", j, " rank ", r, ": ", std::string(status[2 * j + r].message())));
      }
    }
    out[j] = std::max(seconds[2 * j], seconds[2 * j + 1]);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  tooling::Tool tool("plexus-bench-qos",
                     "Two jobs' allreduces over shared links, with and without QoS windows that "
                     "give job A priority (a table; JSON lines with --json).");
  tool.app().add_option("--bytes", a.bytes_text, "allreduce buffer per call (K/M suffixes)");
  tooling::AddNumber(&tool.app(), "--iters", &a.iters, "allreduces per job and run", 1, 100000);
  tooling::AddNumber(&tool.app(), "--runs", &a.runs, "runs per mode (medians reported)", 1, 100);
  tooling::AddNumber(&tool.app(), "--epoch-ms", &a.epoch_ms, "QoS epoch", 0.1, 10000.0);
  tooling::AddNumber(&tool.app(), "--b-share", &a.b_share,
                     "fraction of each epoch (its end) in which job B may send", 0.01, 1.0);
  tooling::AddNumber(&tool.app(), "--channels", &a.channels, "channels per communicator", 1, 16);
  tooling::AddNumber(
      &tool.app(), "--chunk-kib", &a.chunk_kib,
      "chunk size (0: the backend default, 512 KiB for tcp); what a send admitted at "
      "the end of a window may still carry past it",
      0, 65536);
  tooling::AddNumber(&tool.app(), "--depth", &a.depth, "pipeline depth (chunks in flight)", 1, 64);
  tooling::AddNumber(&tool.app(), "--bed-mbit", &a.bed_mbit,
                     "0: loopback; N: a netbed path shaped to N Mbit/s (root)", 0, 100000);
  tooling::AddJsonFlag(&tool.app(), &a.json);
  if (auto code = tool.Parse(argc, argv)) return *code;
  std::string why_not;
  auto sizes = plexus::bench::ParseSizes(a.bytes_text, sizeof(float), &why_not);
  if (!sizes) return tool.Usage(absl::StrCat("--bytes: ", why_not));
  if (sizes->size() != 1) return tool.Usage("--bytes takes one size, e.g. 4M");
  a.bytes = sizes->front();

  std::unique_ptr<nb::Bed> bed;
  if (a.bed_mbit > 0) {
    const std::string why = nb::WhyNoBed();
    if (!why.empty()) return tool.Fail(why);
    auto made = nb::Bed::Create(PLEXUS_NETBED_SCRIPT, absl::StrCat("pqos", getpid()), {a.bed_mbit});
    if (!made.ok()) return tool.Fail(made.status());
    bed = *std::move(made);
  }
  pc::QosTimetable none;
  pc::QosTimetable gated;
  gated.epoch = absl::Microseconds(static_cast<int64_t>(a.epoch_ms * 1000));
  gated.windows = {{pc::QosWindow::kAllow, gated.epoch - gated.epoch * a.b_share, gated.epoch}};
  if (absl::Status s = gated.Validate(); !s.ok()) return tool.Fail(s);

  const std::string link =
      bed != nullptr ? absl::StrCat("netbed ", a.bed_mbit, " Mbit/s") : "tcp loopback";
  tooling::FigureWriter out("collectives_qos", a.json);
  out.SetCommon({{"link", link},
                 {"bytes", a.bytes},
                 {"iters", a.iters},
                 {"channels", a.channels},
                 {"chunk_kib", a.chunk_kib},
                 {"depth", a.depth},
                 {"qos_b", gated.ToString()}});
  std::vector<double> solo, shared_a, shared_b, qos_a, qos_b;
  // One run's times: job A's, and job B's when it ran (with windows only in mode "qos").
  auto add_run = [&](const std::string& mode, int run, const std::vector<double>& t) {
    nlohmann::json extra = {{"mode", mode}, {"run", run}};
    if (mode != "qos") extra["qos_b"] = "off";
    out.Add({"a_s", t[0], "s", nullptr, std::nullopt, extra});
    if (t.size() > 1) out.Add({"b_s", t[1], "s", nullptr, std::nullopt, extra});
  };
  for (int run = 0; run < a.runs; ++run) {
    auto t = RunJobs(a, bed.get(), {none});
    if (!t.ok()) return tool.Fail(t.status());
    solo.push_back((*t)[0]);
    add_run("solo", run, *t);
    t = RunJobs(a, bed.get(), {none, none});
    if (!t.ok()) return tool.Fail(t.status());
    shared_a.push_back((*t)[0]);
    shared_b.push_back((*t)[1]);
    add_run("shared", run, *t);
    t = RunJobs(a, bed.get(), {none, gated});
    if (!t.ok()) return tool.Fail(t.status());
    qos_a.push_back((*t)[0]);
    qos_b.push_back((*t)[1]);
    add_run("qos", run, *t);
  }
  const nlohmann::json median = {{"statistic", "median"}, {"runs", a.runs}};
  const nlohmann::json ratio = {{"statistic", "ratio of medians"}, {"runs", a.runs}};
  const double s = Median(solo);
  out.Add({"a_solo_s", s, "s", nullptr, std::nullopt, median});
  out.Add({"a_shared_s", Median(shared_a), "s", nullptr, std::nullopt, median});
  out.Add({"b_shared_s", Median(shared_b), "s", nullptr, std::nullopt, median});
  out.Add({"a_qos_s", Median(qos_a), "s", nullptr, std::nullopt, median});
  out.Add({"b_qos_s", Median(qos_b), "s", nullptr, std::nullopt, median});
  out.Add({"a_shared_over_solo", Median(shared_a) / s, "ratio", nullptr, std::nullopt, ratio});
  out.Add({"a_qos_over_solo", Median(qos_a) / s, "ratio", nullptr, std::nullopt, ratio});
  out.Add({"b_qos_over_shared", Median(qos_b) / Median(shared_b), "ratio", nullptr, std::nullopt,
           ratio});
  out.PrintTable();
  return 0;
}
