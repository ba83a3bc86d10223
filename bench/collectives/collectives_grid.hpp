// plexus-bench-collectives, the driver's half that runs the grid: its command line, the jobs
// (one implementation over one transport with one process count: Plexus, Gloo's algorithms, Open
// MPI under mpirun), launching them run after run and gathering rank 0's JSON points.
// collectives_report.hpp prints what it gathered.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"

namespace plexus::bench {

inline constexpr char kCollectivesProgram[] = "plexus-bench-collectives";

// The driver's command line.
struct GridOptions {
  std::vector<int> nprocs;
  std::vector<std::string> transports = {"tcp"};
  bool compare = false;
  // "gloo" (Gloo's broadcast, allgather and alltoall) only when asked: over Gloo 0.x's tcp
  // transport they take milliseconds per message (docs/measurements/collectives.md, "Looking
  // for the 1 MiB gap with counts instead of clocks").
  std::vector<std::string> peers = {"gloo_ring", "gloo_ring_chunked", "gloo_halving_doubling",
                                    "openmpi", "openmpi_tuned"};
  std::vector<Op> ops = {Op::kAllreduce};
  std::string sizes = "8,64K,256K,1M,4M,16M,64M";
  std::vector<size_t> size_list;
  int iters = 0;
  int warmup = -1;
  int runs = 1;
  std::string algorithm = "auto";
  int channels = 0;
  std::string chunk_bytes;
  int sockets = 0;
  std::string progress;
  // --loopback-cc: Plexus's tcp congestion control over loopback. "system" (the default): the
  // system's, as every peer uses; the tcp comparison then also runs Plexus under its library
  // default (reno) as "plexus_reno", reported beside it.
  std::string loopback_cc = "system";
  double timeout_s = 600;
  bool bind_core = false;
  std::vector<std::string> mpirun_args;
  bool json = false;
  bool trace = false;  // also run Plexus with tracing on (impl plexus_traced)
  bool reconfig = false;
  std::string reconfig_change = "ring_order";  // --reconfig-change: ring_order, transport, channels
};

// Parses the driver's command line into `o`; returns the exit code when main() must stop
// (--help, usage errors).
std::optional<int> ParseGridOptions(int argc, char** argv, GridOptions& o);

// One configuration to measure: an implementation over one transport with one process count.
struct Job {
  std::string impl;       // "plexus", "gloo_ring", ..., "openmpi"
  std::string transport;  // "tcp" or "shm"
  int nprocs = 0;
  bool plexus = false;  // a Plexus line (gets vs_best_peer)
  std::vector<Op> ops;  // what it measures (each reports one point per op and size)
  // The program to start and how: `processes` copies with PLEXUS_* variables (plexus, gloo), or
  // one mpirun.
  std::vector<std::string> argv;
  int processes = 1;
  std::string unavailable;    // non-empty: why this peer cannot run here
  bool under_mpirun = false;  // argv starts mpirun, which sets the ranks' variables itself
};

// This program's path (the Plexus worker is this program with --worker).
std::string SelfPath();
// The arguments every worker of a job gets: sizes, transport, operations, iterations.
std::vector<std::string> WorkerArgs(const GridOptions& o, const std::string& transport,
                                    const std::vector<Op>& ops);
// Every configuration the options ask for, peers included (an unavailable peer says why).
std::vector<Job> PlanJobs(const GridOptions& o);

struct LaunchResult {
  bool ok = false;
  std::string error;
  std::vector<nlohmann::json> points;
};

// Starts the job's processes with plexus::tooling::Launcher, reads process 0's stdout (JSON lines
// are results; anything else goes to stderr), and stops everything when one fails or
// `timeout_s` passes.
LaunchResult Launch(const Job& job, double timeout_s, bool bind_core);

// One point's samples over the runs.
struct Point {
  std::vector<double> times_us;
  uint64_t wrong = 0;
  int iters = 0;
  size_t count = 0;
};
// (impl, op, transport, nprocs) -> bytes -> samples.
using Key = std::tuple<std::string, std::string, std::string, int>;
using Samples = std::map<Key, std::map<size_t, Point>>;
// (impl, transport, nprocs) -> why its last launch failed.
using Failures = std::map<std::tuple<std::string, std::string, int>, std::string>;

// The order of run `run`'s launches (indices into `jobs`, unavailable ones left out): the jobs
// of one transport and process count stay together, in BalancedOrder(group size, run), so that
// no implementation always launches first, or always right after the same other one.
std::vector<size_t> LaunchOrder(const std::vector<Job>& jobs, int run);

// Launches every available job o.runs times, interleaved run by run in LaunchOrder, and gathers
// their points (times_us in run order); progress goes to stderr. Returns false when a launch failed
// (the reason is in `failures`).
bool RunGrid(const GridOptions& o, const std::vector<Job>& jobs, Samples* samples,
             Failures* failures);

}  // namespace plexus::bench
