// plexus-bench-multipath's shared pieces: the arguments, the bed's name, the channel options
// and the verified multipath stream (multipath_bench.cpp), and each section's entry point:
// throughput and failover (multipath_bench.cpp), the 2-rank allreduce (allreduce_bench.cpp), the
// kernel MPTCP failover trials and the failover timeline (mptcp_bench.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "multipath_bed.hpp"
#include "plexus/multipath/channel.hpp"
#include "plexus/tooling/figures.hpp"

namespace plexus::mpbench {

struct Args {
  bool json = false;
  bool compare = false;
  int runs = 5;
  double seconds = 3;
  std::string netbed = PLEXUS_NETBED_SCRIPT;
  std::vector<int> rates = {200, 400, 100, 300};
  size_t message_bytes = size_t{1} << 20;
  int depth = 16;
  int allreduce_mib = 64;
  int allreduce_paths = 2;
  int allreduce_iterations = 3;
  int allreduce_cap = 0;    // chunks in flight per path of the allreduce's channels; 0 = default
  int allreduce_depth = 0;  // the communicators' pipeline_depth; 0 = default
  int allreduce_chunk_kib = 0;      // the communicators' chunk_bytes in KiB; 0 = default
  int allreduce_path_chunk_kb = 0;  // the channels' chunk_bytes in KB; 0 = default (50)
  int allreduce_ack_ahead = 1;      // ChannelOptions::ack_ahead of the allreduce's channels
  int interval_ms = 50;             // --timeline's sampling interval
};

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline std::string BedName() { return absl::StrCat("mpb", getpid()); }

// The channels of the throughput, failover and timeline runs.
inline multipath::ChannelOptions BenchOptions() {
  multipath::ChannelOptions o;
  o.path_timeout = absl::Milliseconds(100);
  return o;
}

struct StreamResult {
  double mbit = 0;
  std::vector<double> path_share;  // of bytes acked over the window
  absl::Duration longest_gap;      // between receiver completions, after warmup
  uint64_t messages = 0, bad_bytes = 0, duplicates = 0, missing = 0;
  absl::Time window_start, window_end;  // the measured window (after the warmup)
  std::vector<absl::Time> done_at;      // every message's delivery at the receiver
};

// Streams messages a -> b for `seconds` after a warmup, verifying each one; `event` runs at
// `event_at` into the measured window (failover trials).
absl::StatusOr<StreamResult> MultipathStream(std::unique_ptr<netbed::BedChannels> owned,
                                             const Args& args, double seconds,
                                             std::function<void()> event = nullptr,
                                             double event_at = 0);

// The sections: each writes its figures to `out`.
absl::Status RunThroughput(const Args& args, tooling::FigureWriter& out);
absl::Status RunFailover(const Args& args, tooling::FigureWriter& out);
absl::Status RunAllReduce(const Args& args, tooling::FigureWriter& out);

// Kernel MPTCP's failover trials (mptcp_bench.cpp), which RunFailover interleaves with the
// multipath channel's: one trial's results are added to `acc`; Emit writes the figures.
struct MptcpFailoverTrials {
  std::vector<double> outages, message_outages, mbits;
  std::vector<int> subflows;
  uint64_t sent = 0, lost = 0, corrupt = 0;
  int undrained = 0;
  std::string errors;
};
absl::Status MptcpFailoverTrial(netbed::Bed& bed, const std::string& event, const Args& args,
                                int trial, MptcpFailoverTrials& acc);
void EmitMptcpFailover(const Args& args, const std::vector<int>& rates, const std::string& event,
                       const MptcpFailoverTrials& acc, tooling::FigureWriter& out);
absl::Status RunTimeline(const Args& args, tooling::FigureWriter& out);

}  // namespace plexus::mpbench
