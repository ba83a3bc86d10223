// The driver of plexus-moe-demo: launches the ranks of the elastic run and of the checkpoint
// restart run with the same failure schedule, shows their progress, and compares them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "demo.hpp"
#include "fmt/core.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/etcd.hpp"
#include "plexus/tooling/launch.hpp"

namespace tooling = plexus::tooling;
using nlohmann::json;

namespace plexus::moe::demo {

namespace {

struct RunLog {
  std::string mode;
  std::vector<json> steps;  // the lead's step events (rank 0's, then the lowest survivor's)
  json failure;             // null when none
  json join;                // null when none
  json done;
  int exit_code = 0;
  std::string problem;  // why the run does not count ("" = fine)
  double seconds = 0;
};

RunLog RunOnce(const TrainArgs& a, int ranks, const std::string& mode, const std::string& self,
               const std::string& checkpoint, const std::string& store_url, bool quiet) {
  RunLog log;
  log.mode = mode;
  tooling::LaunchOptions options;
  // The joiner is one more process of the launch that tells its rank and world size to nobody:
  // the others see a world of `ranks`, it finds the job through the store (`train --join`).
  const bool joining = a.join_step >= 0 && a.join_step < a.steps;
  options.ranks = ranks + (joining ? 1 : 0);
  if (joining) {
    options.env = {{"PLEXUS_WORLD_SIZE", std::to_string(ranks)},
                   {"PLEXUS_LOCAL_WORLD_SIZE", std::to_string(ranks)}};
  }
  if (!store_url.empty()) options.env.emplace_back("PLEXUS_STORE", store_url);
  std::vector<std::string> argv = {self,
                                   "train",
                                   "--json",
                                   "--recovery",
                                   mode,
                                   "--steps",
                                   std::to_string(a.steps),
                                   "--kill-step",
                                   std::to_string(a.kill_step),
                                   "--kill-rank",
                                   std::to_string(a.kill_rank),
                                   "--checkpoint-every",
                                   std::to_string(a.checkpoint_every),
                                   "--checkpoint-path",
                                   checkpoint,
                                   "--timeout",
                                   std::to_string(a.timeout_s),
                                   "--grace",
                                   std::to_string(a.grace_s),
                                   "--tokens",
                                   std::to_string(a.tokens),
                                   "--hidden",
                                   std::to_string(a.hidden),
                                   "--ffn",
                                   std::to_string(a.ffn),
                                   "--join-step",
                                   std::to_string(joining ? a.join_step : -1)};
  options.rank_argv = [argv, ranks](int rank) {
    std::vector<std::string> v = argv;
    if (rank == ranks) v.push_back("--join");
    return v;
  };
  options.output = tooling::OutputMode::kCallback;
  options.stop_on_failure = false;  // a killed rank is the experiment, not a reason to stop
  options.timeout = absl::Seconds(100);
  options.forward_signals = true;
  std::mutex mu;
  const int64_t every = std::max<int64_t>(1, a.steps / 8);
  options.on_line = [&](tooling::Launcher&, int rank, tooling::Stream stream,
                        std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    // Only the lead prints on stdout: rank 0, or after its death the lowest survivor.
    if (stream != tooling::Stream::kStdout) {
      if (!quiet) fmt::print(stderr, "[{} rank {}] {}\n", mode, rank, line);
      return;
    }
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("event")) {
      if (!quiet) fmt::print("[{}] {}\n", mode, line);
      return;
    }
    const std::string event = j["event"];
    if (event == "step") {
      log.steps.push_back(j);
      const int64_t step = j["step"];
      if (!quiet && (step + 1) % every == 0) {
        fmt::print("  [{:18}] step {:4d}/{}  loss {:.5f}  t {:6.2f} s\n", mode, step + 1, a.steps,
                   j["loss"].get<double>(), j["t"].get<double>());
      }
    } else if (event == "failure") {
      log.failure = j;
      if (!quiet) {
        fmt::print("  [{:18}] rank {} killed before step {}; detected after {:.2f} s: {}\n", mode,
                   a.kill_rank, a.kill_step, j["detect_s"].get<double>(),
                   j["error"].get<std::string>());
        fmt::print(
            "  [{:18}] recovered in {:.2f} s with members {}: resuming at step {} ({} "
            "steps lost, {} expert states fetched)\n",
            mode, j["recovery_s"].get<double>(), j["members"].dump(), j["step"].get<int64_t>(),
            j["steps_lost"].get<int64_t>(), j["experts_fetched"].get<int64_t>());
      }
    } else if (event == "join") {
      log.join = j;
      if (!quiet) {
        fmt::print(
            "  [{:18}] rank {} joined after step {}: {} in {:.2f} s with members {} ({} expert "
            "states fetched, 0 steps lost)\n",
            mode, absl::StrJoin(j["joined"].get<std::vector<int>>(), ","), j["step"].get<int64_t>(),
            j["checkpoint_restart"].get<bool>() ? "checkpoint and restart" : "re-planned",
            j["join_s"].get<double>(), j["members"].dump(), j["experts_fetched"].get<int64_t>());
      }
    } else if (event == "done") {
      log.done = j;
    }
    std::fflush(stdout);
  };
  absl::StatusOr<tooling::LaunchResult> result = tooling::Launch(std::move(options));
  if (!result.ok()) {
    log.problem = std::string(result.status().message());
    return log;
  }
  log.seconds = result->seconds;
  for (const tooling::RankResult& r : result->ranks) {
    const bool victim = a.kill_step >= 0 && a.kill_step < a.steps && r.rank == a.kill_rank;
    const bool as_planned = victim ? r.signal == SIGKILL : r.ok();
    if (!as_planned && log.problem.empty()) {
      log.problem = absl::StrCat("rank ", r.rank, " ", r.Describe());
    }
  }
  if (log.done.is_null() && log.problem.empty()) log.problem = "no rank reported the end";
  return log;
}

// Samples trained (progress kept) at time t: the last step event at or before t.
int64_t SamplesAt(const RunLog& log, double t) {
  int64_t samples = 0;
  for (const json& s : log.steps) {
    if (s["t"].get<double>() > t) break;
    samples = s["samples"];
  }
  return samples;
}

// Seconds between the last step before the failure and the moment progress is back to it.
double TimeLost(const RunLog& log) {
  if (log.failure.is_null()) return 0;
  const double t_fail = log.failure["t"];
  int64_t before = 0;
  double t_before = 0;
  for (const json& s : log.steps) {
    if (s["t"].get<double>() >= t_fail) break;
    before = s["samples"];
    t_before = s["t"];
  }
  for (const json& s : log.steps) {
    if (s["t"].get<double>() > t_fail && s["samples"].get<int64_t>() >= before) {
      return s["t"].get<double>() - t_before;
    }
  }
  return t_fail - t_before;
}

}  // namespace

