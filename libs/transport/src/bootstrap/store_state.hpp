// The tcp store's contents and request semantics, without sockets: what the server does with one
// decoded request of one client, and which parked requests a change or the clock completes. The
// server (tcp_store_server.cpp) owns sockets and buffers and calls this from its one thread.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "bootstrap/store_protocol.hpp"

namespace plexus::transport::store_protocol {

class StoreState {
 public:
  // The job the store serves (empty: any) and whether that id is rank 0's nonce, which a client
  // naming no job may learn from the hello's reply; `address` appears in refusals. The keys and
  // values held stay within `max_bytes` (each key counted with kEntryOverheadBytes).
  StoreState(std::string job_id, bool job_id_is_nonce, std::string address,
             uint64_t max_bytes = kDefaultMaxStoreBytes);

  // What one key costs beyond its key and value bytes, in the cap's accounting.
  static constexpr uint64_t kEntryOverheadBytes = 64;

  struct Outcome {
    std::optional<Response> reply;  // none: a Get/Wait was parked until its keys or deadline
    bool hello_accepted = false;    // a hello of the right version and job
    std::string refusal;            // non-empty: the hello named another job; close after reply
  };
  // Handles request `req` of client `client`, which must not have a parked request.
  Outcome Handle(int client, Request req, absl::Time now);
  // The parked requests that the last Handle completed (a Set or Add made their keys present),
  // with their replies; empty when none.
  std::vector<std::pair<int, Response>> TakeCompleted();
  // The parked requests whose deadline is at or before `now`, answered with a time-out.
  std::vector<std::pair<int, Response>> Expire(absl::Time now);

  bool parked(int client) const { return parked_.contains(client); }
  // The earliest deadline of a parked request (InfiniteFuture: none).
  absl::Time next_deadline() const;
  // A client that went away: its parked request is dropped.
  void Forget(int client) { parked_.erase(client); }

  // The job this store serves; empty: any.
  const std::string& job_id() const { return job_id_; }
  // Empty when a client of job `client_job` may use this store, else why not. The reason never
  // names the job this store serves: a client that does not know it must not learn it.
  std::string CheckJob(const std::string& client_job) const;

  // Bytes held (keys, values and kEntryOverheadBytes per key), and the cap.
  uint64_t bytes() const { return bytes_; }
  uint64_t max_bytes() const { return max_bytes_; }

  // Whether a rank reported its job failed: a key whose path holds kJobFailedSegment was set
  // (ReportJobFailure in plexus/transport/store.hpp), and the first such key.
  bool job_failed() const { return !failed_key_.empty(); }
  const std::string& failed_key() const { return failed_key_; }

 private:
  struct Parked {
    Request request;
    absl::Time deadline;
  };
  bool AllPresent(const std::vector<std::string>& keys) const;
  Response Satisfied(const Request& req) const;
  Response TimedOut(const Request& req) const;
  void CompleteParked();
  // Ok when storing `value` under `key` keeps the store within its cap, else the kFull reply's
  // message naming the key, the sizes and the cap.
  std::string CheckRoom(const std::string& key, size_t value_bytes) const;
  void Store(const std::string& key, std::string value);

  std::string job_id_;
  bool job_id_is_nonce_;
  std::string address_;
  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::string failed_key_;
  absl::flat_hash_map<std::string, std::string> data_;
  absl::flat_hash_map<int, Parked> parked_;
  std::vector<std::pair<int, Response>> completed_;
};

}  // namespace plexus::transport::store_protocol
