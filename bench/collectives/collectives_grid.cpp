// plexus-bench-collectives: the grid's command line, jobs, launches and the gathering of their
// points (collectives_grid.hpp).
#include "collectives_grid.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "plexus/collectives/communicator.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/launch.hpp"

namespace plexus::bench {
namespace {

namespace pb = plexus::bench;
namespace pc = plexus::collectives;
namespace pt_tooling = plexus::tooling;
using Clock = std::chrono::steady_clock;

constexpr char kDescription[] =
    "Collectives (float, sum; allreduce by default, --ops for reduce, broadcast, allgather,\n"
    "reduce_scatter, alltoall) between local processes, nccl-tests style. The program starts\n"
    "its ranks itself; every point is checked (#wrong: elements that differ from the exact\n"
    "result, over all ranks).";

constexpr char kFooter[] =
    "size: a rank's whole buffer (allgather: output; reduce_scatter, alltoall: input).\n"
    "time: slowest rank's mean time per call; algbw = size / time; busbw = algbw * factor:\n"
    "allreduce 2(n-1)/n, reduce and broadcast 1, allgather, reduce_scatter, alltoall (n-1)/n.\n"
    "Exit status: 0 when every launch succeeded and #wrong is 0 everywhere, 1 when one failed,\n"
    "2 for usage errors.";

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t at = text.find(',', start);
    std::string item = text.substr(start, at - start);
    if (!item.empty()) items.push_back(item);
    if (at == std::string::npos) return items;
    start = at + 1;
  }
}

// A comma-separated list option whose items must each be one of `allowed`.
void AddListOption(CLI::App& app, const std::string& flag, std::vector<std::string>* list,
                   std::vector<std::string> allowed, const std::string& help,
                   bool* given = nullptr) {
  app.add_option_function<std::string>(
         flag,
         [=](const std::string& text) {
           std::vector<std::string> items = SplitList(text);
           if (items.empty()) {
             throw CLI::ValidationError(fmt::format("{} needs at least one item", flag));
           }
           for (const std::string& item : items) {
             if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
               throw CLI::ValidationError(
                   fmt::format("{}: '{}' is not one of {}", flag, item, fmt::join(allowed, ", ")));
             }
           }
           *list = std::move(items);
           if (given != nullptr) *given = true;
         },
         help)
      ->type_name("LIST");
}

}  // namespace