int RunDriver(const tooling::Tool& tool, const TrainArgs& a, int ranks, bool json_out,
              const std::string& plot, const std::string& store, const std::string& self) {
  if (a.kill_rank >= ranks) return tool.Usage("--kill-rank must be below --ranks");
  if (!store.empty() && store != "etcd" && store.rfind("etcd://", 0) != 0) {
    return tool.Usage(absl::StrCat("--store '", store, "': 'etcd' or etcd://host:port"));
  }
  if (a.kill_rank == 0 && store.empty()) {
    return tool.Usage(
        "--kill-rank 0: rank 0 serves the job's store, so its death ends the job; with "
        "--store etcd the job keeps its store and survives it");
  }
  // A private etcd for the demo's runs, stopped (and its data removed) when the driver returns.
  std::unique_ptr<tooling::EtcdServer> etcd;
  std::string store_url = store;
  if (store == "etcd") {
    absl::StatusOr<std::unique_ptr<tooling::EtcdServer>> started =
        tooling::EtcdServer::Start(absl::Seconds(30));
    if (!started.ok()) return tool.Fail(started.status());
    etcd = *std::move(started);
    store_url = absl::StrCat("etcd://", etcd->address());
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("plexus-moe-demo-{}", getpid());
  std::filesystem::create_directories(dir);
  if (!json_out) {
    fmt::print(
        "Lazarus MoE demo: {} ranks, {} steps of {} tokens; rank {} is killed (SIGKILL) "
        "before step {}; checkpoints every {} steps{}\n",
        ranks, a.steps, a.tokens, a.kill_rank, a.kill_step, a.checkpoint_every,
        a.join_step >= 0 && a.join_step < a.steps
            ? fmt::format("; a new rank asks to join at step {}", a.join_step)
            : std::string());
  }
  std::vector<RunLog> logs;
  for (const std::string mode : {"elastic", "checkpoint"}) {
    if (!json_out) {
      fmt::print("\n== {} ==\n",
                 mode == "elastic" ? "Lazarus: elastic recovery" : "baseline: checkpoint restart");
    }
    std::fflush(stdout);
    logs.push_back(
        RunOnce(a, ranks, mode, self, (dir / (mode + ".ckpt")).string(), store_url, json_out));
  }
  std::filesystem::remove_all(dir);
  // The never-failed run: the single-process reference (results do not depend on the ranks).
  absl::StatusOr<std::vector<float>> reference = TrainReference(ModelOf(a), a.steps);
  if (!reference.ok()) return tool.Fail(reference.status());
  const std::string reference_digest = Digest(*reference);
  for (const RunLog& log : logs) {
    if (!log.problem.empty()) {
      return tool.Fail(absl::StrCat("the ", log.mode, " run failed: ", log.problem));
    }
  }
  const RunLog& el = logs[0];
  const RunLog& cr = logs[1];
  const double end = std::max(el.done["t"].get<double>(), cr.done["t"].get<double>());
  const double lost_el = TimeLost(el), lost_cr = TimeLost(cr);
  const double t_el = el.done["t"], t_cr = cr.done["t"];
  const bool same = el.done["digest"] == reference_digest && cr.done["digest"] == reference_digest;
  json summary = {
      {"ranks", ranks},
      {"store", store_url.empty() ? std::string("tcp (served by rank 0)") : store_url},
      {"steps", a.steps},
      {"tokens_per_step", a.tokens},
      {"kill_rank", a.kill_rank},
      {"kill_step", a.kill_step},
      {"checkpoint_every", a.checkpoint_every},
      {"elastic",
       {{"seconds", t_el},
        {"failure", el.failure},
        {"join", el.join},
        {"time_lost_s", lost_el},
        {"digest", el.done["digest"]}}},
      {"checkpoint_restart",
       {{"seconds", t_cr},
        {"failure", cr.failure},
        {"join", cr.join},
        {"time_lost_s", lost_cr},
        {"digest", cr.done["digest"]}}},
      {"never_failed_digest", reference_digest},
      {"same_parameters", same},
      {"time_lost_ratio", lost_el > 0 ? lost_cr / lost_el : 0.0},
  };
  for (const RunLog* log : {&el, &cr}) {
    json series = json::array();
    for (const json& s : log->steps) series.push_back({s["t"], s["samples"]});
    summary[log == &el ? "elastic" : "checkpoint_restart"]["series"] = series;
  }
  if (json_out) {
    fmt::print("{}\n", summary.dump());
  } else {
    fmt::print(
        "\nSamples trained over time (progress kept; a checkpoint restart loses the steps "
        "since its checkpoint):\n");
    fmt::print("  {:>8}  {:>10}  {:>18}\n", "time (s)", "Lazarus", "checkpoint restart");
    const int rows = 12;
    for (int i = 1; i <= rows; ++i) {
      const double t = end * i / rows;
      std::string mark;
      for (const RunLog* log : {&el, &cr}) {
        if (!log->failure.is_null()) {
          const double tf =
              log->failure["t"].get<double>() - log->failure["recovery_s"].get<double>();
          if (tf > end * (i - 1) / rows && tf <= t) {
            mark += fmt::format("  <- failure ({})", log == &el ? "Lazarus" : "restart");
          }
        }
      }
      fmt::print("  {:8.2f}  {:10d}  {:18d}{}\n", t, SamplesAt(el, t), SamplesAt(cr, t), mark);
    }
    auto describe = [&](const RunLog& log) {
      if (log.failure.is_null()) return std::string("no failure");
      return fmt::format(
          "detected after {:.2f} s, recovered in {:.2f} s, {} steps lost, {:.2f} s "
          "of training lost in all",
          log.failure["detect_s"].get<double>(), log.failure["recovery_s"].get<double>(),
          log.failure["steps_lost"].get<int64_t>(), TimeLost(log));
    };
    fmt::print("\nLazarus (elastic):   {:.2f} s end to end; {}\n", t_el, describe(el));
    fmt::print("checkpoint restart:  {:.2f} s end to end; {}\n", t_cr, describe(cr));
    fmt::print(
        "final parameters of both runs equal a run that never failed, bit for bit: {} "
        "(digest {})\n",
        same ? "yes" : "NO", reference_digest);
  }
  if (!plot.empty()) {
    const std::filesystem::path data = dir.string() + "-plot.json";
    if (absl::Status s = plexus::base::WriteFileAtomic(data.string(), summary.dump()); !s.ok()) {
      return tool.Fail(s);
    }
    const absl::Status drawn = plexus::tooling::RunPlot("demo", data.string(), plot);
    std::filesystem::remove(data);
    if (absl::IsUnavailable(drawn)) {
      fmt::print("plexus-moe-demo: {}\n", std::string(drawn.message()));
    } else if (!drawn.ok()) {
      fmt::print(stderr, "plexus-moe-demo: {}\n", std::string(drawn.message()));
    }
  }
  if (!json_out) {
    fmt::print(
        "ratio: checkpoint restart lost {:.2f} s of training to the failure, Lazarus "
        "{:.2f} s: {:.1f}x less time lost with Lazarus ({:.2f} s vs {:.2f} s end to "
        "end)\n",
        lost_cr, lost_el, lost_el > 0 ? lost_cr / lost_el : 0.0, t_el, t_cr);
  }
  return same ? 0 : 1;
}

}  // namespace plexus::moe::demo
