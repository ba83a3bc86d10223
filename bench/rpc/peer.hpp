// What the processes of plexus-bench-rpc share: the Plexus peer (plexus-bench-rpc --role ...) and
// the gRPC peer (plexus-bench-rpc-grpc) take the same options and print the same lines, so that
// the orchestrator runs every system the same way.
//
//   server: prints "address <addr>" once it listens, serves until SIGTERM.
//   client: prints "result ok=N failed=N wrong=N seconds=S rate=R goodput=B median_us=M
//           p99_us=P" (and base_rate=R0 and pair_cost=C when it measured a policy against no
//           policy); `wrong` counts replies whose payload is not the echo of the request's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/tooling/cli.hpp"

namespace plexus::benchrpc {

using Clock = std::chrono::steady_clock;

struct PeerArgs {
  std::string role;     // "server" or "client" (the Plexus peer also: raw-server, raw-client)
  int cpu = -1;         // pin the process to this CPU (-1: not pinned)
  std::string address;  // client: the server's
  std::string mode = "latency";  // client: "latency" (calls one after another) or "rate"
  uint32_t size = 64;            // request payload bytes
  uint32_t reply = 64;           // reply payload bytes
  int inflight = 1;              // rate: calls kept in flight
  double seconds = 1.0;          // measured time, after a warm-up of a fifth of it
  double deny_percent = 0;       // this share of requests carry tag "deny" (the ACL's denied value)
  // Raw TCP peers: poll the socket for up to this long (non-blocking reads) before a blocking
  // read, as Plexus's waits spin before they sleep: the floor under the same waiting policy.
  double spin_us = 0;
};

// --role, --cpu, --address, --mode, --size, --reply, --inflight, --seconds, --deny-percent.
void AddPeerOptions(CLI::App* app, PeerArgs* args);

// Servers: blocks SIGTERM and SIGINT (call before starting threads), then waits for one.
void BlockTermSignals();
void WaitForTermSignal();
void PublishAddress(std::string_view address);

// Whether call number `i` carries the denied tag (every 100/percent-th call, deterministic).
bool Denied(uint64_t i, double percent);

// Request payloads carry byte j = j mod 251 (a prime, so no power-of-two period hides a misplaced
// block), and every reply is checked against the echo the server owes: the first `reply` bytes
// of the request (all of them up to 4 KiB, the first and last 64 beyond, so that checking does
// not dominate a large reply's time).
// Servers check each request with PayloadMatches and say so in EchoReply.request_ok; clients
// check the reply's payload with ReplyMatches.
std::string RequestPayload(uint32_t size);
bool PayloadMatches(const void* data, size_t size);
bool ReplyMatches(const void* data, size_t size, uint32_t request_bytes, uint32_t reply_bytes);

// Counts of a client run; latency_us is filled in latency mode.
struct ClientResult {
  std::vector<double> latency_us;
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t wrong = 0;  // ok calls whose request or reply was not as sent
  uint64_t bytes = 0;  // request payload bytes of the ok calls
  double seconds = 0;
  double base_rate = -1;  // >= 0: printed as base_rate= (the rate without the policy)
  // Finite: printed as pair_cost= (the policy's cost, median over adjacent window pairs).
  double pair_cost = std::numeric_limits<double>::quiet_NaN();
};
void PrintResult(ClientResult result);

// The phases of a client run: warm-up, measurement, stop.
class Phases {
 public:
  explicit Phases(double seconds);
  // True while the measured window is open (at `now`).
  bool Measuring(Clock::time_point now) const { return now >= begin_ && now < end_; }
  bool Over(Clock::time_point now) const { return now >= end_; }
  Clock::time_point begin() const { return begin_; }
  Clock::time_point end() const { return end_; }
  double seconds() const;

 private:
  Clock::time_point begin_, end_;
};

}  // namespace plexus::benchrpc
