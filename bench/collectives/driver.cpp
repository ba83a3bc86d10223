#include "driver.hpp"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "plexus/tooling/launch.hpp"

namespace plexus::bench {

void AddDriverFlags(tooling::Tool& tool, DriverOptions* o, int min_np) {
  tool.app()
      .add_option("--transport", o->transports, "comma-separated: shm, tcp, inproc")
      ->capture_default_str();
  tool.app()
      .add_option("--sizes", o->sizes, "comma-separated sizes in bytes (K/M/G suffixes)")
      ->capture_default_str();
  tooling::AddNumber(&tool.app(), "--np", &o->np, "processes", min_np, 64);
  tooling::AddNumber(&tool.app(), "--runs", &o->runs, "runs per point (the median is reported)", 1,
                     100);
  tooling::AddNumber(&tool.app(), "--timeout", &o->timeout_s, "seconds per transport", 1.0,
                     86400.0);
  tooling::AddJsonFlag(&tool.app(), &o->json);
}

absl::Status RunWorkersPerTransport(const DriverOptions& o, const std::string& program,
                                    tooling::FigureWriter& writer) {
  const std::vector<std::string> transports = absl::StrSplit(o.transports, ',', absl::SkipEmpty());
  for (const std::string& transport : transports) {
    if (!o.json) {
      std::fprintf(stderr, "%s: %s, %d processes...\n", program.c_str(), transport.c_str(), o.np);
    }
    tooling::LaunchOptions launch;
    launch.ranks = o.np;
    launch.argv = {tooling::SelfPath(program),
                   "--worker",
                   "--transport",
                   transport,
                   "--sizes",
                   o.sizes,
                   "--runs",
                   std::to_string(o.runs)};
    launch.timeout = absl::Seconds(o.timeout_s);
    if (absl::Status s = tooling::RunWorkers(std::move(launch), writer, transport); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

DriverOptions ParseWorkerArgs(int argc, char** argv) {
  DriverOptions o;
  o.transports = "shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--transport") o.transports = argv[i + 1];
    if (flag == "--sizes") o.sizes = argv[i + 1];
    if (flag == "--runs") o.runs = std::atoi(argv[i + 1]);
  }
  return o;
}

}  // namespace plexus::bench
