// MultipathChannel's failure handling: a dead path's chunks reposted once, the kPathDown fence,
// silence and stall timers.
#include "channel_impl.hpp"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::multipath {

void MultipathChannel::Impl::PathFailed(Path& p, absl::Status why) {
  if (p.state == PathState::kDead) return;
  const bool greeted = p.state == PathState::kUp;
  p.state = PathState::kDead;
  p.error = why.ok() ? absl::UnavailableError("path failed") : std::move(why);
  if (p.conn) p.conn->Close();
  std::vector<uint32_t> moved;
  for (uint32_t slot : p.in_flight) {
    Desc& d = descs_[slot];
    ++d.gen;
    d.path = -1;
    if (d.notify) {
      d.used = false;
      d.op->notify_queued = false;
      --d.op->outstanding;
      Op* op = d.op;
      d.op = nullptr;
      free_descs_.push_back(slot);
      QueueNotify(*op);
      continue;
    }
    ++p.chunks_reposted;
    moved.push_back(slot);
  }
  std::sort(moved.begin(), moved.end(),
            [&](uint32_t a, uint32_t b) { return descs_[a].offset < descs_[b].offset; });
  repost_.insert(repost_.begin(), moved.begin(), moved.end());
  p.in_flight.clear();
  p.in_flight_chunks = 0;
  p.in_flight_bytes = 0;
  if (greeted) fences_[p.index] = true;
  // (Re)announce every open fence: a kPathDown sent on this path may have died with it.
  pending_path_down_.clear();
  for (const auto& [dead, open] : fences_) pending_path_down_.push_back(dead);
  if (LivePaths() == 0 && !have_no_path_since_) have_no_path_since_ = absl::Now();
  SendPathDowns();
  MaybeFailAllDead(p.error);
  revive_cv_.notify_one();
}

void MultipathChannel::Impl::ReviveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && failed_.ok()) {
    const absl::Time now = absl::Now();
    int lane = -1;
    absl::Time wake = now + absl::Milliseconds(100);  // re-checked at least this often
    for (int l = 0; l < static_cast<int>(lanes_.size()); ++l) {
      Lane& ln = lanes_[l];
      if (LaneAlive(l)) {
        ln.backoff.Reset();
        ln.next_try = absl::InfinitePast();
      } else if (ln.next_try <= now) {
        lane = l;
        break;
      } else {
        wake = std::min(wake, ln.next_try);
      }
    }
    if (lane < 0) {
      revive_cv_.wait_for(lock, absl::ToChronoNanoseconds(wake - now));
      continue;
    }
    // The redial may block (a connect over a path that drops SYNs): without the lock, so
    // traffic on the live paths goes on meanwhile.
    lock.unlock();
    absl::StatusOr<std::unique_ptr<pt::Connection>> conn = options_.redial(lane);
    lock.lock();
    if (stop_ || !failed_.ok()) break;  // the connection, if any, closes as it goes
    absl::Status why = conn.status();
    if (conn.ok()) {
      absl::StatusOr<int> index = AddPathLocked(*std::move(conn), lane);
      if (index.ok()) {
        ++paths_revived_;
        Schedule();
        FlushUser();
        continue;
      }
      why = index.status();
    }
    last_redial_error_ = absl::StrCat("lane ", lane, ": ", why.ToString());
    Lane& ln = lanes_[lane];
    ln.next_try = absl::Now() + ln.backoff.Next();
  }
}

void MultipathChannel::Impl::MaybeFailAllDead(const absl::Status& last) {
  if (!fail_when_all_paths_dead_ || !failed_.ok() || paths_.empty()) return;
  std::string why;
  // Aborted comes only from the peer's close frame: a peer that closed the connection on purpose
  // closes every path, and the other paths then fail of it (a send into a closed socket) in
  // whatever order they are noticed, so one path that saw the close frame decides.
  bool peer_closed = absl::IsAborted(last);
  for (const auto& p : paths_) {
    if (p->state != PathState::kDead) return;
    absl::StrAppend(&why, why.empty() ? "" : "; ", "path ", p->index, " (", p->peer,
                    "): ", p->error.message());
    peer_closed = peer_closed || absl::IsAborted(p->error);
  }
  const std::string message = absl::StrCat("multipath connection: every path is down (", why, ")");
  Fail(peer_closed ? absl::AbortedError(message) : absl::UnavailableError(message));
}

