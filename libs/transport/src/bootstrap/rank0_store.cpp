// Rank 0's store server for a tcp rendezvous: where it listens, what it says when it cannot, and
// how long it serves when its job turned out to be shared.
#include "bootstrap/rank0_store.hpp"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/host.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/wait_policy.hpp"

namespace plexus::transport::bootstrap {

namespace net = base::net;

namespace {

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

// Why rank 0 could not bind the store's port, told by asking whoever holds it. A plexus store of
// a job without job id (while this rank 0 has none either), or of this very job id, is a second
// rank 0 of the job that store serves: its ranks cannot tell the two jobs apart, so the job is
// marked shared there and its ranks fail too (MarkJobShared).
std::string DescribePortHolder(const std::string& address, const LaunchInfo& config,
                               absl::Duration timeout) {
  const absl::Duration probe = std::min(timeout, absl::Seconds(2));
  auto holder = TcpStore::Connect(address, probe, probe, config.job_id);
  if (holder.ok()) {
    const std::string served = (*holder)->server_job_id();
    if (served.empty()) {
      return " A plexus store that serves any job is running there: if it is this job's store, "
             "set PLEXUS_STORE_EXTERNAL=1 so that rank 0 uses it instead of serving one.";
    }
    const std::string why = absl::StrCat(
        "a second rank 0 (pid ", getpid(), " on ", base::HostName(), ") found the store address ",
        config.store_address,
        " taken by this job's store: two jobs share this store address, or a launcher started "
        "rank 0 twice. Give each job its own store port (PLEXUS_STORE_ADDR or MASTER_PORT), and "
        "set "
        "PLEXUS_JOB_ID to a value unique to each job on all of its ranks, or start each job with "
        "a launcher (plexus-run, torchrun, mpirun, srun), which gives it one");
    std::shared_ptr<Store> job_view = NamespaceStore(std::move(*holder), served);
    const absl::Status marked = MarkJobShared(*job_view, why);
    return absl::StrCat(
        " A plexus store of ",
        config.job_id.empty() ? std::string("a job without job id")
                              : absl::StrCat("this job's id ('", config.job_id, "')"),
        " is running there, started by another rank 0: two jobs share this store address, or a "
        "launcher started rank 0 twice. ",
        marked.ok() ? "Its ranks were told so and fail too. "
                    : absl::StrCat("Telling its ranks so failed: ", marked.message(), ". "),
        "Give each job its own store port (PLEXUS_STORE_ADDR or MASTER_PORT), and set "
        "PLEXUS_JOB_ID to a value unique to each job on all of its ranks, or start each job with "
        "a launcher (plexus-run, torchrun, mpirun, srun), which gives it one.");
  }
  if (absl::IsFailedPrecondition(holder.status())) {
    return absl::StrCat(" Asked who holds it: ", holder.status().message());
  }
  return "";
}

}  // namespace

// Rank 0 of a tcp rendezvous serves the store at the address given: its host (a name resolved to
// its address), or PLEXUS_STORE_BIND's. Chooses the job's nonce when the job has no id.
absl::StatusOr<std::unique_ptr<TcpStoreServer>> ServeStore(const LaunchInfo& config,
                                                           const net::HostPort& hp,
                                                           JobIdentity* job, absl::Duration timeout,
                                                           const std::string& torch_hint) {
  if (config.store_bind.empty() && !net::IsLocalHost(hp.host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank 0 (", config.source, ") serves the store, but ", config.store_address,
        " is not an address of this host (", base::HostName(),
        "): point the store address at rank 0's host, or set PLEXUS_STORE_EXTERNAL=1 when "
        "something else serves the store there"));
  }
  const std::string bind_host = config.store_bind.empty() ? hp.host : config.store_bind;
  if (job->id.empty()) {
    *job = {NewJobNonce(), true, "nonce chosen by rank 0: the launcher gave no id"};
  }
  TcpStoreServer::Options options;
  options.job_id = job->id;
  options.job_id_is_nonce = job->is_nonce;
  auto started = TcpStoreServer::Start(net::JoinHostPort(bind_host, hp.port), options);
  if (!started.ok()) {
    std::string holder;
    if (absl::IsUnavailable(started.status()) && hp.port != 0) {
      const bool v6 = bind_host.find(':') != std::string::npos;
      const std::string probe_host =
          IsWildcard(bind_host) ? std::string(v6 ? "::1" : "127.0.0.1") : bind_host;
      holder = DescribePortHolder(net::JoinHostPort(probe_host, hp.port), config, timeout);
    }
    return absl::Status(started.status().code(),
                        absl::StrCat("rank 0 cannot serve the store (", config.source, "): ",
                                     std::string(started.status().message()), torch_hint, holder));
  }
  const std::string bound = (*started)->address();
  if (config.store_bind.empty() && !net::IsIpLiteral(hp.host) && hp.host != "localhost" &&
      (bound.rfind("127.", 0) == 0 || bound.rfind("[::1]", 0) == 0)) {
    // Debian maps the host's own name to 127.0.1.1: other hosts cannot reach a store there.
    base::Logf(base::LogLevel::kWarning,
               "plexus rendezvous: the store address %s resolves to %s here, a loopback "
               "address: ranks on other hosts cannot reach it. Name an interface address, or set "
               "PLEXUS_STORE_BIND (e.g. 0.0.0.0 for every interface)",
               config.store_address, bound);
  }
  return started;
}

// Serves until no client has connected or been connected for a second, or until `deadline`.
void KeepServingWhileRanksCome(const TcpStoreServer& server, absl::Time deadline) {
  absl::Time last_busy = absl::Now();
  size_t accepted = server.accepted_clients();
  base::PollUntil(deadline, absl::Milliseconds(10), [&] {
    const absl::Time now = absl::Now();
    if (server.connected_clients() > 0 || server.accepted_clients() != accepted) last_busy = now;
    accepted = server.accepted_clients();
    return now - last_busy >= absl::Seconds(1);
  });
}

}  // namespace plexus::transport::bootstrap