std::optional<int> ParseGridOptions(int argc, char** argv, GridOptions& o) {
  pt_tooling::Tool tool(kCollectivesProgram, kDescription);
  CLI::App& app = tool.app();
  app.footer(kFooter);
  app.add_option_function<std::string>(
         "-n,--np",
         [&o](const std::string& text) {
           o.nprocs.clear();
           for (const std::string& n : SplitList(text)) {
             auto v = pt_tooling::ParseInteger("--np", n, 1, 64);
             if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
             o.nprocs.push_back(static_cast<int>(*v));
           }
           if (o.nprocs.empty()) {
             throw CLI::ValidationError("--np needs at least one process count");
           }
         },
         "process counts, e.g. 2 or 2,4 (default 2; 2,4 with --compare)")
      ->type_name("LIST");
  AddListOption(app, "--transport", &o.transports, {"tcp", "shm"},
                "tcp, shm or tcp,shm (default tcp)");
  app.add_flag("--compare", o.compare,
               "also run the peers with the same sizes: Gloo (ring, ring_chunked, "
               "halving_doubling; tcp) and Open MPI MPI_Allreduce (btl tcp for tcp, btl vader "
               "for shm); Plexus lines get vs_best_peer");
  bool peers_given = false;
  AddListOption(app, "--peers", &o.peers,
                {"gloo_ring", "gloo_ring_chunked", "gloo_halving_doubling", "gloo", "openmpi",
                 "openmpi_tuned"},
                "the peers of --compare (default all but gloo: Gloo's broadcast, allgather and "
                "alltoall, slow over Gloo's tcp transport); openmpi_tuned: MPI_Allreduce with each "
                "coll/tuned algorithm forced in turn (recursive doubling, ring, segmented ring, "
                "Rabenseifner), so that Open MPI gets a best-of as Gloo does",
                &peers_given);
  std::string ops = "allreduce";
  app.add_option(
         "--ops", ops,
         "operations: allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall (a "
         "comma-separated list) or all; peers: Open MPI all, Gloo allreduce (and with --peers "
         "gloo broadcast, allgather, alltoall)")
      ->capture_default_str();
  app.add_option("--sizes", o.sizes, "bytes: A..B doubles, A..BxF multiplies by F")
      ->capture_default_str();
  pt_tooling::AddNumber(&app, "--iters", &o.iters,
                        "timed calls per size (0: ~256 MiB per size, 5..1000)", 1, 1000000);
  pt_tooling::AddNumber(&app, "--warmup", &o.warmup,
                        "untimed calls first (-1: iters/10, at least 2)", 0, 1000000);
  pt_tooling::AddNumber(&app, "--runs", &o.runs,
                        "launch every configuration R times, report medians; each run launches "
                        "the configurations of a transport and process count together, in a "
                        "balanced order: over N runs (2N for an odd number N of "
                        "configurations) each launches first, and right after each other one, "
                        "equally often",
                        1, 100);
  app.add_option("--algorithm", o.algorithm,
                 "Plexus algorithm: auto, ring, halving_doubling, tree, recursive_doubling")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& name) {
            const absl::StatusOr<pc::Algorithm> algorithm = pc::ParseAlgorithm(name);
            return algorithm.ok() ? std::string() : std::string(algorithm.status().message());
          },
          "ALGORITHM", "algorithm"));
  pt_tooling::AddNumber(&app, "--channels", &o.channels, "Plexus CommunicatorOptions::channels", 0,
                        64);
  app.add_option("--chunk-bytes", o.chunk_bytes, "Plexus CommunicatorOptions::chunk_bytes");
  pt_tooling::AddNumber(&app, "--sockets", &o.sockets,
                        "Plexus CommunicatorOptions::device.tcp.sockets_per_connection", 0, 64);
  app.add_option(
      "--loopback-cc", o.loopback_cc,
      "Plexus DeviceOptions::tcp.loopback_congestion_control: the tcp congestion control "
      "of connections between local processes (default system: the system's, "
      "net.ipv4.tcp_congestion_control, as the peers use; the tcp comparison then also runs "
      "Plexus under its library default, reno, as plexus_reno)");
  app.add_option("--progress", o.progress, "Plexus CommunicatorOptions::device.progress")
      ->check(CLI::IsMember({"caller", "thread"}));
  std::string bind = "none";
  app.add_option("--bind", bind,
                 "none: the scheduler places every process; core: rank r runs on CPU r mod "
                 "#CPUs, for every implementation alike")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "core"}));
  app.add_option("--mpirun-arg", o.mpirun_args,
                 "one more argument for mpirun (repeatable), e.g. --mpirun-arg --mca")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  pt_tooling::AddNumber(&app, "--timeout", &o.timeout_s, "limit for one launch, seconds", 1.0,
                        86400.0);
  app.add_flag("--trace", o.trace,
               "also run Plexus with tracing on (CommunicatorOptions::trace, in memory) as "
               "plexus_traced, interleaved with the untraced runs; its lines get "
               "vs_untraced = time / untraced time");
  pt_tooling::AddJsonFlag(&app, &o.json);
  app.add_flag("--reconfig", o.reconfig,
               "Plexus only: the latency of the allreduce a live reconfiguration (ring order "
               "change requested by rank 0) lands on vs the calls before it, JSON lines per "
               "size and run (--iters: rounds, default 40)");
  app.add_option("--reconfig-change", o.reconfig_change,
                 "with --reconfig: what each round changes: ring_order (reversed, then back), "
                 "transport (tcp <-> shm: every rank connects again) or channels (doubled, "
                 "then back: the new channels connected, then closed)")
      ->check(CLI::IsMember({"ring_order", "transport", "channels"}))
      ->capture_default_str();
  if (auto code = tool.Parse(argc, argv)) return code;
  o.bind_core = bind == "core";
  if (o.nprocs.empty()) o.nprocs = o.compare ? std::vector<int>{2, 4} : std::vector<int>{2};
  if (peers_given && !o.compare) return tool.Usage("--peers only applies with --compare");
  std::string error;
  auto sizes = pb::ParseSizes(o.sizes, sizeof(float), &error);
  if (!sizes) return tool.Usage("--sizes: " + error);
  o.size_list = std::move(*sizes);
  auto parsed_ops = pb::ParseOps(ops, &error);
  if (!parsed_ops) return tool.Usage("--ops: " + error);
  o.ops = std::move(*parsed_ops);
  return std::nullopt;
}

