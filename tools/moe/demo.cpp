// plexus-moe-demo: the Lazarus runtime on 4 local ranks. One rank is killed (SIGKILL) partway
// through; the survivors reconfigure and continue at the same step. The same failure schedule is
// then replayed with checkpoint restart (the DeepSpeed-MoE baseline) and the two are compared.
//
//   plexus-moe-demo [--steps N] [--kill-step S] [--json] [--plot out.png]   (the driver)
//   plexus-run -n 4 --keep-going plexus-moe-demo train [...]                 (one run, by hand)
//
// `train` is one rank of one run: it reads the launcher's environment (plexus-run, torchrun,
// mpirun, srun) through Rendezvous::FromEnv; `train --join` is a new rank joining the running
// job (PLEXUS_STORE_ADDR or PLEXUS_STORE, PLEXUS_JOB_ID: transport::OpenJobStore). Where rank 0
// serves the store, killing it ends the job with an error naming the store; in an etcd store
// (--store etcd) the job survives it. docs/moe.md, "The demo".
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "demo.hpp"
#include "fmt/core.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/hash.hpp"
#include "plexus/moe/runtime.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/join.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pm = plexus::moe;
namespace pt = plexus::transport;
namespace tooling = plexus::tooling;
using nlohmann::json;
using plexus::moe::demo::TrainArgs;

