// Rank 0's store server for a tcp rendezvous (StoreKind::kTcp), split from rendezvous.cpp.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bootstrap/job_store.hpp"
#include "plexus/base/net.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport::bootstrap {

// Serves the store at the address given (`hp`, parsed from config.store_address): on that host (a
// name resolved to its address), or on config.store_bind. Chooses the job's nonce into `job` when
// it has no id. FailedPrecondition when the address is not this host's; when the port is taken,
// the bind error with what holds it, and a plexus store of a job without id (or of this job's id)
// there is marked shared (MarkJobShared), since its ranks cannot tell the two jobs apart.
// `torch_hint` is appended to a bind error.
absl::StatusOr<std::unique_ptr<TcpStoreServer>> ServeStore(const LaunchInfo& config,
                                                           const base::net::HostPort& hp,
                                                           JobIdentity* job, absl::Duration timeout,
                                                           const std::string& torch_hint);

// Serves until no client has connected or been connected for a second, or until `deadline`: the
// ranks of a job marked shared that are waiting or about to come read why from the store.
void KeepServingWhileRanksCome(const TcpStoreServer& server, absl::Time deadline);

}  // namespace plexus::transport::bootstrap
