// Failure handling of the communicator: whom a failed call blames (with the peers' accounts on
// the store, blame.hpp), the error every later call returns, and closing the connections.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "communicator_impl.hpp"

namespace plexus::collectives::internal {
namespace {

using transport::Completion;

// The blame for a failed connection to `peer`, worded to follow "rank <peer> ".
internal::Blame ConnectionBlame(int self, int peer, const absl::Status& why) {
  internal::Blame b;
  b.ranks = {peer};
  b.reporter = self;
  const std::string text(why.message());
  if (absl::IsDataLoss(why)) {
    b.code = absl::StatusCode::kDataLoss;
    b.reason = absl::StrCat("sent malformed data (", text, ")");
  } else if (absl::IsDeadlineExceeded(why)) {
    b.code = absl::StatusCode::kDeadlineExceeded;
    b.reason = absl::StrCat("made no progress (", text, "): hung or unreachable");
  } else if (absl::IsAborted(why)) {
    b.code = absl::StatusCode::kUnavailable;
    b.reason = absl::StrCat("closed its connection (", text, "): it aborted");
  } else {
    b.code = absl::StatusCode::kUnavailable;
    b.reason = absl::StrCat("died or is unreachable (connection failed: ", text, ")");
  }
  return b;
}

}  // namespace

absl::Status CommunicatorImpl::Abort(const CallHeader& header, Failure failure) {
  const int self = layout_.rank;
  if (failure.kind == Failure::Kind::kPeer) {
    // Alive and failing because of that connection: a peer resolving a stall meanwhile must
    // not take this rank for the silent one.
    board_->PostWaiting({failure.peer}, absl::StatusCode::kUnavailable, "connection failed");
  }
  // A peer that closed on purpose published its account first: read it at once. Anything else
  // may be a death, which shows on every connection to that rank; give the transport a moment
  // to notice so that the error names the rank that died, not only the neighbour that told us.
  if (failure.kind == Failure::Kind::kPeer && !absl::IsAborted(failure.why) &&
      conns_.device != nullptr) {
    const absl::Time until = absl::Now() + absl::Milliseconds(200);
    Completion drained[16];
    while (absl::Now() < until) {
      conns_.Progress(absl::Milliseconds(5));
      conns_.cq->Poll(absl::MakeSpan(drained));
    }
  }
  // Direct evidence first: a connection that failed other than by the peer's deliberate close
  // (Aborted) names a rank that died, hung or is unreachable. Ranks that closed on purpose did
  // so because of a failure of their own, which they published before closing.
  int died = -1;
  absl::Status died_why;
  std::vector<int> closed;
  for (int r = 0; r < layout_.n; ++r) {
    for (auto& channel : conns_.conns) {
      if (!channel[r]) continue;
      const absl::Status s = channel[r]->status();
      if (s.ok() || absl::IsCancelled(s)) continue;
      if (absl::IsAborted(s)) {
        closed.push_back(r);
      } else if (died < 0 || r == failure.peer) {
        died = r;
        died_why = s;
      }
      break;
    }
  }
  internal::Blame local;
  std::vector<int> consult;
  absl::Time deadline = absl::Now();
  switch (failure.kind) {
    case Failure::Kind::kOwn:
      local.code = failure.own.ok() ? absl::StatusCode::kUnknown : failure.own.code();
      local.reporter = self;
      local.reason = std::string(failure.own.message());
      break;
    case Failure::Kind::kPeer:
      if (died >= 0) {
        local = ConnectionBlame(self, died, died_why);
        // A rank that aborted on purpose may still look dead here (its close raced a send:
        // a broken pipe); it published its account before closing: one read finds it.
        consult = {died};
      } else {
        local = ConnectionBlame(self, failure.peer, failure.why);
        consult = closed;
        auto it = std::find(consult.begin(), consult.end(), failure.peer);
        if (it != consult.end()) std::rotate(consult.begin(), it, it + 1);
        deadline += absl::Milliseconds(200);
      }
      break;
    case Failure::Kind::kStall:
      if (died >= 0) {
        local = ConnectionBlame(self, died, died_why);
        consult = {died};  // as above
      } else {
        local.final = false;
        local.call = header;
        local.code = absl::StatusCode::kDeadlineExceeded;
        local.ranks = failure.waiting;
        local.reporter = self;
        local.reason = absl::StrCat("made no progress for ", absl::FormatDuration(options_.timeout),
                                    " (hung, dead, or not in this call)");
        // Ranks blocked on the silent one time out at about the same moment; their accounts
        // show whom they wait for. A tenth of the timeout keeps detection within 1.1x of it.
        deadline +=
            std::clamp(options_.timeout / 10, absl::Milliseconds(20), absl::Milliseconds(1000));
      }
      break;
  }
  const internal::Blame blame = board_->Resolve(local, std::move(consult), deadline);

  const std::string call = header.Describe();
  std::string message;
  if (blame.ranks.empty()) {
    message = blame.reporter == self
                  ? blame.reason
                  : absl::StrCat(call, " failed on rank ", self, ": rank ", blame.reporter,
                                 " aborted the communicator: ", blame.reason);
  } else {
    message = absl::StrCat(call, " failed on rank ", self, ": rank ",
                           absl::StrJoin(blame.ranks, ", rank "), " ", blame.reason);
    if (blame.reporter != self &&
        std::find(blame.ranks.begin(), blame.ranks.end(), blame.reporter) == blame.ranks.end()) {
      absl::StrAppend(&message, "; reported by rank ", blame.reporter,
                      ", which aborted because of it");
    } else if (failure.kind == Failure::Kind::kStall && blame.ranks != failure.waiting) {
      absl::StrAppend(&message, "; this rank waited for rank(s) ",
                      absl::StrJoin(failure.waiting, ", "), ", blocked on it");
    }
  }
  const std::string down = conns_.DownRanks(layout_.n);
  if (!down.empty()) absl::StrAppend(&message, " [connections down: ", down, "]");
  absl::Status status(blame.code, message);
  issue_.Break(status, /*replace=*/true);
  conns_.Close();
  return status;
}

}  // namespace plexus::collectives::internal
