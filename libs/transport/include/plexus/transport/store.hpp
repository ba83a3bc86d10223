// Key-value stores for rendezvous: ranks publish their addresses and wait for each other's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace plexus::transport {

// Limits every store enforces (InvalidArgument beyond them), so that a peer can never make
// another allocate without bound.
inline constexpr size_t kMaxStoreKeyBytes = 4096;
inline constexpr size_t kMaxStoreValueBytes = size_t{64} << 20;
// Job identities (launcher job ids, PLEXUS_JOB_ID, nonces) are at most this long.
inline constexpr size_t kMaxJobIdBytes = 256;

// A key-value store shared by the ranks of a job. Keys are non-empty byte strings of at most
// kMaxStoreKeyBytes; values are arbitrary bytes. Every method is thread-safe. Errors name the key
// and the store (description()) so that a user can tell which rank or file is missing.
class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing an older value, and wakes every waiter on it.
  virtual absl::Status Set(std::string_view key, std::string_view value) = 0;
  // The value of `key`, waiting until some rank sets it; DeadlineExceeded naming the key after
  // `timeout`.
  virtual absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) = 0;
  // Atomically adds `delta` to the counter at `key` (absent counts as 0) and returns the new
  // value. Counters are stored as decimal text, so Get() of a counter returns e.g. "3";
  // InvalidArgument when the key holds something else or the sum overflows.
  virtual absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) = 0;
  // Waits until every key exists; DeadlineExceeded naming the missing keys after `timeout`.
  virtual absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;
  // Whether every key exists now (true for no keys).
  virtual absl::StatusOr<bool> Check(absl::Span<const std::string> keys) = 0;
  // Removes `key`; true when it existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
  // Where the store lives, for messages: "tcp store at 10.0.0.1:29500", "file store at /dir".
  virtual std::string description() const = 0;
};

// A view of `inner` in which every key is prefixed with `prefix` (an empty key stays empty and is
// refused as usual), so that separate phases or groups of a job sharing one store never meet each
// other's keys. description() is the inner one followed by " (<label>)", or by the prefix when
// `label` is empty.
std::shared_ptr<Store> PrefixStore(std::shared_ptr<Store> inner, std::string prefix,
                                   std::string label = "");

// Failure reports. A rank whose job failed (a communicator that aborted, say) records it in the
// job's store with ReportJobFailure; the store server (rank 0's) then knows that the job failed
// (TcpStoreServer::job_failed), and rank 0's Rendezvous stops waiting at exit for ranks that will
// not come to leave the store (a stopped or hung one). The key is
// "<prefix of `store`>plexus/failed/<rank>", whatever prefixes the view adds.
inline constexpr std::string_view kJobFailedSegment = "plexus/failed/";
// Whether `key` is such a report (kJobFailedSegment at its start or after a '/').
bool IsJobFailureKey(std::string_view key);
absl::Status ReportJobFailure(Store& store, int rank, std::string_view why);

// The server side of TcpStore: one thread (epoll) serving any number of clients up to a limit.
// A client that sends a malformed, truncated or oversized frame, stays idle too long, or would
// push the input buffered across all clients over the memory cap is disconnected (the reason
// logged, base::Log); the others are served on.
class TcpStoreServer {
 public:
  struct Options {
    // Unset: the environment (PLEXUS_STORE_MAX_CLIENTS, PLEXUS_STORE_IDLE_TIMEOUT,
    // PLEXUS_STORE_MAX_BUFFERED), else the default. An explicit value beats the environment.
    // Connections served at once (default 4096); one more is answered "refused" and closed.
    std::optional<int64_t> max_clients;
    // A client with no request in service that sends nothing for this long is closed (default
    // 10 min; InfiniteDuration: never). TcpStore reopens a connection the server closed.
    std::optional<absl::Duration> idle_timeout;
    // Bytes of partly received requests buffered across all clients (default 1 GiB; at least
    // one maximal frame). The client whose input would exceed it is dropped.
    std::optional<uint64_t> max_buffered_bytes;
    // Bytes of keys and values held, each key counted with 64 bytes of overhead (default
    // 256 MiB, PLEXUS_STORE_MAX_BYTES; at least one maximal value). A Set or Add that would go
    // over it is refused: the client's call returns ResourceExhausted naming the key, the size
    // and the cap, and the store keeps what it held.
    std::optional<uint64_t> max_store_bytes;
    // The job this store serves: a client whose Hello names another job is refused with a
    // message naming both. Empty: any client is served. A nonce job (chosen by rank 0 when the
    // launcher gives no job id) also serves clients that name no job, and tells them the nonce.
    std::string job_id;
    bool job_id_is_nonce = false;
  };

