// Who am I, how many are we, and where do we meet: the start of every multi-process program.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

// Environment variables by name; FromEnv(env, ...) reads only this map, never the process's.
using Environment = std::map<std::string, std::string, std::less<>>;
// A copy of the process environment.
Environment ProcessEnvironment();

// The launcher whose variables gave rank and world size.
enum class Launcher : uint8_t {
  kExplicit = 0,  // Rendezvous::Create
  kPlexus = 1,    // plexus-run, or a user: PLEXUS_RANK / PLEXUS_WORLD_SIZE
  kTorchrun = 2,  // RANK / WORLD_SIZE (+ LOCAL_RANK / LOCAL_WORLD_SIZE)
  kOpenMpi = 3,   // mpirun: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (+ _LOCAL_RANK / _SIZE)
  kSlurm = 4,     // srun: SLURM_PROCID / SLURM_NTASKS (+ SLURM_LOCALID, SLURM_TASKS_PER_NODE)
  kNone = 5,      // no launcher variables at all: a job of one
};
std::string_view LauncherName(Launcher launcher);

// How the ranks of a job meet.
enum class StoreKind : uint8_t {
  kTcp = 0,    // store_address: a plexus TcpStore, served by rank 0 when the address is its own
  kFile = 1,   // store_path: a FileStore in a shared directory
  kPmix = 2,   // rank 0 serves a TcpStore on a free port and publishes "host:port" through the
               // launcher's PMIx server (mpirun, srun --mpi=pmix); every rank reads it there
  kTorch = 3,  // store_address: the TCPStore torchrun's agent serves (TorchStore, client only)
  kEtcd = 4,   // store_address: an etcd client endpoint (PLEXUS_STORE=etcd://host:port),
               // EtcdStore under the job's id (a job id is required)
};
std::string_view StoreKindName(StoreKind kind);

// What the environment says, before anything is connected. Launchers are tried in the order
// plexus, torchrun, Open MPI, Slurm (mpirun inside a Slurm allocation is Open MPI); with none of
// their variables the process is rank 0 of a job of one (Launcher::kNone). The store, first
// match wins:
//   1. PLEXUS_STORE_ADDR ("host:port") or PLEXUS_STORE_PATH (a shared directory), any launcher;
//   2. torchrun with TORCHELASTIC_USE_AGENT_STORE=True (its default static rendezvous): the
//      store its agent serves at MASTER_ADDR:MASTER_PORT (StoreKind::kTorch);
//   3. MASTER_ADDR + MASTER_PORT, any launcher (e.g. torchrun --standalone, whose agent leaves
//      the port to rank 0): rank 0 serves a plexus store there;
//   4. a job of one: a private store on a free loopback port;
//   5. Open MPI or Slurm whose environment names a PMIx server (PMIX_NAMESPACE and
//      PMIX_SERVER_URI*), when built with PMIx and libpmix.so.2 loads (here, on first need):
//      StoreKind::kPmix;
//   6. else InvalidArgument saying what to set (and why PMIx cannot be used, when it cannot).
// PLEXUS_STORE_BIND and PLEXUS_STORE_EXTERNAL (LaunchInfo) change how rank 0 serves a tcp store.
// The job id is PLEXUS_JOB_ID for any launcher, else the launcher's: torchrun
// TORCHELASTIC_RUN_ID (not "none"; over the agent's store, "agent-store" stands for "none" and
// the id ends in ".restart-<TORCHELASTIC_RESTART_COUNT>", since the store outlives a restart of
// the workers), Open MPI OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE /
// OMPI_MCA_orte_ess_jobid, Slurm SLURM_JOB_ID.SLURM_STEP_ID; else empty, and rank 0 chooses a
// nonce (see docs/architecture.md, "Bootstrap", for what that can detect).
struct LaunchInfo {
  Launcher launcher = Launcher::kPlexus;
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;        // -1: the launcher does not say; FromEnv derives it from host names
  int local_world_size = -1;  // -1: likewise
  StoreKind store_kind = StoreKind::kTcp;
  std::string store_address;  // kTcp, kTorch, kEtcd: "host:port"; else empty
  // kTcp: rank 0 serves the store on store_address's host (a name is resolved to its address),
  // or on `store_bind` when set (PLEXUS_STORE_BIND: a host or address; "0.0.0.0" or "::" for
  // every interface, which only the user asks for). With `store_external` (PLEXUS_STORE_EXTERNAL=1)
  // something else serves it and rank 0 is a client like the others; without it, a rank 0 that
  // cannot serve the address (not this host's, port taken) fails rather than use a store it did
  // not start, which may be another job's.
  std::string store_bind;
  bool store_external = false;
  std::string store_path;     // kFile: the store's directory; else empty
  std::string job_id;         // e.g. "slurm:77.0"; empty when the environment names no job
  std::string job_id_source;  // the variable(s) it came from, e.g. "SLURM_JOB_ID.SLURM_STEP_ID"
  std::string source;         // the variables used, e.g. "torchrun (RANK=1, WORLD_SIZE=4, ...)"
};
// Pure: no I/O. InvalidArgument with the variable to set or fix when the environment is
// incomplete, inconsistent (rank >= world size) or not numeric.
absl::StatusOr<LaunchInfo> ParseLaunchEnvironment(const Environment& env);