namespace {

// The directory of this program, where the peer programs are built.
std::string SelfDirectory() {
  const std::string self = pt_tooling::SelfPath("");
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? std::string(".") : self.substr(0, slash);
}

}  // namespace

std::string SelfPath() { return pt_tooling::SelfPath(kCollectivesProgram); }

std::vector<std::string> WorkerArgs(const GridOptions& o, const std::string& transport,
                                    const std::vector<pb::Op>& ops) {
  std::string op_list;
  for (pb::Op op : ops) op_list += fmt::format("{}{}", op_list.empty() ? "" : ",", pb::OpName(op));
  std::vector<std::string> args = {"--sizes", o.sizes, "--transport", transport, "--ops", op_list};
  if (o.iters > 0) args.insert(args.end(), {"--iters", std::to_string(o.iters)});
  if (o.warmup >= 0) args.insert(args.end(), {"--warmup", std::to_string(o.warmup)});
  return args;
}

std::vector<Job> PlanJobs(const GridOptions& o) {
  const std::string dir = SelfDirectory();
  const std::string gloo = dir + "/plexus-bench-collectives-gloo";
  const std::string mpi = dir + "/plexus-bench-collectives-mpi";
  auto peer_wanted = [&](const std::string& name) {
    return std::find(o.peers.begin(), o.peers.end(), name) != o.peers.end();
  };
  std::vector<Job> jobs;
  for (int n : o.nprocs) {
    for (const std::string& transport : o.transports) {
      Job plexus{"plexus", transport, n, true, o.ops, {SelfPath(), "--worker"}, n, ""};
      for (const std::string& a : WorkerArgs(o, transport, o.ops)) plexus.argv.push_back(a);
      plexus.argv.insert(plexus.argv.end(), {"--algorithm", o.algorithm});
      if (o.channels > 0)
        plexus.argv.insert(plexus.argv.end(), {"--channels", std::to_string(o.channels)});
      if (!o.chunk_bytes.empty())
        plexus.argv.insert(plexus.argv.end(), {"--chunk-bytes", o.chunk_bytes});
      if (o.sockets > 0)
        plexus.argv.insert(plexus.argv.end(), {"--sockets", std::to_string(o.sockets)});
      if (!o.progress.empty()) {
        plexus.argv.insert(plexus.argv.end(), {"--progress", o.progress});
      }
      if (!o.loopback_cc.empty()) {
        plexus.argv.insert(plexus.argv.end(), {"--loopback-cc", o.loopback_cc});
      }
      jobs.push_back(plexus);
      // Like with like: the "plexus" line runs under the peers' congestion control; Plexus's own
      // default (reno over loopback) is a line of its own, never the one the peers are held to.
      if (o.compare && transport == "tcp" && o.loopback_cc == "system") {
        Job reno = plexus;
        reno.impl = "plexus_reno";
        auto cc = std::find(reno.argv.begin(), reno.argv.end(), std::string("--loopback-cc"));
        if (cc != reno.argv.end() && cc + 1 != reno.argv.end()) *(cc + 1) = "reno";
        jobs.push_back(reno);
      }
      if (o.trace) {
        Job traced = plexus;
        traced.impl = "plexus_traced";
        traced.plexus = false;  // not compared with the peers
        traced.argv.push_back("--trace");
        jobs.push_back(traced);
      }
      if (!o.compare) continue;
      if (transport == "tcp") {
        // One launch per Gloo allreduce algorithm, and one ("gloo") for its other operations.
        const bool allreduce =
            std::find(o.ops.begin(), o.ops.end(), pb::Op::kAllreduce) != o.ops.end();
        std::vector<pb::Op> other_ops;
        for (pb::Op op : o.ops) {
          if (op != pb::Op::kAllreduce && op != pb::Op::kReduceScatter && op != pb::Op::kReduce) {
            other_ops.push_back(op);
          }
        }
        for (const char* algorithm : {"ring", "ring_chunked", "halving_doubling", ""}) {
          const std::string impl =
              *algorithm != 0 ? std::string("gloo_") + algorithm : std::string("gloo");
          const std::vector<pb::Op> ops =
              *algorithm != 0 ? std::vector<pb::Op>{pb::Op::kAllreduce} : other_ops;
          if (!peer_wanted(impl) || (*algorithm != 0 && !allreduce) || ops.empty()) continue;
          Job job{impl, "tcp", n, false, ops, {gloo}, n, ""};
          if (*algorithm != 0) job.argv.insert(job.argv.end(), {"--algorithm", algorithm});
          for (const std::string& a : WorkerArgs(o, "tcp", ops)) job.argv.push_back(a);
          if (std::string(PLEXUS_BENCH_GLOO_MISSING).empty()) {
            if (access(gloo.c_str(), X_OK) != 0) job.unavailable = gloo + " is missing";
          } else {
            job.unavailable = PLEXUS_BENCH_GLOO_MISSING;
          }
          jobs.push_back(job);
        }
      }
      if (peer_wanted("openmpi")) {
        // ob1 so that the btl choice holds (a UCX pml would bypass it); tcp over loopback
        // like the others.
        Job job{"openmpi", transport, n, false, o.ops, {}, 1, "", true};
        job.argv = {PLEXUS_BENCH_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np",
                    std::to_string(n)};
        // Binding as the others: none, or rank r on CPU r (overloading CPUs at 4 processes).
        if (o.bind_core) {
          job.argv.insert(job.argv.end(), {"--bind-to", "core:overload-allowed"});
        } else {
          job.argv.insert(job.argv.end(), {"--bind-to", "none"});
        }
        job.argv.insert(job.argv.end(), {"--mca", "pml", "ob1", "--mca", "btl",
                                         transport == "tcp" ? "tcp,self" : "vader,self"});
        if (transport == "tcp") {
          job.argv.insert(job.argv.end(), {"--mca", "btl_tcp_if_include", "lo"});
        }
        for (const std::string& a : o.mpirun_args) job.argv.push_back(a);
        job.argv.push_back(mpi);
        for (const std::string& a : WorkerArgs(o, transport, o.ops)) job.argv.push_back(a);
        if (std::string(PLEXUS_BENCH_MPI_MISSING).empty()) {
          if (access(mpi.c_str(), X_OK) != 0) job.unavailable = mpi + " is missing";
          if (access(PLEXUS_BENCH_MPIEXEC, X_OK) != 0) {
            job.unavailable = std::string(PLEXUS_BENCH_MPIEXEC) + " is missing";
          }
        } else {
          job.unavailable = PLEXUS_BENCH_MPI_MISSING;
        }
        jobs.push_back(job);
        // Open MPI's allreduce with each algorithm of its tuned component forced: the best of
        // them competes, as the best of Gloo's three does, not only its default decision.
        const bool allreduce =
            std::find(o.ops.begin(), o.ops.end(), pb::Op::kAllreduce) != o.ops.end();
        if (peer_wanted("openmpi_tuned") && allreduce) {
          const std::pair<const char*, const char*> algorithms[] = {{"3", "recursive_doubling"},
                                                                    {"4", "ring"},
                                                                    {"5", "segmented_ring"},
                                                                    {"6", "rabenseifner"}};
          for (const auto& [number, name] : algorithms) {
            Job tuned = job;
            tuned.impl = std::string("openmpi_") + name;
            tuned.ops = {pb::Op::kAllreduce};
            auto program = std::find(tuned.argv.begin(), tuned.argv.end(), mpi);
            program =
                tuned.argv.insert(program, {"--mca", "coll_tuned_use_dynamic_rules", "1", "--mca",
                                            "coll_tuned_allreduce_algorithm", number});
            tuned.argv.erase(program + 7, tuned.argv.end());
            for (const std::string& a : WorkerArgs(o, transport, tuned.ops)) {
              tuned.argv.push_back(a);
            }
            jobs.push_back(tuned);
          }
        }
      }
    }
  }
  return jobs;
}

