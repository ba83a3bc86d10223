// plexus-bench-collectives: allreduce, broadcast, allgather, reduce-scatter and alltoall (f32,
// sum) of plexus::collectives between local processes, in the nccl-tests output format,
// optionally side by side with Gloo and Open MPI measured in the same invocation.
//
//   plexus-bench-collectives [--np 2[,4]] [--transport tcp[,shm]] [--compare] [--sizes 8,1K..64M]
//       [--ops allreduce|LIST|all] [--iters N] [--warmup N] [--runs R] [--json]
//       [--algorithm auto|ring|hd|tree] ...
//
// The program launches its own ranks: it starts N copies of itself (with the PLEXUS_* variables
// of plexus-run), the Gloo peer program N times the same way, and the Open MPI peer program
// under mpirun. Rank 0 of each launch reports one JSON line per size; this process gathers
// them, takes the median over --runs launches and prints the table (or JSON lines).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/types.hpp"
#include "reconfig_bench.hpp"

namespace {

namespace pb = plexus::bench;
namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace pt_tooling = plexus::tooling;
using Clock = std::chrono::steady_clock;

constexpr char kProgram[] = "plexus-bench-collectives";

constexpr char kDescription[] =
    "Collectives (float, sum; allreduce by default, --ops for broadcast, allgather,\n"
    "reduce_scatter, alltoall) between local processes, nccl-tests style. The program starts\n"
    "its ranks itself; every point is checked (#wrong: elements that differ from the exact\n"
    "result, over all ranks).";

constexpr char kFooter[] =
    "size: a rank's whole buffer (allgather: output; reduce_scatter, alltoall: input).\n"
    "time: slowest rank's mean time per call; algbw = size / time; busbw = algbw * factor:\n"
    "allreduce 2(n-1)/n, broadcast 1, allgather, reduce_scatter, alltoall (n-1)/n.\n"
    "Exit status: 0 when every launch succeeded and #wrong is 0 everywhere, 1 when one failed,\n"
    "2 for usage errors.";

// ---- Plexus worker (one rank) -------------------------------------------------------------

[[noreturn]] void WorkerDie(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s worker: %s: %s\n", kProgram, what.c_str(),
               std::string(status.ToString()).c_str());
  std::exit(1);
}

class PlexusCollectives : public pb::CollectiveUnderTest {
 public:
  PlexusCollectives(std::unique_ptr<pc::Communicator> comm, pc::Algorithm algorithm)
      : comm_(std::move(comm)) {
    call_.algorithm = algorithm;
  }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }
  bool Supports(pb::Op) const override { return true; }

  void Prepare(pb::OpBuffers& buffers) override { buffers_ = &buffers; }
  void Run() override {
    float* send = buffers_->send();
    float* recv = buffers_->recv();
    const size_t count = buffers_->shape().count;
    constexpr pc::DataType kF32 = pc::DataType::kF32;
    absl::Status s;
    switch (buffers_->op()) {
      case pb::Op::kAllreduce:
        s = comm_->AllReduce(send, recv, count, kF32, pc::ReduceOp::kSum, call_);
        break;
      case pb::Op::kBroadcast:  // in place, as MPI_Bcast
        s = comm_->Broadcast(recv, recv, count, kF32, /*root=*/0, call_);
        break;
      case pb::Op::kAllgather:
        s = comm_->AllGather(send, recv, count, kF32, call_);
        break;
      case pb::Op::kReduceScatter:
        s = comm_->ReduceScatter(send, recv, count, kF32, pc::ReduceOp::kSum, call_);
        break;
      case pb::Op::kAlltoall:
        s = comm_->AllToAll(send, recv, count, kF32, call_);
        break;
    }
    if (!s.ok()) WorkerDie(fmt::format("{} of {} floats", pb::OpName(buffers_->op()), count), s);
  }
  void Barrier() override {
    const absl::Status s = comm_->Barrier();
    if (!s.ok()) WorkerDie("Barrier", s);
  }
  double Max(double value) override { return Reduce(value, pc::ReduceOp::kMax); }
  double Sum(double value) override { return Reduce(value, pc::ReduceOp::kSum); }

 private:
  double Reduce(double value, pc::ReduceOp op) {
    double result = 0;
    const absl::Status s = comm_->AllReduce(&value, &result, 1, pc::DataType::kF64, op);
    if (!s.ok()) WorkerDie("AllReduce of the figures", s);
    return result;
  }

  std::unique_ptr<pc::Communicator> comm_;
  pc::CallOptions call_;
  pb::OpBuffers* buffers_ = nullptr;
};

