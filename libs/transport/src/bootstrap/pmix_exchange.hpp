// The launcher's own key-value exchange (PMIx, served by Open MPI's mpirun and by Slurm's
// srun --mpi=pmix): rank 0 publishes where its store listens, every rank reads it, so that those
// launchers need no PLEXUS_STORE_ADDR.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::transport::bootstrap {

// Whether this build can talk to a PMIx server (PLEXUS_HAVE_PMIX).
bool PmixCompiledIn();

// Collective over every rank of the launcher's job: rank 0's `value` is published under `key`
// (PMIx_Put + PMIx_Commit), every rank fences (collecting data) and reads it (PMIx_Get from rank
// 0); returns rank 0's value on every rank. `expected_rank` is the rank the launcher's variables
// gave, checked against PMIx's own. Every PMIx call is bounded by `timeout` (a server that does
// not answer is left behind on a helper thread). Errors (Unavailable, DeadlineExceeded,
// FailedPrecondition, Unimplemented without PMIx) name `launcher` and what to set instead.
absl::StatusOr<std::string> PmixShareFromRank0(std::string_view launcher, int expected_rank,
                                               std::string_view key, std::string_view value,
                                               absl::Duration timeout);

}  // namespace plexus::transport::bootstrap
