// plexus-bench-rpc's driver: runs one measurement as a server process and a client process (this
// program with --role, or plexus-bench-rpc-grpc), and reads the client's result line (peer.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "peer.hpp"

namespace plexus::benchrpc {

// A client's result line.
struct Sample {
  double rate = 0, base_rate = 0, goodput = 0, median_us = 0, p99_us = 0;
  double pair_cost = NAN;                  // a policy's cost: median over adjacent window pairs
  uint64_t ok = 0, failed = 0, wrong = 0;  // wrong: replies that were not the echo
  std::map<std::string, double> upgrade;   // --policy upgrade: the "upgrade" line's fields
  // With Orchestrator::split: each side's time between its socket system calls per round trip
  // (its user-space work; syscall_clock.cpp), in us.
  double client_user_us = NAN, server_user_us = NAN;
};

// Where the two processes run: pinned to a CPU each, or -1 (not pinned).
struct Layout {
  std::string name;
  int server_cpu, client_cpu;
};

struct Orchestrator {
  std::string self, grpc_peer;
  PeerArgs base;
  // Preload libplexus_syscall_clock.so (next to `self`) into both peers and fill the Sample's
  // user-space times. For peers that make their socket calls on one thread (raw-tcp, Plexus in
  // ProgressMode::kCaller).
  bool split = false;

  // system: "plexus-tcp", "plexus-tcp-thread", "plexus-shm", "grpc", "raw-tcp" (blocking reads),
  // "raw-tcp-spin" (reads poll 50 us first, as Plexus's waits).
  Sample Run(const std::string& system, const Layout& layout, const std::string& mode,
             uint32_t size, uint32_t reply, int inflight, const std::string& policy = "none",
             double deny_percent = 0);
};

}  // namespace plexus::benchrpc
