// The MoE runtime (plexus/moe/runtime.hpp) with ranks as threads over the inproc transport:
// results equal the single-process reference bit for bit for any number of ranks, the loss
// falls, and a rank that stops answering is survived elastically or by checkpoint restart with
// the same final parameters as a run that never failed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/moe/exchange.hpp"
#include "plexus/moe/runtime.hpp"
#include "plexus/transport/store.hpp"

namespace pm = plexus::moe;
namespace pt = plexus::transport;

namespace {

pm::ModelConfig SmallModel() {
  pm::ModelConfig c;
  c.layers = 2;
  c.experts = 6;
  c.hidden = 8;
  c.ffn = 16;
  c.tokens_per_step = 96;
  c.top_k = 2;
  return c;
}

struct RunResult {
  std::vector<std::string> errors;         // per rank, "" = ok
  std::vector<std::vector<float>> states;  // per surviving rank: GatherState at the end
  std::vector<std::vector<pm::StepReport>> reports;
};

// Runs `world` ranks as threads for `steps` steps. `stop_rank` stops calling Step() (as if
// killed) before step `stop_step` and never comes back.
RunResult Run(int world, int64_t steps, pm::RuntimeOptions options, int stop_rank = -1,
              int64_t stop_step = -1) {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  auto store =
      pt::TcpStore::Connect("127.0.0.1:" + std::to_string((*server)->port()), absl::Seconds(10));
  REQUIRE(store.ok());
  std::shared_ptr<pt::Store> shared = *std::move(store);
  options.comm.backend = pt::Backend::kInproc;
  RunResult out;
  out.errors.resize(world);
  out.states.resize(world);
  out.reports.resize(world);
  std::vector<std::unique_ptr<pm::Trainer>> stopped(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = pm::Trainer::Create(shared, r, world, options);
      if (!trainer.ok()) {
        out.errors[r] = std::string(trainer.status().message());
        return;
      }
      while ((*trainer)->step() < steps) {
        if (r == stop_rank && (*trainer)->step() == stop_step) {
          stopped[r] = *std::move(trainer);  // silent from now on; destroyed after the others
          return;
        }
        auto report = (*trainer)->Step();
        if (!report.ok()) {
          out.errors[r] = std::string(report.status().message());
          return;
        }
        out.reports[r].push_back(*report);
      }
      auto state = (*trainer)->GatherState();
      if (!state.ok()) {
        out.errors[r] = std::string(state.status().message());
        return;
      }
      out.states[r] = *std::move(state);
    });
  }
  for (auto& t : threads) t.join();
  stopped.clear();
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("ToElementExchange scales token counts and offsets to elements", "[moe][runtime]") {
  pm::RankExchange ex;
  ex.send_counts = {2, 0, 3};
  ex.send_offsets = {0, 2, 2};
  ex.recv_counts = {1, 4, 0};
  ex.recv_offsets = {0, 1, 5};
  const pm::ElementExchange x = pm::ToElementExchange(ex, 16);
  CHECK(x.send_counts == std::vector<size_t>{32, 0, 48});
  CHECK(x.send_displs == std::vector<size_t>{0, 32, 32});
  CHECK(x.recv_counts == std::vector<size_t>{16, 64, 0});
  CHECK(x.recv_displs == std::vector<size_t>{0, 16, 80});
  CHECK(x.send_elements == 80);
  CHECK(x.recv_elements == 80);
}

TEST_CASE("the reference's loss falls", "[moe][runtime]") {
  std::vector<double> losses;
  auto state = pm::TrainReference(SmallModel(), 40, &losses);
  REQUIRE(state.ok());
  REQUIRE(losses.size() == 40);
  CHECK(losses.back() < 0.7 * losses.front());
}

TEST_CASE("distributed training equals the reference bit for bit for 1, 3 and 4 ranks",
          "[moe][runtime]") {
  const int64_t steps = 6;
  pm::RuntimeOptions options;
  options.model = SmallModel();
  options.comm.timeout = absl::Seconds(20);
  std::vector<double> losses;
  auto reference = pm::TrainReference(options.model, steps, &losses);
  REQUIRE(reference.ok());
  for (int world : {1, 3, 4}) {
    INFO("world " << world);
    options.slots_per_node = world == 1 ? 6 : 4;  // one rank holds every expert
    const RunResult run = Run(world, steps, options);
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      REQUIRE(run.errors[r] == "");
      CHECK(BitEqual(run.states[r], *reference));
      REQUIRE(run.reports[r].size() == steps);
      for (int64_t s = 0; s < steps; ++s) CHECK(run.reports[r][s].loss == losses[s]);
    }
  }
}

