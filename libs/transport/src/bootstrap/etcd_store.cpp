// EtcdStore: the job's keys in an existing etcd cluster (store.hpp), over the v3 JSON gateway
// (bootstrap/etcd_protocol.hpp). One request in flight per socket; concurrent callers take
// sockets from a pool, and a socket whose request failed is closed, never reused.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bootstrap/etcd_protocol.hpp"
#include "bootstrap/store_keys.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;

struct EtcdStore::Impl {
  Options options;
  net::SocketPool sockets;
  std::mutex mu;
  int64_t lease = 0;
  absl::Status lease_status;  // guarded by mu: why the lease is gone, once it is
  bool stop = false;          // guarded by mu
  std::condition_variable wake;
  std::thread keepalive;

  std::string Where() const { return absl::StrCat("etcd store at ", options.address); }
  std::string Full(std::string_view key) const {
    return absl::StrCat(options.prefix, std::string(key));
  }

  absl::Status Lost(const std::string& what, const absl::Status& why) const {
    if (absl::IsFailedPrecondition(why) || absl::IsDataLoss(why)) {
      return absl::Status(why.code(), absl::StrCat(what, " on the ", Where(), ": ", why.message()));
    }
    return absl::Status(absl::IsDeadlineExceeded(why) ? absl::StatusCode::kDeadlineExceeded
                                                      : absl::StatusCode::kUnavailable,
                        absl::StrCat(what, " on the ", Where(), " failed: ", why.message(),
                                     " (is etcd running and reachable there?)"));
  }

  // One POST and its answer on a pooled socket.
  absl::StatusOr<etcd::Json> Post(const std::string& path, const std::string& body,
                                  const std::string& what) {
    const absl::Time deadline = absl::Now() + options.io_timeout;
    auto fd = sockets.Take(deadline);
    if (!fd.ok()) return Lost(what, fd.status());
    const std::string request = etcd::EncodePost(options.address, path, body);
    absl::Status sent = net::SendAll(*fd, request.data(), request.size(), deadline);
    etcd::ResponseParser parser;
    char buffer[16384];
    while (sent.ok() && !parser.done()) {
      auto n = net::RecvSome(*fd, buffer, sizeof buffer, deadline);
      if (!n.ok()) {
        sent = n.status();
        break;
      }
      auto used = parser.Feed(absl::string_view(buffer, *n));
      if (!used.ok()) {
        sent = used.status();
      } else if (*used != *n) {
        sent = absl::DataLossError("etcd sent bytes after its answer");
      }
    }
    if (!sent.ok()) {
      close(*fd);
      return Lost(what, sent);
    }
    sockets.Give(*fd);
    auto j = etcd::ParseBody(parser.body(), parser.status(), what);
    if (!j.ok()) return Lost(what, j.status());
    return j;
  }

  absl::StatusOr<std::optional<etcd::KeyValue>> Range(std::string_view key,
                                                      const std::string& what) {
    PLEXUS_ASSIGN_OR_RETURN(etcd::Json j, Post("/v3/kv/range", etcd::RangeBody(Full(key)), what));
    auto kv = etcd::ParseRange(j);
    if (!kv.ok()) return Lost(what, kv.status());
    return kv;
  }

  absl::Status LeaseOk() {
    std::lock_guard<std::mutex> lock(mu);
    return lease_status;
  }

  // Renews the lease every third of its TTL until Close; a lease etcd no longer knows (this
  // process stalled past the TTL, or etcd lost it) is recorded, and later Sets fail with it.
  void KeepAlive() {
    const absl::Duration every = options.lease_ttl / 3;
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      wake.wait_for(lock, absl::ToChronoNanoseconds(every));
      if (stop) break;
      lock.unlock();
      auto j = Post("/v3/lease/keepalive", etcd::LeaseIdBody(lease), "renewing the lease");
      absl::Status why;
      if (j.ok()) {
        auto l = etcd::ParseLease(*j);
        if (!l.ok()) {
          why = l.status();
        } else if (l->ttl <= 0) {
          why = absl::FailedPreconditionError(
              absl::StrCat("this process's etcd lease ", lease,
                           " expired (the process was stalled, or etcd "
                           "was unreachable, longer than the lease TTL ",
                           absl::FormatDuration(options.lease_ttl), "): its keys are gone"));
        }
      }
      lock.lock();
      // A failed renewal is retried at the next tick; only an expired lease is final.
      if (!why.ok() && lease_status.ok()) lease_status = why;
    }
  }
};

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Connect(Options options,
                                                              absl::Duration timeout) {
  if (options.lease_ttl < absl::Seconds(2)) {
    return absl::InvalidArgumentError(absl::StrCat("EtcdStore: lease_ttl ",
                                                   absl::FormatDuration(options.lease_ttl),
                                                   " is below etcd's minimum lease of 2 s"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  PLEXUS_ASSIGN_OR_RETURN(net::SocketAddress resolved,
                          net::ResolveFirst(impl->options.address, "the etcd address"));
  impl->sockets.set_address(resolved);
  // etcd may still be starting: retry the first request until `timeout`.
  const absl::Time deadline = absl::Now() + timeout;
  base::Backoff backoff(absl::Milliseconds(10), absl::Milliseconds(500));
  absl::StatusOr<etcd::Json> granted;
  for (;;) {
    granted = impl->Post("/v3/lease/grant",
                         etcd::LeaseGrantBody(absl::ToInt64Seconds(impl->options.lease_ttl)),
                         "granting this process's lease");
    if (granted.ok() || !absl::IsUnavailable(granted.status())) break;
    if (!backoff.SleepBefore(deadline)) break;
  }
  if (!granted.ok()) return granted.status();
  auto lease = etcd::ParseLease(*granted);
  if (!lease.ok()) return impl->Lost("granting this process's lease", lease.status());
  impl->lease = lease->id;
  Impl* raw = impl.get();
  impl->keepalive = std::thread([raw] { raw->KeepAlive(); });
  return std::unique_ptr<EtcdStore>(new EtcdStore(std::move(impl)));
}

EtcdStore::EtcdStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EtcdStore::~EtcdStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (impl_->keepalive.joinable()) impl_->keepalive.join();
  // The lease is left to expire rather than revoked: a peer may still be reading what this
  // process set last (the value of an all-gather it has finished, say), and a revoked lease
  // would take it away at once.
}

int64_t EtcdStore::lease_id() const { return impl_->lease; }

absl::Status EtcdStore::Set(std::string_view key, std::string_view value) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value for key '", std::string(key), "' has ",
                                                   value.size(), " bytes; the limit is ",
                                                   kMaxStoreValueBytes));
  }
  const std::string what = absl::StrCat("setting key '", std::string(key), "'");
  if (absl::Status lease = impl_->LeaseOk(); !lease.ok()) return impl_->Lost(what, lease);
  return impl_
      ->Post("/v3/kv/put",
             etcd::PutBody(impl_->Full(key), absl::string_view(value.data(), value.size()),
                           impl_->lease),
             what)
      .status();
}

