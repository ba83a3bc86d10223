// A small operator endpoint for managed datapaths (rpc engines today, collectives later): a TCP
// listener on a loopback address only, one token-authenticated request per connection, bounded in
// size and time, dispatched to named commands that each library registers. It knows nothing of
// rpc: a library adds commands with Handle() and answers with JSON text. One thread serves every
// connection at once (a poll loop, each connection with its own deadline), so that silent or
// slow clients cannot hold up another one's request.
//
// Wire: a request is a 4-byte big-endian length then that many bytes of JSON
//   {"token": "...", "command": "list", "args": {"key": "string value", ...}}
// and the reply is framed the same way:
//   {"ok": true, "result": <the command's JSON>}  or
//   {"ok": false, "code": "INVALID_ARGUMENT", "error": "..."}.
// A malformed, oversized or unauthenticated request gets an error reply and runs nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::base::admin {

struct AdminRequest {
  std::string token;
  std::string command;
  std::map<std::string, std::string> args;
};

inline constexpr size_t kDefaultMaxRequestBytes = 64 * 1024;

// Parses a request body (the JSON after the length prefix). InvalidArgument naming the field for
// anything but an object with a string "token", a non-empty string "command" (letters, digits,
// '-', '_'; at most 64) and an optional "args" object of string values; unknown fields are
// refused. Never throws (fuzzed: tests/fuzz/admin_request_fuzz.cpp).
absl::StatusOr<AdminRequest> DecodeRequest(std::string_view body);
// The request as JSON text (what DecodeRequest reads).
std::string EncodeRequest(const AdminRequest& request);
// For a command's handler: InvalidArgument naming the command, the first argument not in
// `allowed`, and the allowed ones; OK when every argument is allowed.
absl::Status CheckArgs(const AdminRequest& request,
                       std::initializer_list<std::string_view> allowed);

struct AdminOptions {
  // "127.0.0.1:0" picks a free port. Only loopback addresses are accepted.
  std::string address = "127.0.0.1:0";
  // Required, non-empty: every request must carry it.
  std::string token;
  size_t max_request_bytes = kDefaultMaxRequestBytes;
  // A client must send its whole request within this long (a silent one is dropped), and read
  // the reply within as long again.
  absl::Duration request_timeout = absl::Seconds(2);
  // Connections served at once. A connection arriving at the limit takes the place of the oldest
  // one still sending its request (dropped, logged); with every slot replying it is closed.
  size_t max_connections = 32;
};

class AdminServer {
 public:
  // The command's arguments -> its result as JSON text, or an error sent back as the reply.
  using Handler = std::function<absl::StatusOr<std::string>(const AdminRequest&)>;

  // Listens and starts the serving thread. InvalidArgument for a non-loopback address or an
  // empty token; the bind's error otherwise.
  static absl::StatusOr<std::unique_ptr<AdminServer>> Start(AdminOptions options);
  ~AdminServer();  // stops the thread and closes the listener
  // Adds (or replaces) a command; `help` is what the built-in "help" command lists.
  void Handle(std::string command, std::string help, Handler handler);
  // Removes a command; when it returns, no handler of it runs any more.
  void Remove(const std::string& command);
  std::string address() const;  // "127.0.0.1:port"

  // Runs one decoded-and-authenticated request (the serving thread's path, for tests): the reply
  // JSON text. Exposed so that fuzzing and tests reach the dispatcher without sockets.
  std::string Dispatch(std::string_view body);

 private:
  AdminServer() = default;
  void Serve();

  AdminOptions options_;
  int listen_fd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex run_mu_;  // held while a handler runs (Remove waits for it)
  std::mutex mu_;
  std::map<std::string, std::pair<std::string, Handler>> handlers_;
};

// Sends one request to an AdminServer and returns the result's JSON text, or the error the server
// answered (its code and message), or a transport error naming the address.
absl::StatusOr<std::string> AdminCall(std::string_view address, const AdminRequest& request,
                                      absl::Duration timeout = absl::Seconds(10),
                                      size_t max_reply_bytes = 16 << 20);

}  // namespace plexus::base::admin
