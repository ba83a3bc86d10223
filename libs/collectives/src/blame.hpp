// Whom a failed communicator blames. A rank that fails publishes its account on the store
// before it closes its connections; a peer that then sees those connections close (or that
// timed out waiting for that rank) reads it, so that every rank's error names the rank that
// failed first rather than a rank that aborted in reaction (docs/collectives.md, "Failure").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "plexus/transport/store.hpp"

namespace plexus::collectives::internal {

struct Blame {
  // false: a stall still being resolved (`ranks` are the ranks this rank waited for).
  bool final = true;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  // final: the rank(s) blamed; empty when the reporter failed on its own account (mismatched
  // calls, say), then `reason` is its whole message.
  std::vector<int> ranks;
  int reporter = -1;   // the rank whose observation this is
  std::string reason;  // follows "rank X " ("died or is unreachable (...)")

  std::string Encode() const;
  static std::optional<Blame> Decode(std::string_view text);
};

// The store key of `rank`'s account for the communicator `uid`.
std::string BlameKey(uint64_t uid, int rank);

// Resolves `local` (this rank's own view) against the peers' accounts and publishes the result
// as this rank's account, on a thread of its own: the store may be served by a rank that hangs
// too. Returns the resolved blame, or `local` when the store did not answer by `deadline` (plus
// a little for the final write).
//  - A stall (local.final false): published as such first; then, until `deadline`, the ranks
//    waited for are followed through their own stall accounts. A final account on the way is
//    adopted; otherwise the ranks reached that published nothing are the silent ones.
//  - A final view whose `consult` ranks closed their connections on purpose: their accounts
//    (published before they closed) are adopted when found before `deadline`.
Blame ResolveBlame(std::shared_ptr<transport::Store> store, uint64_t uid, int self, Blame local,
                   std::vector<int> consult, absl::Time deadline);

// Publishes that `self` is alive and failing because of `ranks` (a connection that failed),
// before the slower resolution, so that a peer resolving a stall does not take this rank for
// the silent one. Waits for the store until `deadline` at most.
void AnnounceWaiting(std::shared_ptr<transport::Store> store, uint64_t uid, int self,
                     std::vector<int> ranks, absl::Time deadline);

}  // namespace plexus::collectives::internal
