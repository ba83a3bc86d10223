// Joining a job that is already running (an elastic newcomer, e.g. plexus::moe::Trainer::Join).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

// Opens the store of the running job as its ranks see it (Rendezvous::store(): the same job
// namespace), from PLEXUS_STORE_ADDR or PLEXUS_STORE_PATH and PLEXUS_JOB_ID (needed when the
// launcher gave the job an id; else rank 0's nonce, which the tcp store's server tells or rank 0
// published in a file store), as a client that claims no rank. A server of another job refuses
// it (FailedPrecondition naming both).
// InvalidArgument when the environment names no store; the store's errors when it cannot be reached
// in `timeout`.
absl::StatusOr<std::shared_ptr<Store>> OpenJobStore(const Environment& env, absl::Duration timeout);

}  // namespace plexus::transport
