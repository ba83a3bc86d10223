// The launcher's own key-value exchange (PMIx, served by Open MPI's mpirun and by Slurm's
// srun --mpi=pmix): rank 0 publishes where its store listens, every rank reads it, so that those
// launchers need no PLEXUS_STORE_ADDR.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::transport::bootstrap {

// The library the exchange loads at run time (Debian's package libpmix2): libpmix is not linked,
// so programs start without it.
inline constexpr char kPmixLibrary[] = "libpmix.so.2";

// Whether this process can talk to a PMIx server: the build has PMIx (PLEXUS_HAVE_PMIX) and
// kPmixLibrary loads with every function the exchange calls. The first call opens it, once per
// process (nothing loads it at program start); later calls give the same answer. False with the
// reason otherwise: no PMIx in this build, or the library or one of its functions missing (naming
// the library, dlerror's account and the package to install).
bool PmixAvailable(std::string* why_not);

// PmixAvailable's check for the library `soname`, opened afresh (it stays loaded when it passes):
// true, or false with the reason.
bool PmixLibraryLoads(const char* soname, std::string* why_not);

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
