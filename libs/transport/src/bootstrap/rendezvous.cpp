#include "plexus/transport/rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bootstrap/job_store.hpp"
#include "bootstrap/pmix_exchange.hpp"
#include "bootstrap/rank0_store.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/join.hpp"

extern char** environ;

namespace plexus::transport {

namespace net = base::net;
namespace {

// The variables of one launcher.
struct LauncherVars {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: computed (Slurm)
};

constexpr LauncherVars kLaunchers[] = {
    {Launcher::kPlexus, "PLEXUS_RANK", "PLEXUS_WORLD_SIZE", "PLEXUS_LOCAL_RANK",
     "PLEXUS_LOCAL_WORLD_SIZE"},
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

std::optional<std::string> Lookup(const Environment& env, std::string_view name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int> ParseCount(const std::string& name, const std::string& value) {
  int v = 0;
  if (value.find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(value, &v) ||
      v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not a non-negative integer"));
  }
  return v;
}

// Slurm's SLURM_TASKS_PER_NODE, e.g. "2(x3),1": tasks on node `node_id`, or -1 when unknown.
int SlurmTasksOnNode(const std::string& tasks_per_node, int node_id) {
  int node = 0;
  for (absl::string_view part : absl::StrSplit(tasks_per_node, ',')) {
    int tasks = 0;
    int repeat = 1;
    const size_t paren = part.find("(x");
    if (paren != absl::string_view::npos) {
      if (part.back() != ')' ||
          !absl::SimpleAtoi(part.substr(paren + 2, part.size() - paren - 3), &repeat)) {
        return -1;
      }
      part = part.substr(0, paren);
    }
    if (!absl::SimpleAtoi(part, &tasks) || tasks <= 0 || repeat <= 0) return -1;
    if (node_id < node + repeat) return tasks;
    node += repeat;
  }
  return -1;
}

// Job ids are prefixed with the launcher, so that e.g. a Slurm job and an Open MPI job with the
// same number are still different jobs. Empty when the environment names none.
absl::Status FindJobId(const Environment& env, Launcher launcher, LaunchInfo* config) {
  auto take = [&](std::string id, std::string source) {
    config->job_id = std::move(id);
    config->job_id_source = std::move(source);
  };
  if (auto id = Lookup(env, "PLEXUS_JOB_ID")) {
    take(*id, "PLEXUS_JOB_ID");
  } else if (launcher == Launcher::kTorchrun && config->store_kind == StoreKind::kTorch) {
    // The agent's store is this job's alone (the agent holds its port) but outlives a restart
    // of the workers, whose keys must not meet the previous attempt's.
    auto id = Lookup(env, "TORCHELASTIC_RUN_ID");
    const auto restart = Lookup(env, "TORCHELASTIC_RESTART_COUNT");
    take(absl::StrCat("torchrun:", id && *id != "none" ? *id : "agent-store", ".restart-",
                      restart ? *restart : "0"),
         "TORCHELASTIC_RUN_ID.TORCHELASTIC_RESTART_COUNT");
  } else if (launcher == Launcher::kTorchrun) {
    // torchrun's default --rdzv-id is "none", shared by every job: not an identity.
    if (auto id = Lookup(env, "TORCHELASTIC_RUN_ID"); id && *id != "none") {
      take(absl::StrCat("torchrun:", *id), "TORCHELASTIC_RUN_ID");
    }
  } else if (launcher == Launcher::kOpenMpi) {
    for (const char* name :
         {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"}) {
      if (auto id = Lookup(env, name)) {
        take(absl::StrCat("ompi:", *id), name);
        break;
      }
    }
  } else if (launcher == Launcher::kSlurm) {
    auto job = Lookup(env, "SLURM_JOB_ID");
    if (!job) job = Lookup(env, "SLURM_JOBID");
    if (job) {
      auto step = Lookup(env, "SLURM_STEP_ID");
      if (!step) step = Lookup(env, "SLURM_STEPID");
      take(step ? absl::StrCat("slurm:", *job, ".", *step) : absl::StrCat("slurm:", *job),
           step ? "SLURM_JOB_ID.SLURM_STEP_ID" : "SLURM_JOB_ID");
    }
  }
  if (config->job_id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(config->job_id_source, " gives a job id of ",
                                                   config->job_id.size(), " bytes; the limit is ",
                                                   kMaxJobIdBytes));
  }
  return absl::OkStatus();
}

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

// torchrun's default (static) rendezvous runs a TCPStore in its agent at MASTER_ADDR:MASTER_PORT
// and says so to its workers; with --standalone or another rendezvous backend the port is left
// for the workers' rank 0.
bool UsesAgentStore(const Environment& env) {
  const auto v = Lookup(env, "TORCHELASTIC_USE_AGENT_STORE");
  return v && (*v == "True" || *v == "true" || *v == "1");
}

// The variable that names the launcher's PMIx server ("" when there is none): PMIx clients find
// their server through PMIX_SERVER_URI* in their environment, within PMIX_NAMESPACE.
std::string PmixServerVariable(const Environment& env) {
  if (!Lookup(env, "PMIX_NAMESPACE")) return "";
  for (const char* name : {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3",
                           "PMIX_SERVER_URI21", "PMIX_SERVER_URI2", "PMIX_SERVER_URI"}) {
    if (Lookup(env, name)) return name;
  }
  return "";
}

// PLEXUS_STORE_BIND and PLEXUS_STORE_EXTERNAL, for a tcp store at config->store_address.
absl::Status FindStoreServing(const Environment& env, LaunchInfo* config) {
  if (auto external = Lookup(env, "PLEXUS_STORE_EXTERNAL")) {
    PLEXUS_ASSIGN_OR_RETURN(config->store_external,
                            base::ParseBool(*external, "PLEXUS_STORE_EXTERNAL"));
  }
  if (auto bind = Lookup(env, "PLEXUS_STORE_BIND")) {
    std::string host = *bind;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (host.find_first_of(" /") != std::string::npos ||
        (host.find(':') != std::string::npos && !net::IsIpLiteral(host))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PLEXUS_STORE_BIND='", *bind,
          "' is not a host or address (the port is PLEXUS_STORE_ADDR's): e.g. 10.0.0.1, node1, "
          "or 0.0.0.0 / :: for every interface"));
    }
    if (config->store_external) {
      return absl::InvalidArgumentError(
          "PLEXUS_STORE_BIND and PLEXUS_STORE_EXTERNAL are both set: with an external store rank "
          "0 serves nothing; unset one");
    }
    config->store_bind = host;
  }
  return absl::OkStatus();
}

// PLEXUS_STORE=etcd://host:port: the job meets in an existing etcd (EtcdStore). False when
// unset; an error for another scheme, or beside PLEXUS_STORE_ADDR / PLEXUS_STORE_PATH.
absl::StatusOr<bool> FindStoreUrl(const Environment& env, LaunchInfo* config,
                                  std::string* store_source) {
  const auto url = Lookup(env, "PLEXUS_STORE");
  if (!url) return false;
  if (Lookup(env, "PLEXUS_STORE_ADDR") || Lookup(env, "PLEXUS_STORE_PATH")) {
    return absl::InvalidArgumentError(
        "PLEXUS_STORE is set together with PLEXUS_STORE_ADDR or PLEXUS_STORE_PATH: set one");
  }
  constexpr absl::string_view kEtcd = "etcd://";
  if (!absl::StartsWith(*url, kEtcd)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PLEXUS_STORE='", *url,
        "' is not a store this build knows: etcd://host:port (an etcd client endpoint); for "
        "Plexus's own stores set PLEXUS_STORE_ADDR or PLEXUS_STORE_PATH"));
  }
  std::string address = url->substr(kEtcd.size());
  if (!address.empty() && address.back() == '/') address.pop_back();
  if (auto hp = net::ParseHostPort(address, "PLEXUS_STORE's etcd address"); !hp.ok()) {
    return hp.status();
  }
  config->store_kind = StoreKind::kEtcd;
  config->store_address = address;
  *store_source = absl::StrCat("PLEXUS_STORE=", *url);
  return true;
}