// The ranks of one job and the store they share.
class Rendezvous {
 public:
  // Reads the process environment (see ParseLaunchEnvironment), then opens the store: rank 0
  // serves the TCP store when its address is local to rank 0 (or, under PMIx, on a free port it
  // publishes), every other rank connects (waiting up to `timeout` for rank 0). Then it joins the
  // job: the store a Rendezvous hands out keeps every key under the job id, a server refuses ranks
  // of another job, and a rank whose world size differs from rank 0's or whose rank another process
  // already took fails (FailedPrecondition / AlreadyExists naming both jobs, the store and what to
  // set) without disturbing the job already there. Local rank and size missing from the environment
  // are derived by exchanging host names through the store.
  static absl::StatusOr<Rendezvous> FromEnv(absl::Duration timeout = absl::Minutes(5));
  // The same with an explicit environment instead of the process's.
  static absl::StatusOr<Rendezvous> FromEnv(const Environment& env, absl::Duration timeout);
  static absl::StatusOr<Rendezvous> FromConfig(const LaunchInfo& config, absl::Duration timeout);
  // A rendezvous over an existing store (threads of one process, tests, custom launchers).
  static absl::StatusOr<Rendezvous> Create(int rank, int world_size, std::shared_ptr<Store> store,
                                           int local_rank = -1, int local_world_size = -1);

  Rendezvous(Rendezvous&&) noexcept;
  Rendezvous& operator=(Rendezvous&&) noexcept;
  // On the rank serving the store: waits (at most `linger`, 10 s by default) until every other
  // rank has disconnected, so that no rank loses the store while still reading from it; not at
  // all once a rank reported the job failed (ReportJobFailure, which a communicator that aborts
  // calls), since a rank that stopped or hung would never leave.
  ~Rendezvous();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }
  Launcher launcher() const { return launcher_; }
  // Where the settings came from, for logs: launcher, variables and store.
  const std::string& source() const { return source_; }
  // The job's store: keys are kept apart from other jobs' (prefixed with the job id).
  const std::shared_ptr<Store>& store() const { return store_; }
  // The job id from the launcher, or rank 0's nonce; empty for Create().
  const std::string& job_id() const { return job_id_; }
  // The server this rank runs (rank 0 of a TCP rendezvous), else nullptr.
  const TcpStoreServer* store_server() const { return server_.get(); }
  void set_linger(absl::Duration linger) { linger_ = linger; }

  // Every rank contributes `my_value`; returns all values indexed by rank. Collective: every
  // rank makes the same sequence of AllGather/Barrier calls (keys carry a sequence number, so a
  // prefix may be reused). DeadlineExceeded naming the missing ranks after `timeout`.
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view key_prefix,
                                                     std::string_view my_value,
                                                     absl::Duration timeout);
  // Returns once every rank has entered Barrier(name); DeadlineExceeded with the number of ranks
  // that arrived after `timeout`.
  absl::Status Barrier(std::string_view name, absl::Duration timeout);

 private:
  Rendezvous() = default;
  absl::Status DeriveLocalRanks(absl::Duration timeout);

  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  Launcher launcher_ = Launcher::kExplicit;
  std::string source_;
  std::string job_id_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<TcpStoreServer> server_;  // ~Rendezvous releases store_ first, then this
  uint64_t sequence_ = 0;
  absl::Duration linger_ = absl::Seconds(10);
};

}  // namespace plexus::transport
