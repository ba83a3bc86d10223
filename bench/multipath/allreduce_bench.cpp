// plexus-bench-multipath's allreduce section: a 2-rank ring allreduce (rank 0 in namespace a,
// rank 1 in b) over MultipathDevices with K paths against the same over one path.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench_common.hpp"
#include "netbed.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/multipath/device.hpp"
#include "plexus/tooling/figures.hpp"

namespace pm = plexus::multipath;
namespace pt = plexus::transport;
namespace nb = plexus::netbed;
namespace tooling = plexus::tooling;
namespace pc = plexus::collectives;

namespace plexus::mpbench {

namespace {

// One run: a communicator per rank over `paths` (1-based path numbers): a MultipathDevice with
// one path per entry when `multipath`, else the plain tcp device bound to the single path's
// address. Returns rank 0's median seconds per allreduce of args.allreduce_mib MiB (f32 sum) over
// args.allreduce_iterations after one warm-up, and each path's share of rank 0's bytes.
struct AllReduceRun {
  double seconds = 0;
  std::vector<double> path_share;
  // Sampled every 2 ms over the timed calls, per path, over rank 0's connections: chunks in
  // flight against the cap, the fraction of samples at the cap, and the mean smoothed RTT.
  std::vector<double> occupancy, at_cap, srtt_ms;
  uint64_t chunks_reposted = 0, paths_revived = 0;  // failovers during the run (rank 0's side)
};

// Samples a MultipathDevice's channels until stopped (AllReduceRun's occupancy figures).
class OccupancySampler {
 public:
  OccupancySampler(const pm::MultipathDevice& device, size_t paths)
      : in_flight_(paths), cap_(paths), at_cap_(paths), srtt_(paths), device_(device) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        std::vector<double> in_flight(in_flight_.size()), cap(in_flight_.size());
        for (const pm::ChannelStats& ch : device_.Stats()) {
          for (const pm::PathStats& p : ch.paths) {
            if (!p.up || p.lane < 0 || static_cast<size_t>(p.lane) >= in_flight.size()) continue;
            in_flight[p.lane] += p.in_flight;
            cap[p.lane] += p.cap;
            srtt_[p.lane] += absl::ToDoubleMilliseconds(p.srtt);
          }
        }
        for (size_t k = 0; k < in_flight.size(); ++k) {
          in_flight_[k] += in_flight[k];
          cap_[k] += cap[k];
          at_cap_[k] += cap[k] > 0 && in_flight[k] >= cap[k] ? 1 : 0;
        }
        ++samples_;
        absl::SleepFor(absl::Milliseconds(2));
      }
    });
  }
  ~OccupancySampler() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Stops sampling and writes the figures.
  void Finish(AllReduceRun& run) {
    stop_ = true;
    thread_.join();
    const std::vector<pm::ChannelStats> stats = device_.Stats();
    const size_t channels = std::max<size_t>(1, stats.size());
    for (const pm::ChannelStats& ch : stats) {
      run.paths_revived += ch.paths_revived;
      for (const pm::PathStats& p : ch.paths) run.chunks_reposted += p.chunks_reposted;
    }
    for (size_t k = 0; k < in_flight_.size(); ++k) {
      run.occupancy.push_back(cap_[k] > 0 ? in_flight_[k] / cap_[k] : 0);
      run.at_cap.push_back(samples_ > 0 ? at_cap_[k] / samples_ : 0);
      run.srtt_ms.push_back(samples_ > 0 ? srtt_[k] / samples_ / channels : 0);
    }
  }

 private:
  std::vector<double> in_flight_, cap_, at_cap_, srtt_;
  double samples_ = 0;
  const pm::MultipathDevice& device_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