LaunchResult Launch(const Job& job, double timeout_s, bool bind_core) {
  LaunchResult result;
  pt_tooling::LaunchOptions options;
  options.ranks = job.processes;
  options.argv = job.argv;
  options.plexus_env = !job.under_mpirun;  // mpirun sets the ranks' variables itself
  options.bind_cpus = bind_core && !job.under_mpirun;
  options.output = pt_tooling::OutputMode::kCallback;
  options.timeout = absl::Seconds(timeout_s);
  options.grace = absl::Seconds(3);  // mpirun passes SIGTERM on to its ranks
  options.on_line = [&](pt_tooling::Launcher&, int rank, pt_tooling::Stream stream,
                        std::string_view text) {
    const std::string line(text);
    if (rank == 0 && stream == pt_tooling::Stream::kStdout && !line.empty() && line[0] == '{') {
      auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      auto number = [&](const char* field) {
        return parsed.contains(field) && parsed[field].is_number() &&
               !(parsed[field].is_number_integer() && parsed[field].get<int64_t>() < 0);
      };
      if (!parsed.is_discarded() && parsed.is_object() && number("time_us") && number("bytes") &&
          number("wrong") && number("count") && number("iters")) {
        result.points.push_back(std::move(parsed));
        return;
      }
    }
    std::fprintf(stderr, "[%s] %s\n", job.impl.c_str(), line.c_str());
  };
  absl::StatusOr<pt_tooling::LaunchResult> launched = pt_tooling::Launch(std::move(options));
  if (!launched.ok()) {
    result.error = std::string(launched.status().message());
    return result;
  }
  if (launched->timed_out) {
    result.error = fmt::format("timed out after {} s (raise --timeout)", timeout_s);
  } else if (launched->first_failure >= 0) {
    const pt_tooling::RankResult& failed = launched->ranks[launched->first_failure];
    result.error = job.processes == 1 ? fmt::format("{} {}", job.argv[0], failed.Describe())
                                      : fmt::format("rank {} {}", failed.rank, failed.Describe());
  } else {
    result.ok = true;
  }
  return result;
}

