// plexus-bench-collectives --reconfig (reconfig_bench.hpp).
#include "reconfig_bench.hpp"
#include "plexus/base/quantile.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace plexus::bench {
namespace {

namespace pc = plexus::collectives;
using Clock = std::chrono::steady_clock;

constexpr int kBaselineCalls = 10;
constexpr int kDefaultRounds = 40;

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "plexus-bench-collectives reconfig worker: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::exit(1);
}

double Percentile(std::vector<double> v, double q) {
  return plexus::base::Quantile(std::move(v), q);
}

}  // namespace

void MeasureReconfiguration(pc::Communicator& comm, const WorkerOptions& options) {
  const int n = comm.size();
  const int rounds = options.iters > 0 ? options.iters : kDefaultRounds;
  std::vector<int> identity(n), reversed(n);
  std::iota(identity.begin(), identity.end(), 0);
  std::reverse_copy(identity.begin(), identity.end(), reversed.begin());
  uint64_t epoch = comm.configuration().epoch;
  // --reconfig-change transport: every round moves the connections to the other of tcp and shm
  // (uniform), and the next one back.
  const bool by_transport = options.reconfig_change == "transport";
  const transport::Backend first = comm.configuration().transport.backend;
  const transport::Backend other =
      first == transport::Backend::kTcp ? transport::Backend::kShm : transport::Backend::kTcp;
  // --reconfig-change channels: every round doubles the channels created (shm 1 -> 2, tcp
  // 2 -> 4: as many new connections per peer as a transport change makes), the next one halves
  // them back (closing them).
  const bool by_channels = options.reconfig_change == "channels";
  const int first_channels = comm.configuration().channels;
  // What the calls are split by: the transport or the channel count they ran on.
  auto phase = [&]() -> std::string {
    const pc::ActiveConfiguration a = comm.configuration();
    return by_channels ? std::to_string(a.channels)
                       : std::string(transport::BackendName(a.transport.backend));
  };
  auto max_over_ranks = [&](double value) {
    double out = 0;
    if (absl::Status s = comm.AllReduce(&value, &out, 1, pc::DataType::kF64, pc::ReduceOp::kMax);
        !s.ok()) {
      Die("AllReduce of the figures", s);
    }
    return out;
  };
  for (size_t bytes : options.sizes) {
    const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
    std::vector<float> in(count), out(count);
    FillInput(in.data(), count, comm.rank());
    auto call = [&]() {
      const auto start = Clock::now();
      if (absl::Status s =
              comm.AllReduce(in.data(), out.data(), count, pc::DataType::kF32, pc::ReduceOp::kSum);
          !s.ok()) {
        Die("AllReduce", s);
      }
      return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    };
    std::vector<double> baseline, landing, affected, request_to_landing, after_landing;
    // --reconfig-change transport (channels): per backend (count), the baseline calls on it and
    // the landing calls that moved to it (the two directions of the change cost differently).
    std::map<std::string, std::vector<double>> baseline_on, landing_to;
    size_t wrong = 0, before_landing = 0;
    for (int round = 0; round < rounds; ++round) {
      if (absl::Status s = comm.Barrier(); !s.ok()) Die("Barrier", s);
      const std::string on = phase();
      for (int i = 0; i < kBaselineCalls; ++i) {
        baseline.push_back(call());
        baseline_on[on].push_back(baseline.back());
      }
      ++epoch;
      const auto requested = Clock::now();
      if (comm.rank() == 0) {
        pc::Reconfiguration change;
        if (by_transport) {
          change.transport =
              pc::TransportChoice{round % 2 == 0 ? other : first, pc::TransportPolicy::kUniform};
        } else if (by_channels) {
          change.channels = round % 2 == 0 ? 2 * first_channels : first_channels;
        } else {
          change.ring_order = round % 2 == 0 ? reversed : identity;
        }
        auto e = comm.RequestReconfiguration(change);
        if (!e.ok()) Die("RequestReconfiguration", e.status());
        if (*e != epoch) {
          Die("RequestReconfiguration", absl::InternalError("epoch " + std::to_string(*e) +
                                                            ", expected " + std::to_string(epoch)));
        }
      }
      // Every rank sees the new epoch after the same call: the one the change landed on.
      double slowest = 0;
      for (;;) {
        const double us = call();
        slowest = std::max(slowest, us);
        if (comm.configuration().epoch >= epoch) {
          landing.push_back(us);
          landing_to[phase()].push_back(us);
          break;
        }
        ++before_landing;
      }
      affected.push_back(slowest);
      request_to_landing.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - requested).count());
      wrong += CountWrong(out.data(), count, n);
      // The call after: what is left of the change's cost (a transport change's fresh
      // connections are cold for large messages: new shm rings fault in, tcp starts slow).
      after_landing.push_back(call());
    }
    const double baseline_us = max_over_ranks(Percentile(baseline, 0.5));
    const double landing_us = max_over_ranks(Percentile(landing, 0.5));
    const double landing_p90_us = max_over_ranks(Percentile(landing, 0.9));
    const double baseline_p90_us = max_over_ranks(Percentile(baseline, 0.9));
    const double affected_us = max_over_ranks(Percentile(affected, 0.5));
    const double after_landing_us = max_over_ranks(Percentile(after_landing, 0.5));
    const double total_wrong = max_over_ranks(static_cast<double>(wrong));
    nlohmann::json by_phase = nlohmann::json::object();
    std::vector<std::string> phases;
    if (by_transport) phases = {"shm", "tcp"};
    if (by_channels) phases = {std::to_string(first_channels), std::to_string(2 * first_channels)};
    for (const std::string& b : phases) {
      by_phase[b] = {{"baseline_us", max_over_ranks(Percentile(baseline_on[b], 0.5))},
                     {"landing_us", max_over_ranks(Percentile(landing_to[b], 0.5))}};
    }
    const double before = max_over_ranks(static_cast<double>(before_landing));
    if (comm.rank() == 0) {
      nlohmann::json j;
      j["impl"] = "plexus";
      j["mode"] = "reconfig";
      j["change"] = options.reconfig_change;
      j["transport"] = options.transport;
      j["nprocs"] = n;
      j["op"] = "allreduce";
      j["dtype"] = "f32";
      j["bytes"] = bytes;
      j["count"] = count;
      j["iters"] = rounds;
      j["time_us"] = landing_us;
      j["wrong"] = static_cast<uint64_t>(total_wrong);
      j["baseline_us"] = baseline_us;
      j["landing_us"] = landing_us;
      j["added_us"] = landing_us - baseline_us;
      j["landing_p90_us"] = landing_p90_us;
      j["baseline_p90_us"] = baseline_p90_us;
      j["affected_us"] = affected_us;
      j["after_landing_us"] = after_landing_us;
      // Transport (channel) changes: per backend (count), the calls on it and the landing calls
      // moving to it.
      if (by_transport) j["by_backend"] = by_phase;
      if (by_channels) j["by_channels"] = by_phase;
      j["request_to_landing_us"] = Percentile(request_to_landing, 0.5);
      j["calls_before_landing"] = before / rounds;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace plexus::bench