absl::StatusOr<AllReduceRun> AllReduceOnce(nb::Bed& bed, const std::vector<size_t>& paths,
                                           bool multipath, const Args& args) {
  char dir_template[] = "/tmp/plexus-mp-allreduce-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<pt::Store> store, pt::FileStore::Open(dir));
  const size_t count = (size_t{1} << 20) * args.allreduce_mib / sizeof(float);
  std::vector<absl::Status> status(2);
  AllReduceRun result;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const char side = r == 0 ? 'a' : 'b';
      status[r] = nb::InNetns(bed.ns(side), [&]() -> absl::Status {
        PLEXUS_ASSIGN_OR_RETURN(pt::Rendezvous rdv, pt::Rendezvous::Create(r, 2, store));
        pc::CommunicatorOptions options;
        options.timeout = absl::Seconds(60);
        if (args.allreduce_depth > 0) options.pipeline_depth = args.allreduce_depth;
        if (args.allreduce_chunk_kib > 0)
          options.chunk_bytes = size_t{1024} * args.allreduce_chunk_kib;
        std::shared_ptr<pm::MultipathDevice> device;
        std::unique_ptr<pc::Communicator> comm;
        if (multipath) {
          pm::MultipathDeviceOptions o;
          for (size_t k : paths) o.local_addresses.push_back(nb::Bed::Address(side, k));
          o.channel.path_timeout = absl::Milliseconds(100);
          if (args.allreduce_cap > 0) o.channel.max_chunks_in_flight = args.allreduce_cap;
          o.channel.ack_ahead = args.allreduce_ack_ahead != 0;
          if (args.allreduce_path_chunk_kb > 0) {
            o.channel.chunk_bytes = size_t{1000} * args.allreduce_path_chunk_kb;
          }
          PLEXUS_ASSIGN_OR_RETURN(device, pm::MultipathDevice::Create(o));
          PLEXUS_ASSIGN_OR_RETURN(comm, pc::Communicator::Create(rdv, device, options));
        } else {
          options.device.local_address = nb::Bed::Address(side, paths[0]);
          // tcp over the bed's path, although both namespaces share one host name.
          options.transport_policy = pc::TransportPolicy::kUniform;
          PLEXUS_ASSIGN_OR_RETURN(comm, pc::Communicator::Create(rdv, options));
        }
        std::vector<float> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + r) % 1024);
        std::vector<double> times;
        std::unique_ptr<OccupancySampler> sampler;
        for (int it = 0; it <= args.allreduce_iterations; ++it) {
          if (it == 1 && r == 0 && device != nullptr) {
            sampler = std::make_unique<OccupancySampler>(*device, paths.size());
          }
          const absl::Time t0 = absl::Now();
          PLEXUS_RETURN_IF_ERROR(comm->AllReduce(in.data(), out.data(), count, pc::DataType::kF32,
                                                 pc::ReduceOp::kSum));
          if (it > 0) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
        }
        for (size_t i = 0; i < count; i += 4099) {
          const float want = static_cast<float>(i % 1024 + (i + 1) % 1024);
          if (out[i] != want) {
            return absl::DataLossError(
                absl::StrCat("rank ", r, " element ", i, ": ", out[i], ", want ", want));
          }
        }
        if (r == 0) {
          result.seconds = Median(times);
          if (sampler != nullptr) sampler->Finish(result);
          if (device != nullptr) {
            const std::vector<uint64_t> bytes = device->PathBytesAcked();
            const double total = std::accumulate(bytes.begin(), bytes.end(), 0.0);
            for (uint64_t b : bytes) result.path_share.push_back(total > 0 ? b / total : 0);
          }
        }
        comm.reset();  // collective: both ranks reach it
        return absl::OkStatus();
      });
    });
  }
  for (auto& t : ranks) t.join();
  store.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  for (int r = 0; r < 2; ++r) {
    PLEXUS_RETURN_IF_ERROR(plexus::base::Annotate(status[r], absl::StrCat("allreduce rank ", r)));
  }
  return result;
}

}  // namespace

