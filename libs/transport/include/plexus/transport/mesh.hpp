// Connecting the ranks of a job: the step between a Rendezvous and a communicator.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::transport {

// Connects this rank to every other rank of `rendezvous` over `device` (collective: every rank
// calls it with the same `tag`). Result[r] is the connection to rank r; result[rank()] is null.
// Completions of all connections go to `cq`. Each rank listens once and publishes its address
// under `tag` in the store; the higher rank of each pair connects and announces itself.
absl::StatusOr<std::vector<std::unique_ptr<Connection>>> ConnectFullMesh(
    Rendezvous& rendezvous, Device& device, CompletionQueue* cq, std::string_view tag,
    absl::Duration timeout = absl::Minutes(1));

}  // namespace plexus::transport
