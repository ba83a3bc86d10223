// Latency probing over the transport (Cloud Collectives, seed 001 §5.2.2): every pair of ranks
// measures its round-trip time in a round-robin tournament of disjoint pairs, so that no rank
// serves two probes at once; docs/collectives.md, "Latency prober".
//
//   auto rdv = plexus::transport::Rendezvous::FromEnv();
//   auto matrix = plexus::collectives::ProbeLatency(*rdv, {});   // the same matrix on every rank
//   auto order = plexus::netmodel::Reorder(*matrix, {});
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/netmodel/topology.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::collectives {

struct ProbeOptions {
  transport::Backend backend = transport::Backend::kTcp;
  std::string local_address;  // tcp: the local IP to probe from ("" = any)
  // Timed round trips per direction of each pair, after `warmup` untimed ones.
  int probes = 200;
  int warmup = 20;
  // The statistic of a direction's round trips (the seed takes the 10th percentile: the RTT
  // without queueing).
  double percentile = 0.10;
  // Subtract the ranks' own stack cost: each rank times round trips between two connections to
  // itself (a loopback), and a pair's RTT loses the mean of its two ranks' loopback RTTs.
  bool subtract_self = true;
  // Each wait for a peer (connecting, every echo, gathering the rows) is bounded by this; a
  // silent peer fails the probe with DeadlineExceeded naming the pair and the round.
  absl::Duration timeout = absl::Seconds(10);
  // Names the connection mesh in the rendezvous store (distinct probes of one job need distinct
  // tags).
  std::string tag = "plexus/probe";
  // Called after each round on every rank (round in 1..rounds); may be empty.
  std::function<void(int round, int rounds)> progress = nullptr;
};

// Collective over the ranks of `rendezvous`: returns, on every rank, the n x n matrix of
// symmetrised round-trip latencies in microseconds (entry i,j = the larger of i's and j's
// percentile RTT to each other, less the loopback cost when subtract_self; never below 0),
// labelled with each rank's host name.
absl::StatusOr<netmodel::CostMatrix> ProbeLatency(transport::Rendezvous& rendezvous,
                                                  const ProbeOptions& options = {});

// The matrix from the measurements: rtt_us[i*n + j] is rank i's percentile RTT to rank j,
// self_us[i] rank i's loopback RTT. Entry i,j = max(rtt_ij, rtt_ji), less (self_i + self_j) / 2
// when subtract_self, never below 0; the diagonal is 0.
netmodel::CostMatrix LatencyMatrixFromRtts(std::vector<std::string> labels,
                                           const std::vector<double>& rtt_us,
                                           const std::vector<double>& self_us, bool subtract_self);

// The tournament: n - 1 rounds for even n, n for odd n (one rank sits each round out), each a
// set of disjoint pairs (a < b); every pair of 0..n-1 meets exactly once (circle method).
std::vector<std::vector<std::pair<int, int>>> TournamentRounds(int n);

// The p-quantile (0..1) of `samples` by nearest rank; 0 for no samples.
double Percentile(std::vector<double> samples, double p);

}  // namespace plexus::collectives
