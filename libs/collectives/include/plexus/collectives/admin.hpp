// The collectives' commands on a base::admin::AdminServer (the loopback, token-authenticated
// operator endpoint the rpc library also uses): list communicators and reconfigure one live
// (docs/collectives_operations.md, "Admin endpoint"). Opt-in: nothing listens unless the program
// starts a server and adds communicators here.
//
//   coll-list                        every added communicator: name, rank, size, ring order,
//                                    channels, epoch, since_sequence, sequence, overrides,
//                                    transport, peer_backends, health
//   coll-reconfigure name=NAME [ring_order=0,2,1,3] [algorithms=allreduce:ring] [channels=N]
//                    [transport=shm|tcp|tcp/per_peer]
//                                    Communicator::RequestReconfiguration; {"epoch": k}
//
// Any client of the wire works: base::admin::AdminCall, or `plexus-rpc-ctl call`.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/base/admin.hpp"
#include "plexus/collectives/communicator.hpp"

namespace plexus::collectives {

class CollectivesAdmin {
 public:
  // Adds coll-list and coll-reconfigure to `endpoint`, which must outlive this object.
  explicit CollectivesAdmin(base::admin::AdminServer* endpoint);
  // Removes the commands; when it returns no handler runs any more.
  ~CollectivesAdmin();
  CollectivesAdmin(const CollectivesAdmin&) = delete;
  CollectivesAdmin& operator=(const CollectivesAdmin&) = delete;

  // Makes `comm` reachable as `name` (letters, digits, '-', '_', '.', '/'). It must stay alive
  // until Remove(name) returns. AlreadyExists for a taken name, InvalidArgument for a bad one or
  // a null communicator.
  absl::Status Add(std::string name, Communicator* comm);
  // When it returns, no command uses the communicator any more. No-op for an unknown name.
  void Remove(const std::string& name);

  // The commands' results (JSON text), as the endpoint answers them.
  absl::StatusOr<std::string> List(const base::admin::AdminRequest& request) const;
  absl::StatusOr<std::string> Reconfigure(const base::admin::AdminRequest& request);

 private:
  base::admin::AdminServer* endpoint_;
  mutable std::mutex mu_;  // held while a command uses a communicator
  std::map<std::string, Communicator*> comms_;
};

}  // namespace plexus::collectives