void MultipathChannel::Impl::SendPathDowns() {
  while (!pending_path_down_.empty()) {
    Path* control = ControlPath();
    if (control == nullptr) return;
    const int dead = pending_path_down_.front();
    pending_path_down_.pop_front();
    Frame f;
    f.type = FrameType::kPathDown;
    f.seq = paths_[dead]->peer_index;
    f.offset = static_cast<uint64_t>(dead);
    SendControl(*control, f);
  }
}

void MultipathChannel::Impl::Fail(absl::Status why) {
  if (!failed_.ok()) return;
  failed_ = why;
  for (auto& p : paths_) PathFailed(*p, why);
  for (auto& [seq, op] : ops_) Complete(*op, why);
  reassembler_.CancelRecvs(why);
  for (uint32_t slot : repost_) FreeDesc(slot);
  ops_.clear();
  to_cut_.clear();
  notify_.clear();
  repost_.clear();
}

void MultipathChannel::Impl::Timers(absl::Time now) {
  // A path is declared dead by silence only while another path shows the peer is alive and
  // this side is being scheduled: when every path is silent at once, this process or the
  // peer stalled (or every path broke, which the transport's own timeouts report).
  absl::Time freshest = absl::InfinitePast();
  for (const auto& path : paths_) {
    if (path->state == PathState::kUp) freshest = std::max(freshest, path->last_heard);
  }
  // The peer counts as alive when some path was heard within the last half of the timeout: a
  // path silent for the whole timeout then went quiet well before the others did. (Within one
  // probe interval of each other, as when every path stops at once, both are silence.)
  const bool peer_alive = now - freshest <= path_timeout_ / 2;
  const bool waiting = !ops_.empty() || reassembler_.recv_waiting();
  if (waiting && freshest != absl::InfinitePast() && now - freshest > silence_timeout_) {
    Fail(absl::UnavailableError(
        absl::StrCat("multipath connection: nothing heard from the peer on any of its ",
                     LivePaths(), " live paths for ", absl::FormatDuration(now - freshest),
                     " (silence_timeout ", absl::FormatDuration(silence_timeout_),
                     ") with operations outstanding: the peer or every path is gone")));
    return;
  }
  for (auto& path : paths_) {
    Path& p = *path;
    if (p.state == PathState::kDead) continue;
    const bool busy = !p.in_flight.empty() || p.probe_outstanding;
    if (busy && peer_alive && now - p.last_progress > path_timeout_) {
      PathFailed(p, absl::DeadlineExceededError(absl::StrCat(
                        "multipath path ", p.index, " to ", p.peer, ": no progress for ",
                        absl::FormatDuration(now - p.last_progress), " (path_timeout ",
                        absl::FormatDuration(path_timeout_), ")")));
      continue;
    }
    // A revived path whose greeting never came (the peer gave up on it, or the path went dark
    // again at once) must not hold its lane: it dies, and the lane is redialed (if this process
    // was stalled instead, the cost is one more redial).
    if (p.state == PathState::kGreeting && options_.redial &&
        now - p.last_progress > std::max(absl::Seconds(1), 4 * path_timeout_)) {
      PathFailed(p, absl::DeadlineExceededError(absl::StrCat(
                        "multipath path ", p.index, " (lane ", p.lane, ") to ", p.peer,
                        ": no greeting within ", absl::FormatDuration(now - p.last_progress))));
      continue;
    }
    if (p.state != PathState::kUp) continue;
    if (now - p.last_tick >= options_.probe_interval) {
      p.last_tick = now;
      p.load_snapshot = p.monitor.bandwidth() > 0
                            ? static_cast<double>(p.in_flight_bytes) / p.monitor.bandwidth()
                            : static_cast<double>(p.in_flight_chunks);
      if (now - p.last_signal >= options_.probe_interval) p.rate.Tick();
    }
    if (!p.probe_outstanding && now - p.last_probe >= options_.probe_interval) {
      Frame f;
      f.type = FrameType::kProbe;
      f.seq = ++p.probe_id;
      p.probe_outstanding = true;
      p.probe_sent = now;
      p.last_probe = now;
      if (p.in_flight.empty()) p.last_progress = now;
      SendControl(p, f);
    }
  }
  if (have_no_path_since_ && waiting && now - *have_no_path_since_ > silence_timeout_) {
    Fail(absl::UnavailableError(absl::StrCat("multipath: no live path for ",
                                             absl::FormatDuration(silence_timeout_),
                                             " with operations outstanding (silence_timeout)")));
  }
}

}  // namespace plexus::multipath