absl::StatusOr<std::string> EtcdStore::Get(std::string_view key, absl::Duration timeout) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string what = absl::StrCat("getting key '", std::string(key), "'");
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  base::Backoff backoff(absl::Milliseconds(1), absl::Milliseconds(50));
  for (;;) {
    PLEXUS_ASSIGN_OR_RETURN(auto kv, impl_->Range(key, what));
    if (kv.has_value()) return std::move(kv->value);
    if (!backoff.SleepBefore(deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("key '", std::string(key), "' not set within ",
                       absl::FormatDuration(timeout), " in the ", description()));
    }
  }
}

absl::StatusOr<int64_t> EtcdStore::Add(std::string_view key, int64_t delta) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string what = absl::StrCat("adding to counter '", std::string(key), "'");
  // Read, then write only if nobody wrote in between (the key's modification revision), else
  // read again: etcd has no increment, but its transactions make this atomic.
  for (int attempt = 0;; ++attempt) {
    PLEXUS_ASSIGN_OR_RETURN(auto kv, impl_->Range(key, what));
    int64_t current = 0;
    if (kv.has_value() && !absl::SimpleAtoi(kv->value, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", std::string(key), "' holds a value that is not a counter in the ",
                       description()));
    }
    if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
      return absl::InvalidArgumentError(
          absl::StrCat("counter '", std::string(key), "' would overflow in the ", description()));
    }
    const int64_t next = current + delta;
    PLEXUS_ASSIGN_OR_RETURN(
        etcd::Json j, impl_->Post("/v3/kv/txn",
                                  etcd::PutIfRevisionBody(impl_->Full(key), std::to_string(next),
                                                          kv.has_value() ? kv->mod_revision : 0),
                                  what));
    auto ok = etcd::ParseTxnSucceeded(j);
    if (!ok.ok()) return impl_->Lost(what, ok.status());
    if (*ok) return next;
    if (attempt > 1000) {
      return absl::AbortedError(
          absl::StrCat(what, " on the ", impl_->Where(), ": lost the race 1000 times in a row"));
    }
  }
}

absl::Status EtcdStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  base::Backoff backoff(absl::Milliseconds(1), absl::Milliseconds(50));
  size_t next = 0;  // keys before it were seen (keys never come back once set, in a job)
  for (;;) {
    while (next < keys.size()) {
      PLEXUS_ASSIGN_OR_RETURN(
          auto kv, impl_->Range(keys[next], absl::StrCat("waiting for key '", keys[next], "'")));
      if (!kv.has_value()) break;
      ++next;
    }
    if (next == keys.size()) return absl::OkStatus();
    if (!backoff.SleepBefore(deadline)) {
      std::vector<std::string> missing(keys.begin() + static_cast<std::ptrdiff_t>(next),
                                       keys.end());
      return absl::DeadlineExceededError(
          absl::StrCat("keys not set within ", absl::FormatDuration(timeout), " in the ",
                       description(), ": ", absl::StrJoin(missing, ", ")));
    }
  }
}

absl::StatusOr<bool> EtcdStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) {
    PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
    PLEXUS_ASSIGN_OR_RETURN(auto kv, impl_->Range(key, absl::StrCat("checking key '", key, "'")));
    if (!kv.has_value()) return false;
  }
  return true;
}

absl::StatusOr<bool> EtcdStore::Delete(std::string_view key) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string what = absl::StrCat("deleting key '", std::string(key), "'");
  PLEXUS_ASSIGN_OR_RETURN(
      etcd::Json j, impl_->Post("/v3/kv/deleterange", etcd::DeleteBody(impl_->Full(key)), what));
  auto deleted = etcd::ParseDeleted(j);
  if (!deleted.ok()) return impl_->Lost(what, deleted.status());
  return *deleted > 0;
}

std::string EtcdStore::description() const {
  return absl::StrCat(impl_->Where(), " (keys under '", impl_->options.prefix, "')");
}

}  // namespace plexus::transport