// An etcd store is shared by every job that uses it: a job must say which it is.
absl::Status RequireJobIdForEtcd(const LaunchInfo& config) {
  if (config.store_kind != StoreKind::kEtcd || !config.job_id.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "PLEXUS_STORE=etcd://... needs a job id, so that jobs sharing the etcd never meet: set "
      "PLEXUS_JOB_ID (or run under a launcher that gives one: plexus-run, torchrun, mpirun, srun)");
}

// No launcher variables at all: rank 0 of a job of one, over a private store unless the user
// names one (PLEXUS_STORE_ADDR / PLEXUS_STORE_PATH).
absl::StatusOr<LaunchInfo> SingleProcess(const Environment& env) {
  LaunchInfo config;
  config.launcher = Launcher::kNone;
  config.local_rank = 0;
  config.local_world_size = 1;
  std::string store_source = "private store";
  const auto addr = Lookup(env, "PLEXUS_STORE_ADDR");
  const auto path = Lookup(env, "PLEXUS_STORE_PATH");
  if (addr && path) {
    return absl::InvalidArgumentError(
        "both PLEXUS_STORE_ADDR and PLEXUS_STORE_PATH are set: unset one (ADDR selects a tcp "
        "store served by rank 0, PATH a file store in a shared directory)");
  }
  PLEXUS_ASSIGN_OR_RETURN(const bool etcd, FindStoreUrl(env, &config, &store_source));
  if (etcd) {
    // config is set
  } else if (path) {
    config.store_kind = StoreKind::kFile;
    config.store_path = *path;
    store_source = absl::StrCat("PLEXUS_STORE_PATH=", *path);
  } else {
    config.store_address = addr ? *addr : "127.0.0.1:0";
    if (addr) store_source = absl::StrCat("PLEXUS_STORE_ADDR=", *addr);
    auto hp = net::ParseHostPort(config.store_address, "the store address");
    if (!hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(store_source, ": ", std::string(hp.status().message())));
    }
  }
  PLEXUS_RETURN_IF_ERROR(FindJobId(env, Launcher::kNone, &config));
  PLEXUS_RETURN_IF_ERROR(RequireJobIdForEtcd(config));
  if (config.store_kind == StoreKind::kTcp && addr) {
    PLEXUS_RETURN_IF_ERROR(FindStoreServing(env, &config));
  }
  config.source = absl::StrCat(
      "no launcher (none of PLEXUS_RANK, RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID is set): a job "
      "of one, store ",
      store_source, ", ",
      config.job_id.empty()
          ? std::string("no job id (rank 0 chooses a nonce)")
          : absl::StrCat("job '", config.job_id, "' from ", config.job_id_source));
  return config;
}

}  // namespace