std::vector<size_t> LaunchOrder(const std::vector<Job>& jobs, int run) {
  std::vector<size_t> order;
  size_t begin = 0;
  while (begin < jobs.size()) {
    // One group: the consecutive jobs of one transport and process count (PlanJobs' order).
    size_t end = begin;
    std::vector<size_t> group;
    while (end < jobs.size() && jobs[end].transport == jobs[begin].transport &&
           jobs[end].nprocs == jobs[begin].nprocs) {
      if (jobs[end].unavailable.empty()) group.push_back(end);
      ++end;
    }
    for (size_t k : BalancedOrder(group.size(), static_cast<size_t>(run))) {
      order.push_back(group[k]);
    }
    begin = end;
  }
  return order;
}

bool RunGrid(const GridOptions& o, const std::vector<Job>& jobs, Samples* samples,
             Failures* failures) {
  bool all_ok = true;
  std::map<std::tuple<std::string, std::string, int>, int> dropped;  // failed runs, by job
  // Runs interleave the configurations, so that a slow phase of the machine (other work on its
  // cores) spreads over every implementation instead of hitting one; and the order changes run
  // by run (LaunchOrder), so that no implementation always launches first, or always right
  // after the same other one: what a launch meets (caches, sockets and CPUs that the one
  // before just left) is then the same for everyone.
  for (int run = 0; run < o.runs; ++run) {
    for (const size_t index : LaunchOrder(jobs, run)) {
      const Job& job = jobs[index];
      const auto start = Clock::now();
      std::fprintf(stderr, "# run %d/%d: %s over %s, %d processes ...", run + 1, o.runs,
                   job.impl.c_str(), job.transport.c_str(), job.nprocs);
      std::fflush(stderr);
      LaunchResult r = Launch(job, o.timeout_s, o.bind_core);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const size_t expected = job.ops.size() * o.size_list.size();
      const bool complete = r.ok && r.points.size() == expected;
      if (!complete) {
        // A failed launch counts in no median (its points may be partial or from a broken run):
        // it is dropped, and counted in the failure shown with the results.
        const std::string why =
            r.ok ? fmt::format("reported {} of {} points", r.points.size(), expected) : r.error;
        std::fprintf(stderr, " failed after %.1f s, its points dropped: %s\n", seconds,
                     why.c_str());
        const auto key = std::make_tuple(job.impl, job.transport, job.nprocs);
        const int dropped_here = ++dropped[key];
        (*failures)[key] = fmt::format("{} of {} runs failed and were dropped; last: {}",
                                       dropped_here, o.runs, why);
        all_ok = false;
        continue;
      }
      std::fprintf(stderr, " %.1f s\n", seconds);
      for (const nlohmann::json& j : r.points) {
        const Key key{job.impl, j.value("op", std::string("allreduce")), job.transport, job.nprocs};
        Point& p = (*samples)[key][j.value("bytes", size_t{0})];
        p.times_us.push_back(j.value("time_us", 0.0));
        p.wrong += j.value("wrong", uint64_t{0});
        p.iters = j.value("iters", 0);
        p.count = j.value("count", size_t{0});
      }
    }
  }

  return all_ok;
}

}  // namespace plexus::bench
