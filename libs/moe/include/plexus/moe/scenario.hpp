// Scenarios (model, cluster, training constants) and node schedules, read from JSON / CSV.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::moe {

// Constants of the training-time model; every one is an input (see docs/moe.md).
struct TrainingModel {
  int64_t samples_per_step = 256;  // global batch
  // Tokens each sample routes into every MoE layer (sequence length x top-k).
  int64_t tokens_per_sample = 1024;
  double seconds_per_token = 1e-6;  // per token of the busiest node, summed over layers
  double fixed_step_s = 0.5;        // non-MoE part of a step
  int64_t checkpoint_every_steps = 100;
  double checkpoint_s = 10;               // to write one checkpoint
  double restart_s = 120;                 // to restart from a checkpoint (load, re-init)
  double reconfigure_s = 5;               // fixed part of a Lazarus reconfiguration
  double bandwidth_bytes_per_s = 1.25e9;  // for expert state moved during reconfiguration
  int64_t expert_state_bytes = 0;         // per expert replica (weights + optimizer)
  int ep_size = 4;                        // checkpoint-restart baseline: expert-parallel size
  double scale_up_wait_s = 120;           // wait before new nodes are taken into training
  int max_nodes = 10;                     // cluster cap
};

struct Scenario {
  std::string name;
  std::string description;
  int nodes = 0;                                 // initial cluster size
  int slots_per_node = 0;                        // c
  int min_replicas = 2;                          // f
  std::vector<std::vector<double>> layer_loads;  // [layer][expert]
  TrainingModel training;
  int num_experts() const {
    return layer_loads.empty() ? 0 : static_cast<int>(layer_loads[0].size());
  }
};

// JSON: {"name", "description", "nodes", "slots_per_node", "min_replicas",
// "layer_loads": [[...], ...], "training": {...TrainingModel fields...}}.
absl::StatusOr<Scenario> ParseScenario(const std::string& json_text);
absl::StatusOr<Scenario> LoadScenario(const std::string& path);

struct NodeEvent {
  double time_s = 0;
  bool add = true;
  std::string node;
};

// Node availability over time, events sorted by time (stable).
struct Schedule {
  std::string name;
  std::vector<NodeEvent> events;
  double end_s = 0;  // simulate until here (>= last event)
};

// Bamboo spot-trace CSV: "time_ms,add|remove,node" per line.
absl::StatusOr<Schedule> ParseSpotTrace(const std::string& csv_text);
// JSON, one of:
//   {"name", "end_s", "events": [{"time_s", "op": "add"|"remove", "node"}]}
//   {"name", "end_s", "steps": [{"time_s", "nodes"}]}  (node counts; removals take the
//     highest-numbered nodes)
//   {"name", "end_s", "initial_nodes", "fail_every_s", "replace_after_s"}  (periodic failures of
//     pseudo-randomly chosen nodes, each replaced by a fresh node after the delay)
absl::StatusOr<Schedule> ParseSchedule(const std::string& json_text);
// By extension: .csv is a spot trace, anything else schedule JSON.
absl::StatusOr<Schedule> LoadSchedule(const std::string& path);

}  // namespace plexus::moe