Environment ProcessEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

std::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kExplicit:
      return "explicit";
    case Launcher::kPlexus:
      return "plexus";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kOpenMpi:
      return "Open MPI";
    case Launcher::kSlurm:
      return "Slurm";
    case Launcher::kNone:
      return "none";
  }
  return "unknown";
}

std::string_view StoreKindName(StoreKind kind) {
  switch (kind) {
    case StoreKind::kTcp:
      return "tcp";
    case StoreKind::kFile:
      return "file";
    case StoreKind::kPmix:
      return "pmix";
    case StoreKind::kTorch:
      return "torch";
    case StoreKind::kEtcd:
      return "etcd";
  }
  return "unknown";
}

absl::StatusOr<LaunchInfo> ParseLaunchEnvironment(const Environment& env) {
  const LauncherVars* vars = nullptr;
  for (const LauncherVars& l : kLaunchers) {
    if (Lookup(env, l.rank) || Lookup(env, l.size)) {
      vars = &l;
      break;
    }
  }
  if (vars == nullptr) return SingleProcess(env);
  LaunchInfo config;
  config.launcher = vars->launcher;
  const std::string launcher(LauncherName(vars->launcher));
  const auto rank_text = Lookup(env, vars->rank);
  const auto size_text = Lookup(env, vars->size);
  if (!rank_text || !size_text) {
    const char* set = rank_text ? vars->rank : vars->size;
    const char* unset = rank_text ? vars->size : vars->rank;
    return absl::InvalidArgumentError(absl::StrCat(
        set, " is set but ", unset, " is not: ", launcher, " sets both; set ", unset, " too"));
  }
  PLEXUS_ASSIGN_OR_RETURN(auto rank, ParseCount(vars->rank, *rank_text));
  PLEXUS_ASSIGN_OR_RETURN(auto size, ParseCount(vars->size, *size_text));
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(vars->size, "=", size, " must be at least 1"));
  }
  if (rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(vars->rank, "=", rank, " is not below ",
                                                   vars->size, "=", size,
                                                   ": ranks count from 0 to world size - 1"));
  }
  config.rank = rank;
  config.world_size = size;
  std::vector<std::string> used = {absl::StrCat(vars->rank, "=", rank),
                                   absl::StrCat(vars->size, "=", size)};

  // Local rank and size: both given, or (Slurm) computed, else derived later from host names.
  const auto local_rank_text = Lookup(env, vars->local_rank);
  std::optional<std::string> local_size_text;
  std::string local_size_name;
  if (vars->local_size != nullptr) {
    local_size_text = Lookup(env, vars->local_size);
    local_size_name = vars->local_size;
  } else if (auto per_node = Lookup(env, "SLURM_TASKS_PER_NODE")) {
    int node_id = 0;
    if (auto node = Lookup(env, "SLURM_NODEID"); node && absl::SimpleAtoi(*node, &node_id)) {
      const int tasks = SlurmTasksOnNode(*per_node, node_id);
      if (tasks > 0) local_size_text = std::to_string(tasks);
      local_size_name = absl::StrCat("SLURM_TASKS_PER_NODE[SLURM_NODEID=", node_id, "]");
    }
  }
  if (local_rank_text && local_size_text) {
    PLEXUS_ASSIGN_OR_RETURN(auto local_rank, ParseCount(vars->local_rank, *local_rank_text));
    PLEXUS_ASSIGN_OR_RETURN(auto local_size, ParseCount(local_size_name, *local_size_text));
    if (local_size < 1 || local_size > size || local_rank >= local_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("inconsistent local ranks: ", vars->local_rank, "=", local_rank, ", ",
                       local_size_name, "=", local_size, ", ", vars->size, "=", size,
                       " (need local rank < local size <= world size)"));
    }
    config.local_rank = local_rank;
    config.local_world_size = local_size;
    used.push_back(absl::StrCat(vars->local_rank, "=", local_rank));
    used.push_back(absl::StrCat(local_size_name, "=", local_size));
  }

  // The store: PLEXUS_STORE_ADDR or PLEXUS_STORE_PATH for every launcher, else torchrun's
  // MASTER_ADDR/MASTER_PORT (which users also export for mpirun and srun).
  const auto addr = Lookup(env, "PLEXUS_STORE_ADDR");
  const auto path = Lookup(env, "PLEXUS_STORE_PATH");
  const auto master_addr = Lookup(env, "MASTER_ADDR");
  const auto master_port = Lookup(env, "MASTER_PORT");
  std::string store_source;
  if (addr && path) {
    return absl::InvalidArgumentError(
        "both PLEXUS_STORE_ADDR and PLEXUS_STORE_PATH are set: unset one (ADDR selects a tcp "
        "store served by rank 0, PATH a file store in a shared directory)");
  }
  const std::string pmix_server = PmixServerVariable(env);
  std::string no_pmix;  // why the launcher's PMIx server cannot be used, when it cannot
  PLEXUS_ASSIGN_OR_RETURN(const bool etcd, FindStoreUrl(env, &config, &store_source));
  if (etcd) {
    // config is set
  } else if (addr) {
    config.store_address = *addr;
    store_source = absl::StrCat("PLEXUS_STORE_ADDR=", *addr);
  } else if (path) {
    config.store_kind = StoreKind::kFile;
    config.store_path = *path;
    store_source = absl::StrCat("PLEXUS_STORE_PATH=", *path);
  } else if (master_addr && master_port) {
    PLEXUS_ASSIGN_OR_RETURN(auto port, ParseCount("MASTER_PORT", *master_port));
    if (port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("MASTER_PORT='", *master_port, "' is not a port (0..65535)"));
    }
    config.store_address = net::JoinHostPort(*master_addr, static_cast<uint16_t>(port));
    store_source = absl::StrCat("MASTER_ADDR:MASTER_PORT=", config.store_address);
    if (vars->launcher == Launcher::kTorchrun && UsesAgentStore(env)) {
      config.store_kind = StoreKind::kTorch;
      store_source =
          absl::StrCat("torchrun's agent store at MASTER_ADDR:MASTER_PORT=", config.store_address,
                       " (TORCHELASTIC_USE_AGENT_STORE)");
    }
  } else if (master_addr || master_port) {
    return absl::InvalidArgumentError(
        absl::StrCat(master_addr ? "MASTER_ADDR" : "MASTER_PORT", " is set but ",
                     master_addr ? "MASTER_PORT" : "MASTER_ADDR",
                     " is not: set both, or set "
                     "PLEXUS_STORE_ADDR=<host of rank 0>:<free port>"));
  } else if (config.world_size == 1) {
    config.store_address = "127.0.0.1:0";  // a job of one: a private store on a free port
    store_source = "private store (world size 1)";
  } else if ((vars->launcher == Launcher::kOpenMpi || vars->launcher == Launcher::kSlurm) &&
             !pmix_server.empty() && bootstrap::PmixAvailable(&no_pmix)) {
    config.store_kind = StoreKind::kPmix;
    store_source = absl::StrCat("served by rank 0, address through ", launcher, "'s PMIx server (",
                                pmix_server, ")");
  } else {
    std::string how;
    if (vars->launcher == Launcher::kOpenMpi) {
      how = pmix_server.empty() ? " (this mpirun exports no PMIx server; e.g. mpirun -x "
                                  "PLEXUS_STORE_ADDR=node1:29500 ...)"
                                : absl::StrCat(" (mpirun serves PMIx, but ", no_pmix,
                                               "; or mpirun -x PLEXUS_STORE_ADDR=node1:29500 ...)");
    } else if (vars->launcher == Launcher::kSlurm) {
      how = absl::StrCat(
          pmix_server.empty() ? " (run srun --mpi=pmix so that srun serves PMIx"
                              : absl::StrCat(" (srun serves PMIx, but ", no_pmix),
          ", or export PLEXUS_STORE_ADDR=$(scontrol show hostnames | head -n1):29500 before "
          "srun)");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        launcher,
        " gave rank and world size but no rendezvous address: set "
        "PLEXUS_STORE_ADDR=<host of rank 0>:<free port>",
        how,
        ", or MASTER_ADDR and MASTER_PORT, or PLEXUS_STORE_PATH=<directory shared by all ranks>"));
  }
  if (!config.store_address.empty()) {
    auto hp = net::ParseHostPort(config.store_address, "the store address");
    if (!hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(store_source, ": ", std::string(hp.status().message())));
    }
    if (hp->port == 0 && config.world_size > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(store_source,
                       " has port 0, which only works for a job of one rank: choose a free "
                       "port that every rank can reach"));
    }
  }
  if (config.store_kind == StoreKind::kTcp && !config.store_address.empty()) {
    PLEXUS_RETURN_IF_ERROR(FindStoreServing(env, &config));
  }
  PLEXUS_RETURN_IF_ERROR(FindJobId(env, vars->launcher, &config));
  PLEXUS_RETURN_IF_ERROR(RequireJobIdForEtcd(config));
  config.source =
      absl::StrCat(launcher, " (", absl::StrJoin(used, ", "), "), store ", store_source, ", ",
                   config.job_id.empty()
                       ? std::string("no job id (rank 0 chooses a nonce)")
                       : absl::StrCat("job '", config.job_id, "' from ", config.job_id_source));
  return config;
}

