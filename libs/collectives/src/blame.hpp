// Whom a failed communicator blames (docs/collectives.md, "Contract"). Each rank keeps one record
// on the rendezvous store:
//  - a wait record while a call has made no progress for half the timeout: whom it waits for
//    and in which call, refreshed while it waits and removed when it progresses again, so that
//    when some rank times out the wait-for graph is already there and the silent rank (waited
//    for, no record) shows at once, whichever rank timed out first, and so do ranks stuck in
//    different calls (whose messages the transport holds unmatched);
//  - its final account when it fails, published before it closes its connections, so that a
//    peer that then sees those connections close adopts it and every rank's error names the
//    rank that failed first rather than a rank that aborted in reaction.
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
#include "wire.hpp"

namespace plexus::collectives::internal {

struct Blame {
  // false: a wait record (`ranks` are the ranks this rank waits for; it is alive).
  bool final = true;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  // final: the rank(s) blamed; empty when the reporter failed on its own account (mismatched
  // calls, say), then `reason` is its whole message.
  std::vector<int> ranks;
  int reporter = -1;   // the rank whose observation this is
  int64_t at_ms = 0;   // when the reporter wrote it (Unix milliseconds, its own clock)
  std::string reason;  // follows "rank X " ("died or is unreachable (...)")
  // A wait record: the call the rank waits in (to find ranks in different calls).
  std::optional<CallHeader> call;

  std::string Encode() const;
  static std::optional<Blame> Decode(std::string_view text);
};

// The store key of `rank`'s record for the communicator `uid`.
std::string BlameKey(uint64_t uid, int rank);

// This rank's record on the store. Writes go out in order on a helper thread of their own
// (started on the first one), so that the caller never blocks on the store (which may be served
// by a rank that hangs too) and an older write never lands after a newer one. A board that never
// posted costs nothing: the healthy path makes no store traffic.
class BlameBoard {
 public:
  // `store` may be null (no store: nothing is published, resolution keeps the local view).
  // Wait records older than `stale_after` (by the reader's clock) are not trusted: their writer
  // stopped refreshing them.
  BlameBoard(std::shared_ptr<transport::Store> store, uint64_t uid, int self,
             absl::Duration stale_after);
  ~BlameBoard();
  BlameBoard(const BlameBoard&) = delete;
  BlameBoard& operator=(const BlameBoard&) = delete;

  // Publishes that this rank is alive and waits for `ranks` in `call` (stamped now).
  void PostWaiting(std::vector<int> ranks, absl::StatusCode code, std::string reason,
                   std::optional<CallHeader> call = std::nullopt);
  // Publishes `b` (stamped now).
  void Post(Blame b);
  // Removes this rank's record, if it posted one since the last removal.
  void Retract();
  // Whether a record of this rank is (or is about to be) on the store.
  bool posted() const { return posted_; }
  // Waits until every write requested so far reached the store, or until `deadline`; true when
  // they did.
  bool Flush(absl::Time deadline);

  // Resolves `local` (this rank's own view) against the peers' records, posts the result as this
  // rank's final account and waits (until `deadline` plus a little for the write) for it to
  // reach the store. Store reads run on a thread of their own; `local` comes back when the store
  // did not answer by `deadline`.
  //  - A stall (local.final false): posted as a wait record first; then, until `deadline`, the
  //    ranks waited for are followed through their wait records. A rank reached that waits in
  //    another call than local.call makes the account FailedPrecondition naming both calls; a
  //    final account on the way (one that does not blame this rank) is adopted; otherwise the
  //    ranks reached that have no fresh record are the silent ones (among them, those another
  //    rank waits for too).
  //  - A final view whose `consult` ranks closed their connections on purpose: their accounts
  //    (published before they closed) are adopted when found before `deadline`.
  Blame Resolve(Blame local, std::vector<int> consult, absl::Time deadline);

 private:
  struct Shared;
  void Request(std::optional<std::string> value);

  std::shared_ptr<transport::Store> store_;
  uint64_t uid_;
  int self_;
  absl::Duration stale_after_;
  std::shared_ptr<Shared> shared_;
  bool posted_ = false;
};

}  // namespace plexus::collectives::internal
