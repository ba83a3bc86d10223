#include "bootstrap/job_store.hpp"

#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/status.hpp"

namespace plexus::transport::bootstrap {
namespace {

std::string Describe(const JobIdentity& job) {
  return absl::StrCat("job '", job.id, "' (", job.source, ")");
}

// What to do when two jobs meet in one store.
std::string Remedy(const JobIdentity& job) {
  return job.is_nonce
             ? "The launcher gave no job id, so a rank of another job that shares this store "
               "address cannot be told apart: give each job its own store port "
               "(PLEXUS_STORE_ADDR or MASTER_PORT), and set PLEXUS_JOB_ID to a value unique to "
               "the job on all of its ranks"
             : "Give each job its own store port (PLEXUS_STORE_ADDR or MASTER_PORT), and check "
               "that every rank of the job sees the same job id and world size";
}

}  // namespace

std::string NewJobNonce() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("nonce-%016x", v);
}

std::shared_ptr<Store> NamespaceStore(std::shared_ptr<Store> inner, const std::string& job_id) {
  std::string label = absl::StrCat("job '", job_id, "'");
  return PrefixStore(std::move(inner), absl::StrCat("plexus/job/", job_id, "/"), std::move(label));
}

absl::Status JoinJob(Store& store, const JobIdentity& job, int rank, int world_size,
                     absl::Duration timeout) {
  const std::string world_key = "rendezvous/world-size";
  if (rank == 0) {
    PLEXUS_RETURN_IF_ERROR(store.Set(world_key, std::to_string(world_size)));
  } else {
    auto published = store.Get(world_key, timeout);
    if (!published.ok()) {
      return absl::Status(published.status().code(),
                          absl::StrCat("rank ", rank, " of ", Describe(job),
                                       " waited for rank 0 to publish the job's world size: ",
                                       published.status().message()));
    }
    int rank0_world = 0;
    if (!absl::SimpleAtoi(*published, &rank0_world) || rank0_world != world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " of ", Describe(job), " has world size ", world_size, ", but rank 0 of ",
          "the job served by the ", store.description(), " has world size ", *published,
          ": two jobs share this store, or the launcher gave the ranks different sizes. ",
          Remedy(job)));
    }
  }
  PLEXUS_ASSIGN_OR_RETURN(auto joins,
                          store.Add(absl::StrCat("rendezvous/rank/", rank, "/joins"), 1));
  if (joins != 1) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", rank, " of ", Describe(job), " already joined the ", store.description(),
        " (this is join ", joins, "): two processes were given rank ", rank,
        " of the same job, or two jobs share this store. ", Remedy(job)));
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::bootstrap
