#include "plexus/transport/rendezvous.hpp"

#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bootstrap/job_store.hpp"
#include "bootstrap/launch_environment.hpp"
#include "bootstrap/pmix_exchange.hpp"
#include "bootstrap/rank0_store.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"

namespace plexus::transport {

namespace net = base::net;

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
    PLEXUS_RETURN_IF_ERROR(bootstrap::RequireJobIdForEtcd(config));
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
  PLEXUS_RETURN_IF_ERROR(store_->Set(absl::StrCat(prefix, rank_), base::HostName()));
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