absl::StatusOr<Rendezvous> Rendezvous::FromEnv(absl::Duration timeout) {
  return FromEnv(ProcessEnvironment(), timeout);
}

absl::StatusOr<Rendezvous> Rendezvous::FromEnv(const Environment& env, absl::Duration timeout) {
  PLEXUS_ASSIGN_OR_RETURN(auto config, ParseLaunchEnvironment(env));
  return FromConfig(config, timeout);
}

namespace {

// StoreKind::kPmix: rank 0 serves a store on a free port of every interface and publishes its
// host name, port and interface addresses through the launcher's PMIx server; another rank on
// rank 0's host connects through loopback, one elsewhere to the first address that accepts.
// Returns the address this rank connects to.
absl::StatusOr<std::string> PmixStoreAddress(const LaunchInfo& config,
                                             const bootstrap::JobIdentity& job,
                                             std::unique_ptr<TcpStoreServer>* server,
                                             absl::Duration timeout) {
  const std::string launcher(LauncherName(config.launcher));
  constexpr std::string_view kKey = "plexus.store";
  std::string mine;
  if (config.rank == 0) {
    TcpStoreServer::Options options;
    options.job_id = job.id;
    options.job_id_is_nonce = job.is_nonce;
    auto started = TcpStoreServer::Start(":0", options);
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("rank 0 cannot serve the store (", config.source,
                                       "): ", std::string(started.status().message())));
    }
    *server = *std::move(started);
    mine = absl::StrCat(base::HostName(), "\n", (*server)->port(), "\n",
                        absl::StrJoin(net::InterfaceAddresses(), ","));
  }
  PLEXUS_ASSIGN_OR_RETURN(std::string published, bootstrap::PmixShareFromRank0(
                                                     launcher, config.rank, kKey, mine, timeout));
  const std::vector<std::string> parts = absl::StrSplit(published, '\n');
  int port = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &port) || port <= 0 || port > 65535) {
    return absl::DataLossError(absl::StrCat(
        "rank ", config.rank, ": the store address rank 0 published through ", launcher,
        "'s PMIx server is malformed ('", absl::CHexEscape(published.substr(0, 200)),
        "'); expected host, port and addresses on three lines. Set PLEXUS_STORE_ADDR instead"));
  }
  if (config.rank == 0 || parts[0] == base::HostName()) {
    return absl::StrCat("127.0.0.1:", port);
  }
  // Another host: the first of rank 0's addresses that accepts a connection from here.
  const absl::Time deadline = absl::Now() + std::min(timeout, absl::Seconds(30));
  std::vector<std::string> tried;
  for (absl::string_view ip : absl::StrSplit(parts[2], ',', absl::SkipEmpty())) {
    const std::string address = net::JoinHostPort(std::string(ip), static_cast<uint16_t>(port));
    auto resolved = net::ResolveFirst(address, "rank 0's store address");
    if (!resolved.ok()) continue;
    bool retryable = false;
    const absl::Time probe = std::min(deadline, absl::Now() + absl::Seconds(2));
    auto fd = net::ConnectTcp(*resolved, probe, &retryable);
    if (fd.ok()) {
      close(*fd);
      return address;
    }
    tried.push_back(absl::StrCat(address, " (", fd.status().message(), ")"));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", config.rank, " on host ", base::HostName(),
      " cannot reach the store rank 0 serves on host ", parts[0], " at any of its addresses: ",
      tried.empty() ? std::string("rank 0 published none") : absl::StrJoin(tried, "; "),
      ". Set PLEXUS_STORE_ADDR=<address of rank 0's host that every rank can reach>:<free port>"));
}

}  // namespace

