// Job identity in the bootstrap store: every key a Rendezvous (and whatever uses its store) sets
// lives under "plexus/job/<job id>/", and joining a job checks its world size and that no other
// process already took this rank, so that two jobs given one store address never pair silently.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport::bootstrap {

// A random job identity for a job whose launcher gives none ("nonce-" + 16 hex digits).
std::string NewJobNonce();

// The key under which rank 0 publishes its nonce in a store that does not carry one itself (a
// file store, or a tcp store served by something other than rank 0).
inline constexpr std::string_view kJobNonceKey = "plexus/rendezvous/job-nonce";

// A view of `inner` in which every key is prefixed with "plexus/job/<job_id>/".
std::shared_ptr<Store> NamespaceStore(std::shared_ptr<Store> inner, const std::string& job_id);

// How this rank names its job in messages, e.g. "job 'slurm:77.0' (SLURM_JOB_ID.SLURM_STEP_ID)".
struct JobIdentity {
  std::string id;
  bool is_nonce = false;  // chosen by rank 0 because the launcher gave none
  std::string source;     // the variable(s) it came from, or how the nonce was found
};

// Joins the job through its namespaced `store`: rank 0 publishes the world size; every rank
// checks it against its own and claims its rank number. FailedPrecondition when the world sizes
// differ, AlreadyExists when another process already claimed this rank; both say that two jobs
// (or a misconfigured launcher) share the store and what to set. Nothing of the rightful job's
// is overwritten on failure.
absl::Status JoinJob(Store& store, const JobIdentity& job, int rank, int world_size,
                     absl::Duration timeout);

}  // namespace plexus::transport::bootstrap
