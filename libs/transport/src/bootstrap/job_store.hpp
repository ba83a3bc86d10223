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
// checks it against its own, claims its rank number (an atomic Add on the store) and waits, until
// `timeout`, for every rank of the job to have claimed its own. FailedPrecondition when the world
// sizes differ (nothing of the job already there is touched); when a rank number is claimed
// twice, both claimants fail, and so does every rank of the job waiting or still to come:
// AlreadyExists saying that two jobs share the store address (or a launcher started a rank twice)
// and how to separate them. DeadlineExceeded naming the ranks that did not come.
absl::Status JoinJob(Store& store, const JobIdentity& job, int rank, int world_size,
                     absl::Duration timeout);

// Marks the job of `store` (its namespaced view) as shared with another job, with `why`: every
// rank waiting in JoinJob, and every rank that comes later, fails with it.
absl::Status MarkJobShared(Store& store, const std::string& why);

}  // namespace plexus::transport::bootstrap