TEST_CASE("a rank that stops is survived elastically with the never-failed parameters",
          "[moe][runtime]") {
  const int64_t steps = 8;
  pm::RuntimeOptions options;
  options.model = SmallModel();
  options.comm.timeout = absl::Seconds(1);
  options.membership_grace = absl::Milliseconds(500);
  auto reference = pm::TrainReference(options.model, steps);
  REQUIRE(reference.ok());
  // 6 experts on 4 ranks x 4 slots: after rank 1 stops, the new plan moves 8 expert states.
  const RunResult run = Run(4, steps, options, /*stop_rank=*/1, /*stop_step=*/3);
  for (int r : {0, 2, 3}) {
    INFO("rank " << r);
    REQUIRE(run.errors[r] == "");
    CHECK(BitEqual(run.states[r], *reference));
    int failures = 0;
    for (const pm::StepReport& rep : run.reports[r]) {
      if (!rep.failed) continue;
      ++failures;
      CHECK(rep.step == 3);
      CHECK_FALSE(rep.checkpoint_restart);
      CHECK(rep.steps_lost == 0);
      CHECK(rep.members.size() == 3);
      CHECK(rep.experts_fetched == 8);
    }
    CHECK(failures == 1);
  }
}

TEST_CASE("checkpoint restart redoes the lost steps and ends equal too", "[moe][runtime]") {
  const int64_t steps = 8;
  pm::RuntimeOptions options;
  options.model = SmallModel();
  options.comm.timeout = absl::Seconds(1);
  options.membership_grace = absl::Milliseconds(500);
  options.recovery = pm::RecoveryMode::kCheckpointRestart;
  options.checkpoint_every = 2;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("plexus_moe_ckpt_" + std::to_string(getpid())))
          .string();
  options.checkpoint_path = path;
  auto reference = pm::TrainReference(options.model, steps);
  REQUIRE(reference.ok());
  const RunResult run = Run(4, steps, options, /*stop_rank=*/1, /*stop_step=*/5);
  std::filesystem::remove(path);
  for (int r : {0, 2, 3}) {
    INFO("rank " << r);
    REQUIRE(run.errors[r] == "");
    CHECK(BitEqual(run.states[r], *reference));
    int failures = 0;
    for (const pm::StepReport& rep : run.reports[r]) {
      if (!rep.failed) continue;
      ++failures;
      CHECK(rep.checkpoint_restart);
      CHECK(rep.step == 4);  // the checkpoint after step 4
      CHECK(rep.steps_lost == 1);
    }
    CHECK(failures == 1);
  }
}

TEST_CASE("elastic recovery falls back to the checkpoint when an expert lost every replica",
          "[moe][runtime]") {
  const int64_t steps = 7;
  pm::RuntimeOptions options;
  options.model = SmallModel();
  options.model.experts = 8;
  options.slots_per_node = 3;  // 8 experts in 12 slots: some have a single replica
  options.comm.timeout = absl::Seconds(1);
  options.membership_grace = absl::Milliseconds(500);
  options.checkpoint_every = 3;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("plexus_moe_ckpt_lost_" + std::to_string(getpid())))
                               .string();
  options.checkpoint_path = path;
  auto reference = pm::TrainReference(options.model, steps);
  REQUIRE(reference.ok());
  const RunResult run = Run(4, steps, options, /*stop_rank=*/2, /*stop_step=*/4);
  std::filesystem::remove(path);
  for (int r : {0, 1, 3}) {
    INFO("rank " << r);
    REQUIRE(run.errors[r] == "");
    CHECK(BitEqual(run.states[r], *reference));
    int failures = 0;
    for (const pm::StepReport& rep : run.reports[r]) {
      if (!rep.failed) continue;
      ++failures;
      CHECK(rep.checkpoint_restart);
      CHECK(rep.step == 3);
      CHECK(rep.steps_lost == 1);
    }
    CHECK(failures == 1);
  }
}
