// The launch environment: which launcher started this process, its rank, world size and job
// id, and which store its job meets in (ParseLaunchEnvironment), and opening that store from
// outside the job's ranks (OpenJobStore).

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bootstrap/job_store.hpp"
#include "bootstrap/launch_environment.hpp"
#include "bootstrap/pmix_exchange.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/join.hpp"
#include "plexus/transport/rendezvous.hpp"

extern char** environ;

namespace plexus::transport {

absl::Status bootstrap::RequireJobIdForEtcd(const LaunchInfo& config) {
  if (config.store_kind != StoreKind::kEtcd || !config.job_id.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "PLEXUS_STORE=etcd://... needs a job id, so that jobs sharing the etcd never meet: set "
      "PLEXUS_JOB_ID (or run under a launcher that gives one: plexus-run, torchrun, mpirun, srun)");
}

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
  PLEXUS_RETURN_IF_ERROR(bootstrap::RequireJobIdForEtcd(config));
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
  PLEXUS_RETURN_IF_ERROR(bootstrap::RequireJobIdForEtcd(config));
  config.source =
      absl::StrCat(launcher, " (", absl::StrJoin(used, ", "), "), store ", store_source, ", ",
                   config.job_id.empty()
                       ? std::string("no job id (rank 0 chooses a nonce)")
                       : absl::StrCat("job '", config.job_id, "' from ", config.job_id_source));
  return config;
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

}  // namespace plexus::transport
