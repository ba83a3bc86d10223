// plexus-bench-collectives --reconfig: what a live reconfiguration adds to the collective it
// lands on (reconfig_bench.cpp; docs/collectives.md, "Live reconfiguration").
#pragma once

#include "bench_common.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"

namespace plexus::bench {

// One rank of the measurement over `comm`. Per size and per round (options.iters rounds, 40 by
// default): a barrier, 10 allreduces timed as the baseline, then rank 0 requests a new ring order
// (alternately reversed and identity) and every rank goes on calling allreduce until its active
// configuration reports the new epoch; the last call is the one the change landed on. Rank 0
// prints one JSON line per size: baseline_us and landing_us (medians, slowest rank), added_us,
// landing_p90_us, baseline_p90_us, affected_us (the slowest call from the request to the
// landing one inclusive: a call issued while the round froze this rank may precede the landing
// call), request_to_landing_us (rank 0, from the request to the landing
// call's return), calls_before_landing (mean), plus the fields MeasureAllreduce prints (time_us =
// landing_us; wrong: mismatches of every landing call's result).
void MeasureReconfiguration(plexus::collectives::Communicator& comm, const WorkerOptions& options);

}  // namespace plexus::bench