absl::Status RunAllReduce(const Args& args, tooling::FigureWriter& out) {
  const int k = args.allreduce_paths;
  const std::vector<int> rates(args.rates.begin(), args.rates.begin() + k);
  PLEXUS_ASSIGN_OR_RETURN(auto bed, nb::Bed::Create(args.netbed, BedName(), rates));
  std::vector<size_t> all;
  for (int p = 1; p <= k; ++p) all.push_back(p);
  const size_t fastest = 1 + std::max_element(rates.begin(), rates.end()) - rates.begin();
  const double sum = std::accumulate(rates.begin(), rates.end(), 0.0);
  const double bytes = static_cast<double>(size_t{1} << 20) * args.allreduce_mib;
  // 2 ranks: busbw = algbw x 2(n-1)/n = bytes / time; each rank sends `bytes` each way.
  auto busbw = [&](double seconds) { return bytes / seconds / 1e6; };
  std::vector<double> mp, single;
  std::vector<std::vector<double>> shares(k), occupancy(k), at_cap(k), srtt_ms(k);
  for (int run = 0; run < args.runs; ++run) {
    PLEXUS_ASSIGN_OR_RETURN(AllReduceRun m, AllReduceOnce(*bed, all, true, args));
    mp.push_back(busbw(m.seconds));
    for (int p = 0; p < k && p < static_cast<int>(m.path_share.size()); ++p) {
      shares[p].push_back(m.path_share[p]);
    }
    for (int p = 0; p < k && p < static_cast<int>(m.occupancy.size()); ++p) {
      occupancy[p].push_back(m.occupancy[p]);
      at_cap[p].push_back(m.at_cap[p]);
      srtt_ms[p].push_back(m.srtt_ms[p]);
    }
    if (args.compare) {
      PLEXUS_ASSIGN_OR_RETURN(AllReduceRun s, AllReduceOnce(*bed, {fastest}, false, args));
      single.push_back(busbw(s.seconds));
    }
    if (std::getenv("PLEXUS_BENCH_VERBOSE") != nullptr) {
      std::fprintf(stderr,
                   "allreduce run %d: multipath %.1f MB/s, single path %.1f MB/s (chunks reposted "
                   "%llu, paths revived %llu)\n",
                   run, mp.back(), single.empty() ? 0.0 : single.back(),
                   static_cast<unsigned long long>(m.chunks_reposted),
                   static_cast<unsigned long long>(m.paths_revived));
      for (size_t p = 0; p < m.occupancy.size(); ++p) {
        std::fprintf(stderr,
                     "  path %zu: share %.3f, in flight / cap %.2f, at cap %.2f of samples, "
                     "srtt %.1f ms\n",
                     p + 1, p < m.path_share.size() ? m.path_share[p] : 0.0, m.occupancy[p],
                     m.at_cap[p], m.srtt_ms[p]);
      }
    }
  }
  const std::string rates_text = absl::StrJoin(rates, "/");
  auto add = [&](const std::string& figure, const std::vector<double>& v, nlohmann::json extra) {
    if (v.empty()) return;
    tooling::Figure f;
    f.figure = figure;
    f.value = Median(v);
    f.unit = "MB/s";
    f.extra = {{"ranks", 2},
               {"bytes", (size_t{1} << 20) * args.allreduce_mib},
               {"dtype", "f32"},
               {"rates_mbit", rates_text},
               {"runs", v.size()},
               {"iterations_per_run", args.allreduce_iterations},
               {"min", *std::min_element(v.begin(), v.end())},
               {"max", *std::max_element(v.begin(), v.end())},
               {"busbw_mbit", Median(v) * 8}};
    for (auto& [key, value] : extra.items()) f.extra[key] = value;
    out.Add(f);
  };
  std::vector<double> share_medians, occupancy_medians, at_cap_medians, srtt_medians;
  for (auto& s : shares) share_medians.push_back(Median(s));
  for (auto& s : occupancy) occupancy_medians.push_back(Median(s));
  for (auto& s : at_cap) at_cap_medians.push_back(Median(s));
  for (auto& s : srtt_ms) srtt_medians.push_back(Median(s));
  add("allreduce_busbw_multipath", mp,
      {{"paths", k},
       {"fraction_of_sum_of_rates", Median(mp) * 8 / sum},
       {"path_share", share_medians},
       {"path_in_flight_per_cap", occupancy_medians},
       {"path_at_cap_fraction", at_cap_medians},
       {"path_srtt_ms", srtt_medians},
       {"chunks_in_flight_cap", args.allreduce_cap > 0 ? args.allreduce_cap : 8},
       {"chunk_kb", args.allreduce_path_chunk_kb > 0 ? args.allreduce_path_chunk_kb : 50},
       {"ack_ahead", args.allreduce_ack_ahead != 0}});
  add("allreduce_busbw_single_path", single,
      {{"paths", 1},
       {"path", fastest},
       {"rate_mbit", rates[fastest - 1]},
       {"fraction_of_path_rate", single.empty() ? 0.0 : Median(single) * 8 / rates[fastest - 1]}});
  if (!single.empty()) {
    tooling::Figure f;
    f.figure = "allreduce_multipath_speedup";
    f.value = Median(mp) / Median(single);
    f.unit = "ratio";
    f.extra = {{"paths", k},
               {"rates_mbit", rates_text},
               {"ideal", sum / rates[fastest - 1]},
               {"bytes", (size_t{1} << 20) * args.allreduce_mib},
               {"runs", mp.size()}};
    out.Add(f);
  }
  return absl::OkStatus();
}

}  // namespace plexus::mpbench
