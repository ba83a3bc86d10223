// plexus-bench-multipath's kernel MPTCP sections: MPTCP's failover trials (the reference in
// RunFailover, interleaved with the multipath channel's) and the throughput per path over time
// through a failover and a restore, for the multipath channel and MPTCP side by side (--timeline).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_common.hpp"
#include "failover_series.hpp"
#include "netbed.hpp"
#include "plexus/tooling/figures.hpp"

namespace nb = plexus::netbed;
namespace mpb = plexus::mpbench;
namespace tooling = plexus::tooling;

namespace plexus::mpbench {

// ---- Kernel MPTCP failover trials (the reference for RunFailover) ----

// One of RunFailover's trials for one kernel MPTCP connection (initial subflow on path 1, one
// subflow per other path from the in-kernel path manager's `subflow` endpoints) on the same bed
// and rates: path 2 taken down or blackholed 0.8 s into a 2 s window; the outage is the longest
// gap in bytes delivered to the receiving application, and every byte of the stream is checked,
// then drained to EOF (bytes never delivered count as lost).
absl::Status MptcpFailoverTrial(nb::Bed& bed, const std::string& event, const Args& args, int trial,
                                MptcpFailoverTrials& acc) {
  // Fresh endpoints each trial (flush and add): the same subflows every time.
  PLEXUS_RETURN_IF_ERROR(bed.Run({"mptcp"}));
  absl::Status event_status;
  PLEXUS_ASSIGN_OR_RETURN(mpb::MptcpResult r, mpb::MptcpStream(
                                                  bed, 2.0,
                                                  [&] {
                                                    event_status = bed.Run({event, "2"});
                                                  },
                                                  0.8));
  PLEXUS_RETURN_IF_ERROR(event_status);
  PLEXUS_RETURN_IF_ERROR(bed.Run({"restore", "2"}));
  acc.outages.push_back(absl::ToDoubleSeconds(r.longest_gap));
  acc.message_outages.push_back(absl::ToDoubleSeconds(mpb::LongestGap(
      mpb::MessageDeliveries(r.deliveries, args.message_bytes), r.window_start, r.window_end)));
  acc.mbits.push_back(r.mbit);
  acc.subflows.push_back(r.subflows_before_event);
  acc.sent += r.sent;
  acc.lost += r.lost();
  acc.corrupt += r.corrupt_bytes;
  acc.undrained += r.drained ? 0 : 1;
  if (!r.error.empty()) absl::StrAppend(&acc.errors, acc.errors.empty() ? "" : "; ", r.error);
  if (std::getenv("PLEXUS_BENCH_VERBOSE") != nullptr) {
    std::fprintf(stderr,
                 "mptcp %s trial %d: outage %.3f s (%.3f s in whole messages), %.1f Mbit/s, "
                 "subflows %d -> %d, sent %llu received %llu corrupt %llu%s %s\n",
                 event.c_str(), trial, acc.outages.back(), acc.message_outages.back(), r.mbit,
                 r.subflows_before_event, r.subflows_at_end,
                 static_cast<unsigned long long>(r.sent),
                 static_cast<unsigned long long>(r.received),
                 static_cast<unsigned long long>(r.corrupt_bytes),
                 r.drained ? "" : " (not drained)", r.error.c_str());
  }
  return absl::OkStatus();
}

void EmitMptcpFailover(const Args& args, const std::vector<int>& rates, const std::string& event,
                       const MptcpFailoverTrials& acc, tooling::FigureWriter& out) {
  if (acc.outages.empty()) return;
  tooling::Figure f;
  f.figure = absl::StrCat("mptcp_failover_outage_", event);
  f.value = *std::max_element(acc.outages.begin(), acc.outages.end());
  f.unit = "s";
  f.extra = {{"trials", acc.outages.size()},
             {"outages_s", acc.outages},
             {"median_s", Median(acc.outages)},
             {"min_s", *std::min_element(acc.outages.begin(), acc.outages.end())},
             {"rates_mbit", absl::StrJoin(rates, "/")},
             {"median_mbit", Median(acc.mbits)},
             {"subflows_before_event", acc.subflows}};
  out.Add(f);
  // The same outage with the stream read as whole messages of the multipath runs' size (their
  // outage is between whole messages too): the comparison on equal terms.
  tooling::Figure m;
  m.figure = absl::StrCat("mptcp_failover_outage_messages_", event);
  m.value = *std::max_element(acc.message_outages.begin(), acc.message_outages.end());
  m.unit = "s";
  m.extra = {{"trials", acc.message_outages.size()},
             {"outages_s", acc.message_outages},
             {"median_s", Median(acc.message_outages)},
             {"min_s", *std::min_element(acc.message_outages.begin(), acc.message_outages.end())},
             {"message_bytes", args.message_bytes}};
  out.Add(m);
  tooling::Figure loss;
  loss.figure = absl::StrCat("mptcp_bytes_lost_or_duplicated_", event);
  loss.value = static_cast<double>(acc.lost + acc.corrupt);
  loss.unit = "bytes";
  loss.extra = {{"trials", acc.outages.size()},
                {"sent_bytes", acc.sent},
                {"lost_bytes", acc.lost},
                {"corrupt_bytes", acc.corrupt},
                {"trials_not_drained_in_10s", acc.undrained}};
  if (!acc.errors.empty()) loss.extra["errors"] = acc.errors;
  out.Add(loss);
}

namespace {

// ---- Throughput per path over time through a failover and a restore (--timeline) ----

struct TimelinePlan {
  double down_s = 1.0, restore_s = 2.5, end_s = 4.5;  // from the window's start
  int path = 2;
};

// Writes one line per sample ("timeline": value = application goodput, path_mbit = what each
// path's wire delivered, headers included) and one summary line ("timeline_outage": the longest
// gap in delivered bytes, the same counting only whole messages of the multipath runs' size,
// and the times of the failure and the restore) for `system`.
void EmitTimeline(tooling::FigureWriter& out, const std::string& system, const std::string& event,
                  const TimelinePlan& plan, const std::vector<int>& rates,
                  const std::vector<mpb::TimelinePoint>& points, absl::Duration outage,
                  absl::Duration message_outage, double down_s, double restore_s) {
  if (out.json()) {  // the table shows the summary only
    // Rounded (1 ms, 0.1 Mbit/s): finer is noise, and the series stays small.
    auto round = [](double v, double per_unit) { return std::round(v * per_unit) / per_unit; };
    for (const mpb::TimelinePoint& p : points) {
      tooling::Figure f;
      f.figure = "timeline";
      f.value = round(p.goodput_mbit, 10);
      f.unit = "Mbit/s";
      std::vector<double> path_mbit;
      for (double v : p.path_mbit) path_mbit.push_back(round(v, 10));
      f.extra = {{"system", system},
                 {"event", event},
                 {"t_s", round(p.t_s, 1000)},
                 {"path_mbit", path_mbit}};
      out.Add(f);
    }
  }
  tooling::Figure f;
  f.figure = "timeline_outage";
  f.value = absl::ToDoubleSeconds(outage);
  f.unit = "s";
  f.extra = {
      {"system", system},         {"event", event},
      {"path", plan.path},        {"down_s", down_s},
      {"restore_s", restore_s},   {"rates_mbit", rates},
      {"samples", points.size()}, {"outage_messages_s", absl::ToDoubleSeconds(message_outage)}};
  out.Add(f);
}

}  // namespace

absl::Status RunTimeline(const Args& args, tooling::FigureWriter& out) {
  const TimelinePlan plan;
  const std::vector<int> rates(args.rates.begin(), args.rates.begin() + 3);
  const std::string path = std::to_string(plan.path);
  const absl::Duration interval = absl::Milliseconds(args.interval_ms);
  PLEXUS_ASSIGN_OR_RETURN(auto bed, nb::Bed::Create(args.netbed, BedName(), rates));
  for (const std::string event : {"link-down", "blackhole"}) {
    // Takes the path down, restores it (restore_s - down_s) later, then runs `after_restore`.
    absl::Time down_at, restore_at;
    auto fail_and_restore = [&](const std::function<absl::Status()>& after_restore) {
      down_at = absl::Now();
      absl::Status s = bed->Run({event, path});
      absl::SleepFor(down_at + absl::Seconds(plan.restore_s - plan.down_s) - absl::Now());
      restore_at = absl::Now();
      if (s.ok()) s = bed->Run({"restore", path});
      if (s.ok()) s = after_restore();
      return s;
    };
    // The event runs inside the stream's window, which it lengthens by its own run time.
    const double seconds = plan.end_s - (plan.restore_s - plan.down_s);
    {  // Plexus
      PLEXUS_ASSIGN_OR_RETURN(auto ch, nb::BedChannels::Create(*bed, BenchOptions()));
      for (int p = 1; p <= 3; ++p) PLEXUS_RETURN_IF_ERROR(ch->Connect(p).status());
      PLEXUS_RETURN_IF_ERROR(ch->WaitLive(3));
      nb::BedChannels* channels = ch.get();  // alive until the stream returns
      PLEXUS_ASSIGN_OR_RETURN(auto sampler, mpb::WireSampler::Start(*bed, interval));
      absl::Status event_status;
      PLEXUS_ASSIGN_OR_RETURN(StreamResult r, MultipathStream(
                                                  std::move(ch), args, seconds,
                                                  [&] {
                                                    event_status = fail_and_restore([&] {
                                                      // Bare channels (no redial): the
                                                      // bench re-adds the path.
                                                      absl::Status s;
                                                      for (int i = 0; i < 10; ++i) {
                                                        s = channels->Connect(plan.path).status();
                                                        if (s.ok()) break;
                                                        absl::SleepFor(absl::Milliseconds(100));
                                                      }
                                                      return s;
                                                    });
                                                  },
                                                  plan.down_s));
      PLEXUS_RETURN_IF_ERROR(event_status);
      PLEXUS_ASSIGN_OR_RETURN(auto samples, sampler->Stop());
      std::vector<mpb::Delivery> deliveries;
      for (absl::Time t : r.done_at) deliveries.push_back({t, args.message_bytes});
      EmitTimeline(out, "plexus", event, plan, rates,
                   mpb::Timeline(samples, deliveries, r.window_start, r.window_end), r.longest_gap,
                   r.longest_gap, absl::ToDoubleSeconds(down_at - r.window_start),
                   absl::ToDoubleSeconds(restore_at - r.window_start));
    }
    {  // kernel MPTCP: its subflow on the path survives (bound to the device) and resumes
      PLEXUS_RETURN_IF_ERROR(bed->Run({"mptcp"}));
      PLEXUS_ASSIGN_OR_RETURN(auto sampler, mpb::WireSampler::Start(*bed, interval));
      absl::Status event_status;
      PLEXUS_ASSIGN_OR_RETURN(
          mpb::MptcpResult r,
          mpb::MptcpStream(
              *bed, seconds,
              [&] { event_status = fail_and_restore([] { return absl::OkStatus(); }); },
              plan.down_s));
      PLEXUS_RETURN_IF_ERROR(event_status);
      PLEXUS_ASSIGN_OR_RETURN(auto samples, sampler->Stop());
      EmitTimeline(out, "mptcp", event, plan, rates,
                   mpb::Timeline(samples, r.deliveries, r.window_start, r.window_end),
                   r.longest_gap,
                   mpb::LongestGap(mpb::MessageDeliveries(r.deliveries, args.message_bytes),
                                   r.window_start, r.window_end),
                   absl::ToDoubleSeconds(down_at - r.window_start),
                   absl::ToDoubleSeconds(restore_at - r.window_start));
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus::mpbench