// The rendezvous must outlive the communicator (rank 0's serves the store it uses).
pt::Rendezvous WorkerRendezvous() {
  auto rendezvous = pt::Rendezvous::FromEnv(absl::Minutes(2));
  if (!rendezvous.ok()) WorkerDie("rendezvous", rendezvous.status());
  return *std::move(rendezvous);
}

std::unique_ptr<pc::Communicator> MakeWorkerCommunicator(const pb::WorkerOptions& options,
                                                         pt::Rendezvous& rendezvous) {
  auto backend = pt::ParseBackend(options.transport);
  if (!backend.ok()) WorkerDie("--transport", backend.status());
  pc::CommunicatorOptions comm_options;
  comm_options.device.backend = *backend;
  comm_options.transport_policy = pc::TransportPolicy::kUniform;  // measure the backend named
  if (*backend == pt::Backend::kTcp) comm_options.device.local_address = "127.0.0.1";
  comm_options.channels = options.channels;
  comm_options.chunk_bytes = options.chunk_bytes;
  if (options.sockets > 0) comm_options.device.sockets_per_connection = options.sockets;
  if (options.progress == "thread") comm_options.device.progress = pt::ProgressMode::kThread;
  if (options.progress == "caller") comm_options.device.progress = pt::ProgressMode::kCaller;
  comm_options.trace.enabled = options.trace;
  auto comm = pc::Communicator::Create(rendezvous, comm_options);
  if (!comm.ok()) WorkerDie("Communicator::Create", comm.status());
  return *std::move(comm);
}

int WorkerMain(int argc, char** argv) {
  const pb::WorkerOptions options = pb::ParseWorkerOptions(argc, argv, kProgram);
  auto algorithm =
      pc::ParseAlgorithm(options.algorithm.empty() ? std::string("auto") : options.algorithm);
  if (!algorithm.ok()) WorkerDie("--algorithm", algorithm.status());
  pt::Rendezvous rendezvous = WorkerRendezvous();
  PlexusCollectives impl(MakeWorkerCommunicator(options, rendezvous), *algorithm);
  pb::MeasureOps(impl, options, [](pb::Op) { return std::string("plexus"); });
  return 0;
}

// --reconfig: what a live reconfiguration adds to the allreduce it lands on.
int ReconfigWorkerMain(int argc, char** argv) {
  const pb::WorkerOptions options = pb::ParseWorkerOptions(argc, argv, kProgram);
  pt::Rendezvous rendezvous = WorkerRendezvous();
  pb::MeasureReconfiguration(*MakeWorkerCommunicator(options, rendezvous), options);
  return 0;
}

// ---- Driver options -----------------------------------------------------------------------

struct Options {
  std::vector<int> nprocs;
  std::vector<std::string> transports = {"tcp"};
  bool compare = false;
  // "gloo" (Gloo's broadcast, allgather and alltoall) only when asked: over Gloo 0.x's tcp
  // transport they ran at 1-15 MB/s on this project's VM (milliseconds per message).
  std::vector<std::string> peers = {"gloo_ring", "gloo_ring_chunked", "gloo_halving_doubling",
                                    "openmpi"};
  std::vector<pb::Op> ops = {pb::Op::kAllreduce};
  std::string sizes = "8,1K..64M";
  std::vector<size_t> size_list;
  int iters = 0;
  int warmup = -1;
  int runs = 1;
  std::string algorithm = "auto";
  int channels = 0;
  std::string chunk_bytes;
  int sockets = 0;
  std::string progress;
  double timeout_s = 600;
  bool bind_core = false;
  std::vector<std::string> mpirun_args;
  bool json = false;
  bool trace = false;  // also run Plexus with tracing on (impl plexus_traced)
  bool reconfig = false;
};

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