absl::StatusOr<Rendezvous> Rendezvous::FromConfig(const LaunchInfo& config,
                                                  absl::Duration timeout) {
  std::shared_ptr<Store> store;
  std::unique_ptr<TcpStoreServer> server;
  bootstrap::JobIdentity job{config.job_id, false, config.job_id_source};
  // Recent torchrun versions run their own (incompatible) store on MASTER_PORT.
  const std::string torch_hint =
      config.source.find("MASTER_ADDR:MASTER_PORT") != std::string::npos
          ? " (under torchrun, MASTER_PORT may be torch's own store: set "
            "PLEXUS_STORE_ADDR=<MASTER_ADDR>:<another free port>)"
          : "";
  const std::string who = absl::StrCat("rank ", config.rank, " (", config.source, ")");
  if (config.store_kind == StoreKind::kFile) {
    PLEXUS_ASSIGN_OR_RETURN(auto file, FileStore::Open(config.store_path));
    store = std::move(file);
  } else if (config.store_kind == StoreKind::kEtcd) {
    PLEXUS_RETURN_IF_ERROR(RequireJobIdForEtcd(config));
    auto client =
        EtcdStore::Connect({.address = config.store_address, .prefix = "plexus/"}, timeout);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat(who, ": ", std::string(client.status().message())));
    }
    store = *std::move(client);
  } else if (config.store_kind == StoreKind::kTorch) {
    auto client = TorchStore::Connect(config.store_address, timeout);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat(who, ": ", std::string(client.status().message())));
    }
    store = *std::move(client);
  } else if (config.store_kind == StoreKind::kPmix) {
    if (job.id.empty() && config.rank == 0) {
      job = {bootstrap::NewJobNonce(), true, "nonce chosen by rank 0: the launcher gave no id"};
    }
    PLEXUS_ASSIGN_OR_RETURN(std::string connect_to,
                            PmixStoreAddress(config, job, &server, timeout));
    auto client = TcpStore::Connect(connect_to, timeout, absl::Seconds(30), job.id);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat(who, ": ", std::string(client.status().message())));
    }
    if (job.id.empty() && (*client)->server_job_id_is_nonce()) {
      job = {(*client)->server_job_id(), true, "nonce chosen by rank 0: the launcher gave no id"};
    }
    store = *std::move(client);
  } else {
    PLEXUS_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(config.store_address, "the store address"));
    std::string connect_to = config.store_address;
    std::string client_job = job.id;
    if (config.rank == 0 && !config.store_external) {
      PLEXUS_ASSIGN_OR_RETURN(server, bootstrap::ServeStore(config, hp, &job, timeout, torch_hint));
      client_job = job.id;
      connect_to = server->address();
      if (auto at = net::ParseHostPort(connect_to, "the store's address");
          at.ok() && (at->host == "0.0.0.0" || at->host == "::")) {
        connect_to = net::JoinHostPort(at->host == "::" ? "::1" : "127.0.0.1", server->port());
      }
    }
    auto client = TcpStore::Connect(connect_to, timeout, absl::Seconds(30), client_job);
    if (!client.ok()) {
      if (config.rank == 0 && server == nullptr) {
        return absl::Status(
            client.status().code(),
            absl::StrCat(std::string(client.status().message()),
                         " Note: PLEXUS_STORE_EXTERNAL is set, so rank 0 did not start the store "
                         "at ",
                         config.store_address, " but expected something else to serve it."));
      }
      if (absl::IsFailedPrecondition(client.status())) {
        return absl::FailedPreconditionError(
            absl::StrCat(who, ": ", std::string(client.status().message()), torch_hint));
      }
      return client.status();
    }
    if (job.id.empty() && (*client)->server_job_id_is_nonce()) {
      job = {(*client)->server_job_id(), true, "nonce chosen by rank 0: the launcher gave no id"};
    }
    store = *std::move(client);
  }
  if (job.id.empty()) {
    // A store that carries no job (a file store, or one served by something other than rank 0):
    // rank 0 publishes a nonce in it. A directory reused from an earlier job may still hold that
    // job's nonce for a moment; docs/architecture.md says to use a fresh one or set a job id.
    if (config.rank == 0) {
      job = {bootstrap::NewJobNonce(), true, "nonce published by rank 0: the launcher gave no id"};
      PLEXUS_RETURN_IF_ERROR(store->Set(bootstrap::kJobNonceKey, job.id));
    } else {
      auto nonce = store->Get(bootstrap::kJobNonceKey, timeout);
      if (!nonce.ok()) {
        return absl::Status(
            nonce.status().code(),
            absl::StrCat(who, " waited for rank 0's job nonce: ", nonce.status().message()));
      }
      job = {*std::move(nonce), true, "nonce published by rank 0: the launcher gave no id"};
    }
  }
  store = bootstrap::NamespaceStore(std::move(store), job.id);
  const absl::Time join_deadline = absl::Now() + timeout;
  if (absl::Status joined =
          bootstrap::JoinJob(*store, job, config.rank, config.world_size, timeout);
      !joined.ok()) {
    if (server != nullptr && absl::IsAlreadyExists(joined)) {
      // The job is shared with another: its ranks still waiting, or started a moment later, learn
      // why from this store; gone, they would only time out, or another job's rank 0 could take
      // the port and gather them. Served while they come, until the join's deadline.
      store.reset();
      base::Logf(base::LogLevel::kError, "plexus rendezvous: %s", joined.message());
      bootstrap::KeepServingWhileRanksCome(*server, join_deadline);
    }
    return joined;
  }
  PLEXUS_ASSIGN_OR_RETURN(auto rdzv, Create(config.rank, config.world_size, std::move(store),
                                            config.local_rank, config.local_world_size));
  rdzv.launcher_ = config.launcher;
  rdzv.source_ = config.source;
  if (job.is_nonce) absl::StrAppend(&rdzv.source_, "; job nonce '", job.id, "'");
  rdzv.job_id_ = job.id;
  rdzv.server_ = std::move(server);
  if (config.local_rank < 0 || config.local_world_size < 0) {
    PLEXUS_RETURN_IF_ERROR(rdzv.DeriveLocalRanks(timeout));
    absl::StrAppend(&rdzv.source_, "; local ranks from host names");
  }
  return rdzv;
}

