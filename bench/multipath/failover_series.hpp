// The benchmark's failover measurements that do not depend on the multipath channel: a verified
// kernel-MPTCP byte stream across the netbed (for the failover trials and the timeline), the
// receive byte counters of the bed's path interfaces sampled over time, and the outage (longest
// gap in delivered bytes) and goodput-over-time computations both systems share.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "netbed.hpp"

namespace plexus::mpbench {

// `bytes` reached the receiving application at `at`.
struct Delivery {
  absl::Time at;
  uint64_t bytes = 0;
};

// The longest time within [t0, t1] without a delivery; the window's ends count, so a stream that
// stops for good at t yields t1 - t.
absl::Duration LongestGap(const std::vector<Delivery>& deliveries, absl::Time t0, absl::Time t1);

// The deliveries of a byte stream regrouped as messages of `message_bytes` (from the stream's
// start): one delivery per message, when its last byte arrived. What an application reading
// whole messages sees; the multipath channel delivers whole messages, so outages compare on this.
std::vector<Delivery> MessageDeliveries(const std::vector<Delivery>& deliveries,
                                        uint64_t message_bytes);

// Bytes delivered within [t0, t1], as Mbit/s over the window.
double GoodputMbit(const std::vector<Delivery>& deliveries, absl::Time t0, absl::Time t1);

struct MptcpResult {
  absl::Time window_start, window_end;  // the measured window (after the warmup)
  double mbit = 0;                      // goodput over the window
  absl::Duration longest_gap;           // outage: longest time without delivered bytes
  uint64_t sent = 0;                    // bytes the sender's socket accepted
  uint64_t received = 0;                // bytes the receiver read, after draining to EOF
  uint64_t corrupt_bytes = 0;           // received bytes that differ from the stream sent
  bool drained = false;                 // the receiver saw EOF before the drain deadline
  std::string error;                    // a socket error on either side, if any
  // Additional subflows (MPTCP_INFO, not counting the initial one) just before the event and
  // at the window's end; -1 when unknown.
  int subflows_before_event = -1, subflows_at_end = -1;
  std::vector<Delivery> deliveries;
  uint64_t lost() const { return sent > received ? sent - received : 0; }
};

// One kernel MPTCP connection from side a to side b, opened on path 1 (10.77.1.1 ->
// 10.77.1.2); the bed's in-kernel path manager (netbed `mptcp`, run before) adds one subflow per
// other path. The sender writes a byte stream of consecutive 64-bit counters, the receiver checks
// every byte. After a 0.7 s warmup (slow start, subflows joining) the window runs `seconds`;
// `event`, when set, runs `event_at` seconds into it (its own run time lengthens the window).
// Then the sender half-closes and the receiver drains to EOF (at most `drain` longer), so bytes
// the connection never delivered count as lost.
absl::StatusOr<MptcpResult> MptcpStream(netbed::Bed& bed, double seconds,
                                        const std::function<void()>& event = nullptr,
                                        double event_at = 0,
                                        absl::Duration drain = absl::Seconds(10));

// The receive byte counters of side b's path interfaces (mpb1..mpbK: the bytes each path
// delivered, headers and retransmissions included), read every `interval` from
// /proc/thread-self/net/dev inside the namespace until Stop().
class WireSampler {
 public:
  struct Sample {
    absl::Time at;
    std::vector<uint64_t> rx_bytes;  // per path, index k-1 for path k
  };
  // Reads once (so a bed without the interfaces fails here) and starts the sampling thread.
  static absl::StatusOr<std::unique_ptr<WireSampler>> Start(const netbed::Bed& bed,
                                                            absl::Duration interval);
  ~WireSampler();
  // Stops the thread; returns the samples and the first read error, if any.
  absl::StatusOr<std::vector<Sample>> Stop();

 private:
  WireSampler() = default;
  std::string ns_;
  size_t paths_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Sample> samples_;
  absl::Status error_;
};

// Reads the receive byte counters of interfaces `prefix`1..`prefix`K in network namespace `ns`.
absl::StatusOr<std::vector<uint64_t>> ReadRxBytes(const std::string& ns, const std::string& prefix,
                                                  size_t paths);

// One point of a timeline: per path, the Mbit/s the wire delivered over the interval ending at
// t_s (seconds from the window's start), and the application's goodput over the same interval.
struct TimelinePoint {
  double t_s = 0;
  std::vector<double> path_mbit;
  double goodput_mbit = 0;
};
std::vector<TimelinePoint> Timeline(const std::vector<WireSampler::Sample>& samples,
                                    const std::vector<Delivery>& deliveries, absl::Time start,
                                    absl::Time end);

}  // namespace plexus::mpbench
