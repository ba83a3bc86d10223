// plexus-moe-demo's parts: one rank of a run (demo.cpp) and the driver that launches and
// compares the runs (demo_driver.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plexus/moe/runtime.hpp"

#include "plexus/tooling/cli.hpp"

namespace plexus::moe::demo {

// The settings of one training run (the flags of `plexus-moe-demo train`).
struct TrainArgs {
  int64_t steps = 160;
  int64_t kill_step = 110;  // -1: nobody dies
  int kill_rank = 1;
  // A new rank asks to join once the job reaches this step (-1: nobody joins). The joiner is the
  // same binary: `train --join` with the job's PLEXUS_STORE_ADDR (and PLEXUS_JOB_ID).
  int64_t join_step = -1;
  bool join = false;  // this process is the joiner
  int checkpoint_every = 60;
  std::string checkpoint_path;
  std::string recovery = "elastic";
  double timeout_s = 2;
  double grace_s = 0.5;
  int tokens = 512;
  // A model whose step takes long enough (about 0.1 s for 4 ranks on 2 cores) that the steps a
  // checkpoint restart loses weigh as they do in training, beside detection and recovery.
  int hidden = 64;
  int ffn = 256;
  bool json = false;
};

// The model the runs train.
ModelSpec ModelOf(const TrainArgs& args);
// FNV-1a of the parameters' bytes: equal digests mean bit-identical parameters.
std::string Digest(const std::vector<float>& state);

// Runs the elastic and the checkpoint-restart run on `ranks` local ranks of `self train`, prints
// progress and the comparison (or one JSON object), and writes the plot when `plot` is set.
// `store`: "" (rank 0 serves a TCP store), "etcd" (a private etcd server) or "etcd://host:port".
int RunDriver(const tooling::Tool& tool, const TrainArgs& args, int ranks, bool json,
              const std::string& plot, const std::string& store, const std::string& self);

}  // namespace plexus::moe::demo