namespace {

constexpr char kDescription[] =
    "The Lazarus runtime on local ranks: trains a small MoE model, kills one rank partway, and\n"
    "compares elastic recovery with checkpoint restart (docs/moe.md, \"The demo\").";

void AddTrainFlags(CLI::App* app, TrainArgs* a) {
  tooling::AddNumber(app, "--steps", &a->steps, "training steps", int64_t{1}, int64_t{1} << 40);
  tooling::AddNumber(app, "--kill-step", &a->kill_step,
                     "the killed rank dies (SIGKILL) before this step (-1: nobody dies)",
                     int64_t{-1}, int64_t{1} << 40);
  tooling::AddNumber(app, "--kill-rank", &a->kill_rank,
                     "the rank that dies (0 only with --store etcd: a store rank 0 serves dies "
                     "with it)",
                     0, 4095);
  tooling::AddNumber(app, "--join-step", &a->join_step,
                     "a new rank asks to join once the job reaches this step (-1: nobody joins)",
                     int64_t{-1}, int64_t{1} << 40);
  tooling::AddNumber(app, "--checkpoint-every", &a->checkpoint_every,
                     "steps between checkpoints (0: none)", 0, 1 << 30);
  tooling::AddNumber(app, "--timeout", &a->timeout_s,
                     "communicator timeout in seconds: how long a silent peer goes unnoticed", 0.1,
                     600.0);
  tooling::AddNumber(app, "--grace", &a->grace_s,
                     "seconds survivors wait for each other before fixing the membership", 0.01,
                     600.0);
  tooling::AddNumber(app, "--tokens", &a->tokens, "tokens per step (global batch)", 1, 1 << 24);
  tooling::AddNumber(app, "--hidden", &a->hidden, "token width", 1, 4096);
  tooling::AddNumber(app, "--ffn", &a->ffn, "expert MLP width", 1, 65536);
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int RunRank(const tooling::Tool& tool, const TrainArgs& a) {
  // Checked before the rendezvous, so that a usage error on one rank cannot strand the others.
  if (a.checkpoint_every > 0 && a.checkpoint_path.empty()) {
    return tool.Usage("--checkpoint-every needs --checkpoint-path (or --checkpoint-every 0)");
  }
  pm::RuntimeOptions options;
  options.model = plexus::moe::demo::ModelOf(a);
  options.comm.device.backend = pt::Backend::kShm;
  options.comm.timeout = absl::Seconds(a.timeout_s);
  options.membership_grace = absl::Seconds(a.grace_s);
  options.recovery =
      a.recovery == "elastic" ? pm::RecoveryMode::kElastic : pm::RecoveryMode::kCheckpointRestart;
  options.checkpoint_every = a.checkpoint_every;
  options.checkpoint_path = a.checkpoint_path;
  const auto t0 = std::chrono::steady_clock::now();
  // The demo's own key: rank 0 says when the joiner may ask (so that it joins mid-run).
  constexpr char kJoinNowKey[] = "plexus-moe-demo/join-now";
  std::optional<pt::Rendezvous> rdv;
  std::shared_ptr<pt::Store> store;
  absl::StatusOr<std::unique_ptr<pm::Trainer>> trainer;
  if (a.join) {
    auto opened = pt::OpenJobStore(pt::ProcessEnvironment(), absl::Seconds(60));
    if (!opened.ok()) return tool.Fail(opened.status());
    store = *std::move(opened);
    if (a.join_step >= 0) {
      if (auto now = store->Get(kJoinNowKey, absl::Seconds(100)); !now.ok()) {
        return tool.Fail(now.status());
      }
    }
    trainer = pm::Trainer::Join(store, options);
  } else {
    auto joined = pt::Rendezvous::FromEnv(absl::Seconds(60));
    if (!joined.ok()) return tool.Fail(joined.status());
    rdv.emplace(*std::move(joined));
    store = rdv->store();
    trainer = pm::Trainer::Create(store, rdv->rank(), rdv->world_size(), options);
  }
  if (!trainer.ok()) return tool.Fail(trainer.status());
  const int physical = (*trainer)->physical_rank();
  // The lowest member reports the job's progress: rank 0 until it dies (a job whose store
  // outlives it, etcd, goes on without it).
  const auto leads = [&] {
    const std::vector<int>& m = (*trainer)->members();
    return !m.empty() && *std::min_element(m.begin(), m.end()) == physical;
  };
  if (leads() && !a.json && rdv.has_value()) {
    // How to add a rank by hand (the same model flags, plus --join).
    const pt::Environment env = pt::ProcessEnvironment();
    const auto addr = env.find("PLEXUS_STORE_ADDR");
    const auto path = env.find("PLEXUS_STORE_PATH");
    const std::string where = addr != env.end() ? "PLEXUS_STORE_ADDR=" + addr->second
                              : path != env.end()
                                  ? "PLEXUS_STORE_PATH=" + path->second
                                  : std::string("PLEXUS_STORE_ADDR=<the store's address>");
    fmt::print("to add a rank: {} PLEXUS_JOB_ID={} plexus-moe-demo train --join [model flags]\n",
               where, rdv->job_id());
  }
  const int64_t tokens = a.tokens;
  while ((*trainer)->step() < a.steps) {
    if (physical == a.kill_rank && (*trainer)->step() == a.kill_step) {
      std::fflush(stdout);
      raise(SIGKILL);
    }
    if (leads() && (*trainer)->step() == a.join_step) {
      if (absl::Status s = store->Set(kJoinNowKey, "1"); !s.ok()) return tool.Fail(s);
    }
    auto r = (*trainer)->Step();
    if (!r.ok()) return tool.Fail(r.status());
    if (!leads()) continue;
    const double t = Since(t0);
    const int64_t samples = (*trainer)->step() * tokens;
    if (!r->joined.empty()) {
      if (a.json) {
        fmt::print("{}\n", json{{"event", "join"},
                                {"t", t},
                                {"step", r->step},
                                {"joined", r->joined},
                                {"members", r->members},
                                {"checkpoint_restart", r->checkpoint_restart},
                                {"experts_fetched", r->experts_fetched},
                                {"join_s", r->recovery_seconds},
                                {"samples", samples}}
                               .dump());
      } else {
        fmt::print(
            "rank(s) {} joined after step {} in {:.2f} s: members {}, {} expert states "
            "fetched\n",
            json(r->joined).dump(), r->step, r->recovery_seconds, json(r->members).dump(),
            r->experts_fetched);
      }
    }
    if (r->failed) {
      if (a.json) {
        fmt::print("{}\n", json{{"event", "failure"},
                                {"t", t},
                                {"step", r->step},
                                {"error", r->error},
                                {"members", r->members},
                                {"checkpoint_restart", r->checkpoint_restart},
                                {"steps_lost", r->steps_lost},
                                {"experts_fetched", r->experts_fetched},
                                {"detect_s", r->detect_seconds},
                                {"recovery_s", r->recovery_seconds},
                                {"samples", samples}}
                               .dump());
      } else {
        fmt::print(
            "failure detected: {}\n  recovered in {:.2f} s ({}), members {}, resuming at "
            "step {} ({} steps lost, {} expert states fetched)\n",
            r->error, r->recovery_seconds, r->checkpoint_restart ? "checkpoint restart" : "elastic",
            fmt::format("{}", json(r->members).dump()), r->step, r->steps_lost, r->experts_fetched);
      }
    } else if (a.json) {
      fmt::print("{}\n", json{{"event", "step"},
                              {"t", t},
                              {"step", r->step},
                              {"loss", r->loss},
                              {"samples", samples}}
                             .dump());
    } else if (r->step % 20 == 0) {
      fmt::print("step {:5d}  loss {:.5f}  samples {:8d}  t {:6.2f} s\n", r->step, r->loss, samples,
                 t);
    }
    std::fflush(stdout);
  }
  auto state = (*trainer)->GatherState();
  if (!state.ok()) return tool.Fail(state.status());
  if (leads()) {
    const std::string digest = plexus::moe::demo::Digest(*state);
    if (a.json) {
      fmt::print(
          "{}\n",
          json{{"event", "done"}, {"t", Since(t0)}, {"steps", a.steps}, {"digest", digest}}.dump());
    } else {
      fmt::print("done: {} steps in {:.2f} s, parameters digest {}\n", a.steps, Since(t0), digest);
    }
  }
  return 0;
}

}  // namespace

namespace plexus::moe::demo {

ModelSpec ModelOf(const TrainArgs& a) {
  ModelSpec c;
  c.tokens_per_step = a.tokens;
  c.hidden = a.hidden;
  c.ffn = a.ffn;
  return c;
}

std::string Digest(const std::vector<float>& state) {
  return fmt::format("{:016x}",
                     base::Fnv1a64(std::string_view(reinterpret_cast<const char*>(state.data()),
                                                    state.size() * sizeof(float))));
}

}  // namespace plexus::moe::demo

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-moe-demo", kDescription);
  CLI::App& app = tool.app();
  TrainArgs a;
  a.join_step = 135;  // the driver's run: a new rank joins after the kill
  int ranks = 4;
  bool json_out = false;
  std::string plot;
  AddTrainFlags(&app, &a);
  tooling::AddNumber(&app, "--ranks,-n", &ranks, "ranks of the driver's runs", 2, 64);
  std::string store;
  app.add_option("--store", store,
                 "where the ranks meet: rank 0's TCP store (default), 'etcd' (an etcd server "
                 "started for the demo; needs etcd-server) or etcd://host:port (an existing one)");
  tooling::AddJsonFlag(&app, &json_out);
  app.add_option("--plot", plot,
                 "write the samples-over-time plot to this PNG (python3 + "
                 "matplotlib)");
  CLI::App* train = tool.Subcommand("train", "one rank of one run (under plexus-run, mpirun...)");
  TrainArgs t;
  AddTrainFlags(train, &t);
  train->add_option("--recovery", t.recovery, "elastic or checkpoint")
      ->check(CLI::IsMember({"elastic", "checkpoint"}));
  train->add_option("--checkpoint-path", t.checkpoint_path, "checkpoint file");
  train->add_flag("--join", t.join,
                  "join the running job whose store PLEXUS_STORE_ADDR (or PLEXUS_STORE_PATH, "
                  "PLEXUS_STORE) and PLEXUS_JOB_ID name, as a new rank");
  tooling::AddJsonFlag(train, &t.json);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (train->parsed()) return RunRank(tool, t);
  return plexus::moe::demo::RunDriver(tool, a, ranks, json_out, plot, store,
                                      plexus::tooling::SelfPath(argv[0]));
}
