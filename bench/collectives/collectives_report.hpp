// plexus-bench-collectives, the driver's output half: the nccl-tests tables (or JSON lines) of
// the points collectives_grid.hpp gathered, each Plexus line against the best peer, and the
// summary of ratios.
#pragma once

#include <string>
#include <vector>

#include "collectives_grid.hpp"

namespace plexus::bench {

// /proc/loadavg's three averages ("unknown" when unreadable).
std::string LoadAverage();

// Prints the header, one section per operation and job (medians over the runs), the summary of
// Plexus / best peer (with --compare) and the load average at the end; JSON lines instead with
// o.json. `cpus`: this machine's CPUs (oversubscription notes). Returns false when a point has
// wrong elements.
bool PrintReport(const GridOptions& o, const std::vector<Job>& jobs, const Samples& samples,
                 const Failures& failures, long cpus, const std::string& load_at_start);

}  // namespace plexus::bench