// Parses the driver's command line into `o`; returns the exit code when main() must stop.
std::optional<int> ParseOptions(int argc, char** argv, Options& o) {
  pt_tooling::Tool tool(kProgram, kDescription);
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
                {"gloo_ring", "gloo_ring_chunked", "gloo_halving_doubling", "gloo", "openmpi"},
                "the peers of --compare (default all but gloo: Gloo's broadcast, allgather and "
                "alltoall, slow over Gloo's tcp transport)",
                &peers_given);
  std::string ops = "allreduce";
  app.add_option(
         "--ops", ops,
         "operations: allreduce, broadcast, allgather, reduce_scatter, alltoall (a "
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
                        "launch every configuration R times, report medians", 1, 100);
  app.add_option("--algorithm", o.algorithm, "Plexus algorithm: auto, ring, halving_doubling, tree")
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
                        "Plexus CommunicatorOptions::device.sockets_per_connection", 0, 64);
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

// ---- Launching ----------------------------------------------------------------------------

// One configuration to measure: an implementation over one transport with one process count.
struct Job {
  std::string impl;       // "plexus", "gloo_ring", ..., "openmpi"
  std::string transport;  // "tcp" or "shm"
  int nprocs = 0;
  bool plexus = false;      // a Plexus line (gets vs_best_peer)
  std::vector<pb::Op> ops;  // what it measures (each reports one point per op and size)
  // The program to start and how: `processes` copies with PLEXUS_* variables (plexus, gloo), or
  // one mpirun.
  std::vector<std::string> argv;
  int processes = 1;
  std::string unavailable;    // non-empty: why this peer cannot run here
  bool under_mpirun = false;  // argv starts mpirun, which sets the ranks' variables itself
};

std::string SelfDirectory() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  std::string self(path, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

std::string SelfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return kProgram;
  return std::string(path, static_cast<size_t>(n));
}

std::vector<std::string> WorkerArgs(const Options& o, const std::string& transport,
                                    const std::vector<pb::Op>& ops) {
  std::string op_list;
  for (pb::Op op : ops) op_list += fmt::format("{}{}", op_list.empty() ? "" : ",", pb::OpName(op));
  std::vector<std::string> args = {"--sizes", o.sizes, "--transport", transport, "--ops", op_list};
  if (o.iters > 0) args.insert(args.end(), {"--iters", std::to_string(o.iters)});
  if (o.warmup >= 0) args.insert(args.end(), {"--warmup", std::to_string(o.warmup)});
  return args;
}

std::vector<Job> PlanJobs(const Options& o) {
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
      jobs.push_back(plexus);
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
          if (op != pb::Op::kAllreduce && op != pb::Op::kReduceScatter) other_ops.push_back(op);
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
      }
    }
  }
  return jobs;
}

struct LaunchResult {
  bool ok = false;
  std::string error;
  std::vector<nlohmann::json> points;
};

// Starts the job's processes with plexus::tooling::Launcher, reads process 0's stdout (JSON lines
// are results; anything else goes to stderr), and stops everything when one fails or
// `timeout_s` passes.
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

// ---- Aggregation and output ---------------------------------------------------------------

struct Point {
  std::vector<double> times_us;
  uint64_t wrong = 0;
  int iters = 0;
  size_t count = 0;
};
// (impl, op, transport, nprocs) -> bytes -> samples.
using Key = std::tuple<std::string, std::string, std::string, int>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
  int iters = 0;
  int samples = 0;
};

