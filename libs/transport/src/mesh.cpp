#include "plexus/transport/mesh.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::transport {
namespace {

// Drives `cq` until the completion of `wr_id` on connection `conn_id`; completions of other
// operations are not expected during connection set-up.
absl::Status AwaitSetup(CompletionQueue* cq, uint64_t conn_id, absl::Time deadline,
                        std::string_view what) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    absl::StatusOr<Completion> c = cq->Wait(std::max(left, absl::ZeroDuration()));
    if (!c.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(std::string(what), ": timed out"));
    }
    if (c->connection_id != conn_id) continue;
    if (!c->status.ok()) {
      return absl::UnavailableError(
          absl::StrCat(std::string(what), ": ", std::string(c->status.message())));
    }
    return absl::OkStatus();
  }
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Connection>>> ConnectFullMesh(Rendezvous& rendezvous,
                                                                         Device& device,
                                                                         CompletionQueue* cq,
                                                                         std::string_view tag,
                                                                         absl::Duration timeout) {
  if (cq == nullptr) return absl::InvalidArgumentError("ConnectFullMesh: null completion queue");
  const absl::Time deadline = absl::Now() + timeout;
  const int rank = rendezvous.rank();
  const int size = rendezvous.world_size();
  std::vector<std::unique_ptr<Connection>> conns(size);
  if (size == 1) return conns;

  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, device.Listen(""));
  const std::string key = absl::StrCat("plexus/mesh/", std::string(tag), "/",
                                       std::string(BackendName(device.backend())));
  PLEXUS_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                          rendezvous.AllGather(key, listener->address(), timeout));

  // Connect to every lower rank and introduce ourselves with our rank.
  const uint32_t me = static_cast<uint32_t>(rank);
  for (int peer = 0; peer < rank; ++peer) {
    absl::StatusOr<std::unique_ptr<Connection>> c = device.Connect(addresses[peer], cq);
    if (!c.ok()) {
      return absl::Status(c.status().code(), absl::StrCat("connecting to rank ", peer, ": ",
                                                          std::string(c.status().message())));
    }
    PLEXUS_RETURN_IF_ERROR((*c)->PostSend(ConstBuffer{&me, sizeof me}, 0));
    PLEXUS_RETURN_IF_ERROR(AwaitSetup(cq, (*c)->id(), deadline,
                                      absl::StrCat("introducing rank ", rank, " to rank ", peer)));
    conns[peer] = *std::move(c);
  }
  // Accept every higher rank; each tells us who it is.
  for (int i = rank + 1; i < size; ++i) {
    absl::StatusOr<std::unique_ptr<Connection>> c =
        listener->Accept(cq, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!c.ok()) {
      return absl::Status(c.status().code(),
                          absl::StrCat("rank ", rank, " waiting for ", size - i,
                                       " higher ranks: ", std::string(c.status().message())));
    }
    uint32_t who = UINT32_MAX;
    PLEXUS_RETURN_IF_ERROR((*c)->PostRecv({&who, sizeof who}, 0));
    PLEXUS_RETURN_IF_ERROR(AwaitSetup(cq, (*c)->id(), deadline, "waiting for a peer's rank"));
    if (who <= me || who >= static_cast<uint32_t>(size) || conns[who] != nullptr) {
      return absl::DataLossError(absl::StrCat("mesh set-up: unexpected peer rank ", who));
    }
    conns[who] = *std::move(c);
  }
  return conns;
}

}  // namespace plexus::transport
