// The processes plexus-bench-rpc runs with --role: the Plexus server and client on echo.proto
// (tcp or shm, a policy on the client's chain, live upgrades) and the raw TCP ping-pong floor.
// Each prints the lines peer.hpp describes; the orchestrator (orchestrator.hpp) starts them.
#pragma once

#include <string>

#include "peer.hpp"

namespace plexus::benchrpc {

// Options of the Plexus peer beyond peer.hpp's.
struct PlexusArgs {
  std::string transport = "tcp";    // tcp or shm
  std::string progress = "thread";  // the transport's ProgressMode: thread or caller
  // Client chain: none, noop, ratelimit (infinite rate), acl, tagcheck or tagcheck_in_place.
  std::string policy = "none";
};

// "plexus-bench-rpc: <what>" on stderr, then exits with 1 (no cleanup: a bench process).
[[noreturn]] void Die(const std::string& what);

// The chain's own cost, in process: `threads` threads pass one shared chain holding `policy`
// (none, noop, ratelimit, acl or tagcheck: each engine's OnRequest and OnComplete, on a decoded
// request as on a Server) for `seconds`; the mean ns per call of a thread.
double ChainNsPerCall(const std::string& policy, int threads, double seconds);

int PlexusServer(const PlexusArgs& x);
int PlexusClient(const PeerArgs& a, const PlexusArgs& x);
// A ping-pong of `size` bytes each way (plus an 8-byte size header): the floor. Its reads block,
// or with --spin-us poll first for that long, as Plexus's waits do.
int RawServer(const PeerArgs& a);
int RawClient(const PeerArgs& a);

}  // namespace plexus::benchrpc
