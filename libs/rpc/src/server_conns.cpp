// A Server's connections from accept to close: the connection limit, the idle and frame
// timeouts (Sweep), and closing, which runs on its own thread (Reap) so that thousands of
// connections going at once do not stall the dispatcher.
#include <algorithm>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plexus/base/log.hpp"
#include "plexus/transport/accept_loop.hpp"
#include "server_impl.hpp"

namespace plexus::rpc::internal {

void ServerCore::Accept() {
  // Refusals are logged at most once a second (a client hammering a full server would flood the
  // log), with how many went unlogged in between.
  absl::Time logged = absl::InfinitePast();
  uint64_t unlogged = 0;
  transport::AcceptUntil(*listener, stop, cq.get(), [&](std::unique_ptr<transport::Connection> c) {
    auto sc = std::make_shared<ServerConn>();
    sc->server = this;
    sc->peer = c->peer_address();
    sc->conn = std::move(c);
    sc->accepted = sc->quiet_since = absl::Now();
    size_t open;
    absl::Status refill;
    {
      std::lock_guard<std::mutex> lock(mu);
      open = admitted;
      // Over the limit: one receive for the hello, answered with the refusal (HandleFrame).
      sc->refused = options.max_connections > 0 && admitted >= options.max_connections;
      if (!sc->refused) ++admitted;
      const uint64_t id = sc->conn->id();
      {
        std::lock_guard<std::mutex> cl(sc->mu);
        refill = sc->RefillLocked();
      }
      conns.emplace(id, sc);
    }
    if (!refill.ok()) {  // the client went before its first receive was posted
      Kill(sc, refill);
      return;
    }
    if (sc->refused && sc->accepted - logged >= absl::Seconds(1)) {
      base::Logf(base::LogLevel::kWarning,
                 "plexus rpc server %s: refusing the connection from %s: %zu connections "
                 "open, the limit (ServerOptions::max_connections); %d more refused since "
                 "the last such line",
                 address, sc->peer, open, static_cast<int>(unlogged));
      logged = sc->accepted;
      unlogged = 0;
    } else if (sc->refused) {
      ++unlogged;
    }
  });
}

void ServerCore::Kill(const std::shared_ptr<ServerConn>& sc, const absl::Status& why) {
  (void)why;
  std::vector<std::shared_ptr<ServerCallImpl>> calls;
  {
    std::lock_guard<std::mutex> lock(sc->mu);
    if (sc->dead) return;
    sc->dead = true;  // nothing is posted on it any more; Reap closes it
    for (auto& [id, w] : sc->active) {
      if (auto c = w.lock()) calls.push_back(c);
    }
  }
  for (auto& c : calls) c->Cancel();
  {
    std::lock_guard<std::mutex> lock(mu);
    conns.erase(sc->conn->id());
    if (!sc->refused) --admitted;
    conns_epoch.fetch_add(1, std::memory_order_release);
  }
  {
    std::lock_guard<std::mutex> lock(reap_mu);
    to_close.push_back(sc);
  }
  reap_cv.notify_one();
}

absl::Duration ServerCore::SweepEvery() const {
  // A quarter of the shortest timeout, so that a connection goes within 1.25 times it; at most
  // once a second, at least every 10 ms.
  const absl::Duration shortest = std::min(options.idle_timeout, options.frame_timeout);
  return std::clamp(shortest / 4, absl::Milliseconds(10), absl::Seconds(1));
}

void ServerCore::Reap() {
  // Closing a connection takes the transport's lock and fails its operations: thousands at once
  // go in batches with a pause between them, so that other connections' calls keep flowing.
  constexpr size_t kCloseBatch = 64;
  constexpr absl::Duration kBetweenBatches = absl::Milliseconds(1);
  const absl::Duration every = SweepEvery();
  absl::Time next_sweep = absl::Now() + every;
  std::vector<std::shared_ptr<ServerConn>> batch;
  std::unique_lock<std::mutex> lock(reap_mu);
  for (;;) {
    if (to_close.empty() && !reap_stop) {
      reap_cv.wait_until(lock, absl::ToChronoTime(next_sweep));
    }
    const size_t n = std::min(to_close.size(), kCloseBatch);
    batch.assign(std::make_move_iterator(to_close.begin()),
                 std::make_move_iterator(to_close.begin() + static_cast<std::ptrdiff_t>(n)));
    to_close.erase(to_close.begin(), to_close.begin() + static_cast<std::ptrdiff_t>(n));
    const bool more = !to_close.empty();
    const bool stopping = reap_stop;
    lock.unlock();
    for (auto& sc : batch) {
      sc->conn->Close();
      std::vector<std::shared_ptr<ServerCallImpl>> unsent;
      {
        std::lock_guard<std::mutex> conn_lock(sc->mu);
        unsent = sc->TakeUnsentLocked();
      }
      for (auto& call : unsent) call->Sent();  // the policies see them end
    }
    batch.clear();  // mostly the last references: the connections are freed here
    if (stopping && !more) return;
    if (more) absl::SleepFor(kBetweenBatches);
    if (const absl::Time now = absl::Now(); now >= next_sweep && !stopping) {
      Sweep(now);
      next_sweep = now + every;
    }
    lock.lock();
  }
}

void ServerCore::Sweep(absl::Time now) {
  std::vector<std::shared_ptr<ServerConn>> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    all.reserve(conns.size());
    for (auto& [id, sc] : conns) all.push_back(sc);
  }
  for (auto& sc : all) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(sc->mu);
      if (sc->dead) continue;
      if (sc->requests != sc->requests_seen) {
        sc->requests_seen = sc->requests;
        sc->quiet_since = now;
      }
      const bool answered = sc->hello_done || sc->ack != nullptr;
      std::optional<absl::Time> since;
      if (!answered && now - sc->accepted > options.frame_timeout) {
        why = absl::StrCat("sent no handshake within ", absl::FormatDuration(options.frame_timeout),
                           " (ServerOptions::frame_timeout)");
      } else if (sc->posted > 0 && (since = sc->conn->ReceivingSince()) &&
                 now - *since > options.frame_timeout) {
        why = absl::StrCat("a message began to arrive ", absl::FormatDuration(now - *since),
                           " ago and is not whole (ServerOptions::frame_timeout: ",
                           absl::FormatDuration(options.frame_timeout), ")");
      } else if (sc->hello_done && sc->active.empty() && sc->held == 0 && sc->sending.empty() &&
                 sc->outbox.empty() && now - sc->quiet_since > options.idle_timeout) {
        why = absl::StrCat(
            "idle for ", absl::FormatDuration(now - sc->quiet_since),
            " (ServerOptions::idle_timeout: ", absl::FormatDuration(options.idle_timeout), ")");
      }
    }
    if (why.empty()) continue;
    base::Logf(base::LogLevel::kWarning, "plexus rpc server %s: closing the connection from %s: %s",
               address, sc->peer, why);
    Kill(sc, absl::DeadlineExceededError(why));
  }
}

}  // namespace plexus::rpc::internal