  // Listens on "ip:port", "host:port", "[ipv6]:port" or ":port" (all interfaces); port 0 picks
  // a free ephemeral port. "" means ":0". InvalidArgument for an invalid option or environment
  // value.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(std::string_view address,
                                                               const Options& options);
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(std::string_view address);
  // Stops serving and closes every client connection (their pending calls fail at once).
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound address as "ip:port" with the actual port ("0.0.0.0:port" when on every
  // interface; clients on this host may connect to "127.0.0.1:port").
  std::string address() const;
  uint16_t port() const;
  // Clients connected right now; clients dropped so far for protocol violations, idleness or
  // the memory cap; connections refused (client limit, another job).
  size_t connected_clients() const;
  // Connections accepted so far (those refused at the client limit not counted).
  size_t accepted_clients() const;
  size_t dropped_clients() const;
  size_t refused_clients() const;
  // Bytes of partly received requests buffered right now, across all clients.
  uint64_t buffered_bytes() const;
  // The limits in effect (options, environment or defaults).
  int64_t max_clients() const;
  absl::Duration idle_timeout() const;
  uint64_t max_buffered_bytes() const;
  uint64_t max_store_bytes() const;
  // Bytes of keys and values held right now (as counted against max_store_bytes).
  uint64_t stored_bytes() const;
  // Whether a client reported its job failed (ReportJobFailure).
  bool job_failed() const;

  struct Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client of a TcpStoreServer. Calls made concurrently from several threads each use their
// own socket (a small pool), so a thread blocked in Get() never delays another thread's Set().
class TcpStore : public Store {
 public:
  // Connects to the server at "host:port", retrying while it is not up yet (ranks start in any
  // order); DeadlineExceeded naming the address after `timeout`. `io_timeout` bounds how long a
  // reply may take beyond the caller's own timeout, so that a hung server gives an error.
  // `job_id` is this client's job identity (empty: none); a server of another job refuses it
  // with FailedPrecondition naming both jobs, a server at its client limit with
  // ResourceExhausted.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(
      std::string_view address, absl::Duration timeout,
      absl::Duration io_timeout = absl::Seconds(30), std::string_view job_id = {});
  ~TcpStore() override;

  // The job the server said it serves (empty: any), and whether it is rank 0's nonce. Later
  // connections of this client name that job, so that a server replaced by another job's (a
  // new process on the same port) is refused rather than silently used.
  const std::string& server_job_id() const;
  bool server_job_id_is_nonce() const;

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  std::string description() const override;

  struct Impl;

 private:
  explicit TcpStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A client of the store torchrun's agent serves at MASTER_ADDR:MASTER_PORT (torch 1.13's c10d
// TCPStore protocol, as Debian 12's python3-torch speaks it), so that a program started by
// torchrun meets its peers there instead of binding a port of its own. Keys are used as given
// (torch's own Python clients prefix theirs with "/"). Like TcpStore, concurrent calls use their
// own sockets. torch's server answers a malformed request, or an Add on a key that holds no
// counter, by closing the connection; a Get or Wait that times out closes its socket (torch 1.13
// has no way to cancel a wait).
class TorchStore : public Store {
 public:
  // Connects to "host:port", retrying while nothing listens there yet, and checks that the
  // server answers torch's protocol: FailedPrecondition naming the address when it does not
  // (another program, a plexus store, or a torch whose protocol differs), DeadlineExceeded after
  // `timeout`. `io_timeout` bounds each reply beyond the caller's own timeout.
  static absl::StatusOr<std::unique_ptr<TorchStore>> Connect(
      std::string_view address, absl::Duration timeout,
      absl::Duration io_timeout = absl::Seconds(30));
  ~TorchStore() override;

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  std::string description() const override;

  struct Impl;

 private:
  explicit TorchStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A store in an existing etcd cluster (etcd 3.4 or later, through the v3 JSON gateway every
// etcd serves on its client port): it outlives every rank, so an elastic job survives the loss
// of any of them, rank 0 included. Keys live under `prefix` (Rendezvous uses one per job id, so
// jobs sharing an etcd never meet). Set ties its key to this process's lease (a TTL kept alive
// by a thread): when the process dies, or destroys the store, its keys expire within the TTL (not
// at once: a peer may still be reading the last ones it set). Counters (Add: a compare-and-swap
// transaction, retried) are the job's and have no lease. Get and Wait poll (1 ms, doubling to 50
// ms). A value must fit etcd's request limit (--max-request-bytes, 1.5 MiB by default): etcd's
// refusal names it.
class EtcdStore : public Store {
 public:
  struct Options {
    std::string address;                            // "host:port" of an etcd client endpoint
    std::string prefix;                             // prepended to every key
    absl::Duration lease_ttl = absl::Seconds(10);   // at least 2 s (etcd's minimum)
    absl::Duration io_timeout = absl::Seconds(10);  // bounds each request's answer
  };
  // Grants this process's lease, retrying while etcd is not up yet: Unavailable or
  // DeadlineExceeded naming the address after `timeout`.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Connect(Options options,
                                                            absl::Duration timeout);
  ~EtcdStore() override;

  // Set, after this process's lease expired (it stalled past the TTL): FailedPrecondition.
  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  std::string description() const override;

  int64_t lease_id() const;

  struct Impl;

 private:
  explicit EtcdStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A store in a directory shared by the ranks (local disk, or NFS for several hosts). Each key is
// one file, written atomically (temporary file + rename); Get and Wait poll with backoff; Add
// holds an flock on the directory's lock file. Use a fresh directory per job: keys left by an
// earlier job would be read as this job's.
class FileStore : public Store {
 public:
  // Opens (creating it when missing) `directory`; an error when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(std::string directory);
  ~FileStore() override;

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  std::string description() const override;

  const std::string& directory() const { return directory_; }

 private:
  FileStore(std::string directory, int lock_fd)
      : directory_(std::move(directory)), lock_fd_(lock_fd) {}
  absl::StatusOr<std::string> PathOf(std::string_view key) const;

  std::string directory_;
  int lock_fd_;
  std::mutex add_mu_;  // flock excludes processes; this excludes threads sharing lock_fd_
};

}  // namespace plexus::transport
