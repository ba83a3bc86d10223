// What the small side-by-side collectives benchmarks (plexus-bench-cast, plexus-bench-cuda)
// share: their command line (transports, sizes, processes, runs, timeout, --json), the worker's
// copy of it, and the driver loop that starts the same binary as --worker ranks per transport and
// collects rank 0's figure lines.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace plexus::bench {

struct DriverOptions {
  std::string transports = "shm,tcp";  // comma-separated backends, one launch each
  std::string sizes;                   // comma-separated sizes in bytes (K/M/G suffixes)
  int np = 2;
  int runs = 5;
  double timeout_s = 900;  // per transport
  bool json = false;
};

// Adds --transport, --sizes, --np (min_np..64), --runs, --timeout and --json to `tool`, with the
// values in `options` as defaults.
void AddDriverFlags(tooling::Tool& tool, DriverOptions* options, int min_np);

// For each of options.transports: options.np ranks of this binary with `--worker --transport T
// --sizes S --runs R`, their figures into `writer` (tooling::RunWorkers). Prints progress on stderr
// unless options.json. Stops at the first transport whose ranks fail, naming it.
absl::Status RunWorkersPerTransport(const DriverOptions& options, const std::string& program,
                                    tooling::FigureWriter& writer);

// The worker's side: --transport, --sizes and --runs from its argv (as RunWorkersPerTransport
// passes them; argv[0] is "--worker").
DriverOptions ParseWorkerArgs(int argc, char** argv);

}  // namespace plexus::bench