absl::StatusOr<std::shared_ptr<Store>> OpenJobStore(const Environment& env,
                                                    absl::Duration timeout) {
  if (!Lookup(env, "PLEXUS_STORE_ADDR") && !Lookup(env, "PLEXUS_STORE_PATH") &&
      !Lookup(env, "PLEXUS_STORE")) {
    return absl::InvalidArgumentError(
        "joining a running job: set PLEXUS_STORE_ADDR (host:port of the job's tcp store), "
        "PLEXUS_STORE_PATH (its file store) or PLEXUS_STORE=etcd://host:port, and PLEXUS_JOB_ID "
        "when the job has one");
  }
  PLEXUS_ASSIGN_OR_RETURN(LaunchInfo config, SingleProcess(env));
  std::shared_ptr<Store> store;
  std::string job = config.job_id;
  if (config.store_kind == StoreKind::kEtcd) {
    PLEXUS_ASSIGN_OR_RETURN(
        auto client,
        EtcdStore::Connect({.address = config.store_address, .prefix = "plexus/"}, timeout));
    store = std::move(client);
  } else if (config.store_kind == StoreKind::kFile) {
    PLEXUS_ASSIGN_OR_RETURN(auto file, FileStore::Open(config.store_path));
    store = std::move(file);
  } else {
    PLEXUS_ASSIGN_OR_RETURN(
        auto client, TcpStore::Connect(config.store_address, timeout, absl::Seconds(30), job));
    if (job.empty() && client->server_job_id_is_nonce()) job = client->server_job_id();
    store = std::move(client);
  }
  if (job.empty()) {
    auto nonce = store->Get(bootstrap::kJobNonceKey, timeout);
    if (!nonce.ok()) {
      return absl::Status(nonce.status().code(),
                          absl::StrCat("joining a running job: no job id (PLEXUS_JOB_ID) and no "
                                       "job nonce in the store: ",
                                       nonce.status().message()));
    }
    job = *std::move(nonce);
  }
  return bootstrap::NamespaceStore(std::move(store), job);
}

