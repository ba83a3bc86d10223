#include "bootstrap/job_store.hpp"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plexus/base/status.hpp"

namespace plexus::transport::bootstrap {
namespace {

std::string Describe(const JobIdentity& job) {
  return absl::StrCat("job '", job.id, "' (", job.source, ")");
}

// What to do when two jobs meet in one store.
std::string Remedy(const JobIdentity& job) {
  return job.is_nonce
             ? "The ranks have no job id, so a rank of another job that shares this store "
               "address cannot be told apart: give each job its own store port "
               "(PLEXUS_STORE_ADDR or MASTER_PORT), and set PLEXUS_JOB_ID to a value unique to "
               "the job on all of its ranks, or start the job with a launcher (plexus-run, "
               "torchrun, mpirun, srun), which gives it one"
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

namespace {

constexpr std::string_view kWorldKey = "rendezvous/world-size";
// Set once every rank has claimed its number, or when the job is marked shared: what the ranks
// that claimed theirs wait for.
constexpr std::string_view kSettledKey = "rendezvous/settled";
constexpr std::string_view kClaimedKey = "rendezvous/claimed";
// Why the job cannot go on: another job's process came in.
constexpr std::string_view kSharedKey = "rendezvous/shared";

std::string ClaimKey(int rank) { return absl::StrCat("rendezvous/rank/", rank, "/joins"); }

// The error of a rank of a job marked shared.
absl::Status SharedError(Store& store, const JobIdentity& job, int rank) {
  auto why = store.Get(kSharedKey, absl::ZeroDuration());
  return absl::AlreadyExistsError(absl::StrCat(
      "rank ", rank, " of ", Describe(job), " cannot run: ",
      why.ok() ? *why : std::string("another process marked the job as shared with another job")));
}

}  // namespace

absl::Status MarkJobShared(Store& store, const std::string& why) {
  PLEXUS_RETURN_IF_ERROR(store.Set(kSharedKey, why));
  return store.Set(kSettledKey, "shared");
}

absl::Status JoinJob(Store& store, const JobIdentity& job, int rank, int world_size,
                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto left = [&] { return std::max(deadline - absl::Now(), absl::ZeroDuration()); };
  if (rank == 0) {
    PLEXUS_RETURN_IF_ERROR(store.Set(kWorldKey, std::to_string(world_size)));
  } else {
    auto published = store.Get(kWorldKey, left());
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
  // The claim is one atomic Add in the store: of two processes claiming one rank, exactly one
  // sees 1. The other marks the job shared, which wakes the first (waiting below) and fails it.
  PLEXUS_ASSIGN_OR_RETURN(auto joins, store.Add(ClaimKey(rank), 1));
  if (joins != 1) {
    const std::string why =
        absl::StrCat("rank ", rank, " was claimed by two processes in the ", store.description(),
                     ": two jobs share this store address, or a launcher started rank ", rank,
                     " twice (this is claim ", joins, "). ", Remedy(job));
    (void)MarkJobShared(store, why);
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, " of ", Describe(job), " already joined: ", why));
  }
  PLEXUS_ASSIGN_OR_RETURN(auto claimed, store.Add(kClaimedKey, 1));
  if (claimed == world_size) PLEXUS_RETURN_IF_ERROR(store.Set(kSettledKey, "complete"));
  auto settled = store.Get(kSettledKey, left());
  if (!settled.ok()) {
    if (!absl::IsDeadlineExceeded(settled.status())) return settled.status();
    std::vector<std::string> missing;
    for (int r = 0; r < world_size && missing.size() < 16; ++r) {
      auto present = store.Check({ClaimKey(r)});
      if (present.ok() && !*present) missing.push_back(std::to_string(r));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", rank, " of ", Describe(job), " waited ",
                     absl::FormatDuration(timeout), " for the other ranks to join in the ",
                     store.description(), "; missing rank", missing.size() == 1 ? " " : "s ",
                     absl::StrJoin(missing, ", "), missing.size() == 16 ? ", ..." : "", " of ",
                     world_size, " (not started, crashed, or pointed at another store address?)"));
  }
  // Settled: complete, or marked shared meanwhile (or before this rank came).
  PLEXUS_ASSIGN_OR_RETURN(auto shared, store.Check({std::string(kSharedKey)}));
  if (shared) return SharedError(store, job, rank);
  PLEXUS_ASSIGN_OR_RETURN(auto mine, store.Add(ClaimKey(rank), 0));
  if (mine != 1) return SharedError(store, job, rank);
  return absl::OkStatus();
}

}  // namespace plexus::transport::bootstrap