Row MakeRow(pb::Op op, size_t bytes, const Point& p, int nprocs) {
  Row r;
  r.bytes = bytes;
  r.count = p.count;
  r.time_us = Median(p.times_us);
  r.algbw = r.time_us > 0 ? static_cast<double>(bytes) / (r.time_us * 1e-6) / 1e9 : 0;
  r.busbw = r.algbw * pb::BusFactor(op, nprocs);
  r.wrong = p.wrong;
  r.iters = p.iters;
  r.samples = static_cast<int>(p.times_us.size());
  return r;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? fmt::format("{} {} {}", a, b, c) : std::string("unknown");
}
// --reconfig: one launch per transport, process count and run; every point as a JSON line.
int RunReconfig(const Options& o) {
  bool all_ok = true;
  for (int run = 0; run < o.runs; ++run) {
    for (const std::string& transport : o.transports) {
      for (int n : o.nprocs) {
        Job job{
            "plexus", transport, n, true, {pb::Op::kAllreduce}, {SelfPath(), "--reconfig-worker"},
            n,        ""};
        const std::vector<std::string> args = WorkerArgs(o, transport, job.ops);
        job.argv.insert(job.argv.end(), args.begin(), args.end());
        if (o.channels > 0) {
          job.argv.insert(job.argv.end(), {"--channels", std::to_string(o.channels)});
        }
        LaunchResult r = Launch(job, o.timeout_s, o.bind_core);
        if (!r.ok || r.points.size() != o.size_list.size()) {
          std::fprintf(stderr, "# reconfig run %d over %s, %d processes failed: %s\n", run + 1,
                       transport.c_str(), n, r.ok ? "missing sizes" : r.error.c_str());
          all_ok = false;
        }
        for (nlohmann::json& j : r.points) {
          j["run"] = run;
          all_ok = all_ok && j.value("wrong", uint64_t{1}) == 0;
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return all_ok ? 0 : 1;
}

bool Measures(const Job& job, pb::Op op) {
  return std::find(job.ops.begin(), job.ops.end(), op) != job.ops.end();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return WorkerMain(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "--reconfig-worker") {
    return ReconfigWorkerMain(argc - 1, argv + 1);
  }
  Options options;
  if (auto code = ParseOptions(argc, argv, options)) return *code;
  const Options& o = options;
  signal(SIGPIPE, SIG_IGN);
  if (o.reconfig) return RunReconfig(o);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int max_np = *std::max_element(o.nprocs.begin(), o.nprocs.end());
  const std::string load_at_start = LoadAverage();

  std::vector<Job> jobs = PlanJobs(o);
  std::map<Key, std::map<size_t, Point>> samples;
  // (impl, transport, nprocs) -> why its last launch failed.
  std::map<std::tuple<std::string, std::string, int>, std::string> failures;
  bool all_ok = true;
  for (const Job& job : jobs) {
    if (!job.unavailable.empty()) {
      std::fprintf(stderr, "# peer unavailable: %s (%s, %d processes): %s\n", job.impl.c_str(),
                   job.transport.c_str(), job.nprocs, job.unavailable.c_str());
    }
  }
  // Runs interleave the configurations, so that a slow phase of the machine (other work on its
  // cores) spreads over every implementation instead of hitting one.
  for (int run = 0; run < o.runs; ++run) {
    for (const Job& job : jobs) {
      if (!job.unavailable.empty()) continue;
      const auto start = Clock::now();
      std::fprintf(stderr, "# run %d/%d: %s over %s, %d processes ...", run + 1, o.runs,
                   job.impl.c_str(), job.transport.c_str(), job.nprocs);
      std::fflush(stderr);
      LaunchResult r = Launch(job, o.timeout_s, o.bind_core);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const size_t expected = job.ops.size() * o.size_list.size();
      if (!r.ok || r.points.size() != expected) {
        const std::string why =
            r.ok ? fmt::format("reported {} of {} points", r.points.size(), expected) : r.error;
        std::fprintf(stderr, " failed after %.1f s: %s\n", seconds, why.c_str());
        failures[{job.impl, job.transport, job.nprocs}] = why;
        all_ok = false;
      } else {
        std::fprintf(stderr, " %.1f s\n", seconds);
      }
      for (const nlohmann::json& j : r.points) {
        const Key key{job.impl, j.value("op", std::string("allreduce")), job.transport, job.nprocs};
        Point& p = samples[key][j.value("bytes", size_t{0})];
        p.times_us.push_back(j.value("time_us", 0.0));
        p.wrong += j.value("wrong", uint64_t{0});
        p.iters = j.value("iters", 0);
        p.count = j.value("count", size_t{0});
      }
    }
  }

  // The best peer for a Plexus line: the highest busbw among peers of the same operation,
  // transport and process count at the same size (for shm that is Open MPI over vader only).
  auto best_peer = [&](pb::Op op, const std::string& transport, int nprocs,
                       size_t bytes) -> std::optional<std::pair<std::string, Row>> {
    std::optional<std::pair<std::string, Row>> best;
    for (const auto& [key, points] : samples) {
      const auto& [impl, op_name, t, n] = key;
      if (impl.rfind("plexus", 0) == 0 || op_name != pb::OpName(op) || t != transport ||
          n != nprocs)
        continue;
      const auto it = points.find(bytes);
      if (it == points.end()) continue;
      const Row row = MakeRow(op, bytes, it->second, nprocs);
      if (!best || row.busbw > best->second.busbw) best = {{impl, row}};
    }
    return best;
  };

  const bool oversubscribed = max_np > cpus;
  if (!o.json) {
    std::string op_names;
    for (pb::Op op : o.ops)
      op_names += fmt::format("{}{}", op_names.empty() ? "" : ", ", pb::OpName(op));
    std::printf(
        "# plexus-bench-collectives: %s; float, sum, out of place (Gloo allreduce and "
        "every broadcast: in place)\n",
        op_names.c_str());
    std::printf("# %ld CPUs, load average at start %s; %s of %d launch(es) per configuration\n",
                cpus, load_at_start.c_str(), o.runs > 1 ? "medians" : "figures", o.runs);
    std::printf("# binding: %s\n", o.bind_core ? "rank r on CPU r mod #CPUs (--bind core)"
                                               : "none, the scheduler places processes");
    if (oversubscribed) {
      std::printf("# NOTE: %d processes oversubscribe the %ld CPUs of this machine\n", max_np,
                  cpus);
    }
  }
  for (pb::Op op : o.ops) {
    const std::string op_name(pb::OpName(op));
    if (!o.json) std::printf("#\n# ==== %s ====\n", op_name.c_str());
    for (const Job& job : jobs) {
      if (!Measures(job, op)) continue;
      const Key key{job.impl, op_name, job.transport, job.nprocs};
      const auto it = samples.find(key);
      if (!o.json) {
        std::printf("#\n# %s %s over %s, %d processes%s\n", job.impl.c_str(), op_name.c_str(),
                    job.transport.c_str(), job.nprocs,
                    job.nprocs > cpus ? " (oversubscribed)" : "");
        if (!job.unavailable.empty()) {
          std::printf("# peer unavailable: %s\n", job.unavailable.c_str());
          continue;
        }
        if (job.under_mpirun) {
          std::string command;
          for (const std::string& a : job.argv) command += (command.empty() ? "" : " ") + a;
          std::printf("# %s\n", command.c_str());
        }
        const auto failed = failures.find({job.impl, job.transport, job.nprocs});
        if (failed != failures.end()) std::printf("# FAILED: %s\n", failed->second.c_str());
        if (it == samples.end()) continue;
        std::printf("# %10s %12s %8s %6s %11s %12s %12s %7s%s\n", "size", "count", "type", "redop",
                    "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong",
                    job.plexus && o.compare ? "  vs_best_peer" : "");
      }
      if (it == samples.end()) continue;
      const char* redop = op == pb::Op::kAllreduce || op == pb::Op::kReduceScatter ? "sum" : "none";
      for (const auto& [bytes, point] : it->second) {
        const Row row = MakeRow(op, bytes, point, job.nprocs);
        if (row.wrong != 0) all_ok = false;
        std::optional<std::pair<std::string, Row>> best;
        if (job.plexus && o.compare) best = best_peer(op, job.transport, job.nprocs, bytes);
        // NaN when there is no peer figure to compare with.
        const double ratio =
            best && best->second.busbw > 0 ? row.busbw / best->second.busbw : std::nan("");
        if (o.json) {
          nlohmann::json j;
          j["impl"] = job.impl;
          j["transport"] = job.transport;
          j["nprocs"] = job.nprocs;
          j["op"] = op_name;
          j["bytes"] = row.bytes;
          j["count"] = row.count;
          j["dtype"] = "float";
          j["redop"] = redop;
          j["time_us"] = row.time_us;
          // The spread over runs, to tell a real gap from a noisy machine.
          j["time_us_min"] = *std::min_element(point.times_us.begin(), point.times_us.end());
          j["time_us_max"] = *std::max_element(point.times_us.begin(), point.times_us.end());
          j["algbw"] = row.algbw;
          j["busbw"] = row.busbw;
          j["wrong"] = row.wrong;
          j["iters"] = row.iters;
          j["runs"] = row.samples;
          j["oversubscribed"] = job.nprocs > cpus;
          j["bind"] = o.bind_core ? "core" : "none";
          if (job.impl == "plexus_traced") {
            // Tracing's cost: this line's median time over the untraced line's (same runs).
            j["algorithm"] = o.algorithm;
            j["trace"] = true;
            std::optional<double> vs_untraced;
            if (const auto u = samples.find(Key{"plexus", op_name, job.transport, job.nprocs});
                u != samples.end()) {
              if (const auto at = u->second.find(bytes); at != u->second.end()) {
                vs_untraced = row.time_us / MakeRow(op, bytes, at->second, job.nprocs).time_us;
              }
            }
            j["vs_untraced"] = vs_untraced ? nlohmann::json(*vs_untraced) : nlohmann::json(nullptr);
          }
          if (job.plexus) {
            j["algorithm"] = o.algorithm;
            j["vs_best_peer"] = std::isnan(ratio) ? nlohmann::json(nullptr) : nlohmann::json(ratio);
            j["best_peer"] = best ? nlohmann::json(best->first) : nlohmann::json(nullptr);
          }
          // A plexus::tooling figure line (bench, figure, value, unit) with the fields above.
          const pt_tooling::Figure figure{op_name + " busbw", row.busbw, "GB/s", nullptr,
                                          std::nullopt,       j};
          std::printf("%s\n", pt_tooling::FigureJson("collectives", figure).dump().c_str());
        } else {
          std::string vs;
          if (job.plexus && o.compare) {
            vs = std::isnan(ratio) ? "  n/a" : fmt::format("  {:6.2f}x {}", ratio, best->first);
          }
          std::printf("  %10zu %12zu %8s %6s %11.2f %12.3f %12.3f %7llu%s\n", row.bytes, row.count,
                      "float", redop, row.time_us, row.algbw, row.busbw,
                      static_cast<unsigned long long>(row.wrong), vs.c_str());
        }
      }
    }
  }
  if (!o.json && o.compare) {
    // One line per operation, transport and process count: the ratio column of the tables.
    std::printf(
        "#\n# summary: plexus busbw / best peer's busbw (>= 1.00: Plexus is at least as "
        "fast)\n");
    for (pb::Op op : o.ops) {
      for (const auto& [key, points] : samples) {
        const auto& [impl, op_name, transport, nprocs] = key;
        if (impl != "plexus" || op_name != pb::OpName(op)) continue;
        std::string line = fmt::format("#   {} {} {} processes:", op_name, transport, nprocs);
        for (const auto& [bytes, point] : points) {
          const Row row = MakeRow(op, bytes, point, nprocs);
          const auto best = best_peer(op, transport, nprocs, bytes);
          line += best && best->second.busbw > 0
                      ? fmt::format("  {} {:.2f}x", pb::FormatBytes(bytes),
                                    row.busbw / best->second.busbw)
                      : fmt::format("  {} n/a", pb::FormatBytes(bytes));
        }
        std::printf("%s\n", line.c_str());
      }
    }
  }
  if (!o.json) {
    std::printf("#\n# load average at end %s\n", LoadAverage().c_str());
  }
  std::fflush(stdout);
  return all_ok ? 0 : 1;
}