absl::StatusOr<Rendezvous> Rendezvous::Create(int rank, int world_size,
                                              std::shared_ptr<Store> store, int local_rank,
                                              int local_world_size) {
  if (store == nullptr) return absl::InvalidArgumentError("Rendezvous needs a store");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world size ", world_size,
                                                   ": need 0 <= rank < world size"));
  }
  if ((local_rank >= 0 || local_world_size >= 0) &&
      (local_rank < 0 || local_world_size < 1 || local_rank >= local_world_size ||
       local_world_size > world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", local_rank, " of local size ", local_world_size,
                     " (world size ", world_size, "): need local rank < local size <= world size"));
  }
  Rendezvous r;
  r.rank_ = rank;
  r.world_size_ = world_size;
  r.local_rank_ = local_rank >= 0 ? local_rank : 0;
  r.local_world_size_ = local_world_size >= 0 ? local_world_size : 1;
  r.store_ = std::move(store);
  r.source_ =
      absl::StrCat("explicit (rank ", rank, " of ", world_size, "), ", r.store_->description());
  return r;
}

Rendezvous::Rendezvous(Rendezvous&&) noexcept = default;
Rendezvous& Rendezvous::operator=(Rendezvous&&) noexcept = default;

Rendezvous::~Rendezvous() {
  store_.reset();
  if (server_ == nullptr) return;
  // A failed job need not wait: a rank that reported the failure is done with the store, and one
  // that is stopped or hung would hold this rank for the whole linger.
  base::PollUntil(absl::Now() + linger_, absl::Milliseconds(2),
                  [&] { return server_->connected_clients() == 0 || server_->job_failed(); });
  server_.reset();
}

