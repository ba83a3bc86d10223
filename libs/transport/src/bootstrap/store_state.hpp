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
  // naming no job may learn from the hello's reply; `address` appears in refusals.
  StoreState(std::string job_id, bool job_id_is_nonce, std::string address);

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
  // Empty when a client of job `client_job` may use this store, else why not.
  std::string CheckJob(const std::string& client_job) const;

 private:
  struct Parked {
    Request request;
    absl::Time deadline;
  };
  bool AllPresent(const std::vector<std::string>& keys) const;
  Response Satisfied(const Request& req) const;
  Response TimedOut(const Request& req) const;
  void CompleteParked();

  std::string job_id_;
  bool job_id_is_nonce_;
  std::string address_;
  absl::flat_hash_map<std::string, std::string> data_;
  absl::flat_hash_map<int, Parked> parked_;
  std::vector<std::pair<int, Response>> completed_;
};

}  // namespace plexus::transport::store_protocol