absl::Status Rendezvous::DeriveLocalRanks(absl::Duration timeout) {
  const std::string prefix = "plexus/rendezvous/host/";
  PLEXUS_RETURN_IF_ERROR(store_->Set(absl::StrCat(prefix, rank_), HostName()));
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> hosts(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    auto host = store_->Get(absl::StrCat(prefix, r),
                            std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!host.ok()) {
      return absl::Status(host.status().code(),
                          absl::StrCat("deriving local ranks from host names: ",
                                       std::string(host.status().message())));
    }
    hosts[r] = *std::move(host);
  }
  local_rank_ = 0;
  local_world_size_ = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (hosts[r] != hosts[rank_]) continue;
    if (r < rank_) ++local_rank_;
    ++local_world_size_;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Rendezvous::AllGather(std::string_view key_prefix,
                                                               std::string_view my_value,
                                                               absl::Duration timeout) {
  const std::string base =
      absl::StrCat("plexus/allgather/", std::string(key_prefix), "/", sequence_++, "/");
  PLEXUS_RETURN_IF_ERROR(store_->Set(absl::StrCat(base, rank_), my_value));
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  std::vector<std::string> values(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    const absl::Duration left = deadline == absl::InfiniteFuture()
                                    ? absl::InfiniteDuration()
                                    : std::max(deadline - absl::Now(), absl::ZeroDuration());
    auto value = store_->Get(absl::StrCat(base, r), left);
    if (value.ok()) {
      values[r] = *std::move(value);
      continue;
    }
    if (!absl::IsDeadlineExceeded(value.status())) return value.status();
    std::vector<std::string> missing;
    for (int m = r; m < world_size_; ++m) {
      auto present = store_->Check({absl::StrCat(base, m)});
      if (present.ok() && !*present) missing.push_back(std::to_string(m));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "AllGather '", std::string(key_prefix), "' timed out after ", absl::FormatDuration(timeout),
        " in the ", store_->description(), ": rank", missing.size() == 1 ? " " : "s ",
        absl::StrJoin(missing, ", "), " of ", world_size_,
        " did not contribute (did they crash, or call a different sequence of collectives?)"));
  }
  return values;
}

absl::Status Rendezvous::Barrier(std::string_view name, absl::Duration timeout) {
  const std::string base = absl::StrCat("plexus/barrier/", std::string(name), "/", sequence_++);
  PLEXUS_ASSIGN_OR_RETURN(auto arrived, store_->Add(absl::StrCat(base, "/count"), 1));
  if (arrived == world_size_) {
    PLEXUS_RETURN_IF_ERROR(store_->Set(absl::StrCat(base, "/done"), ""));
  }
  auto done = store_->Get(absl::StrCat(base, "/done"), timeout);
  if (done.ok()) return absl::OkStatus();
  if (!absl::IsDeadlineExceeded(done.status())) return done.status();
  auto now_arrived = store_->Add(absl::StrCat(base, "/count"), 0);
  return absl::DeadlineExceededError(absl::StrCat(
      "barrier '", std::string(name), "' timed out after ", absl::FormatDuration(timeout), ": ",
      now_arrived.ok() ? std::to_string(*now_arrived) : std::string("?"), " of ", world_size_,
      " ranks arrived (", store_->description(), ")"));
}

}  // namespace plexus::transport
