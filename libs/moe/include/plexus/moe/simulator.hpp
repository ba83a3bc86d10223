// Replays a node schedule against a training system and counts the samples it trains.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/moe/scenario.hpp"

namespace plexus::moe {

enum class SystemKind {
  kLazarus,            // replicas + MRO; reconfigure on failure, restart only on lost experts
  kCheckpointRestart,  // DeepSpeed-MoE-style EP: restart from checkpoint on every failure
  kEpReconfigure,      // the EP baseline, reconfiguring like Lazarus when a replica survives
};
const char* SystemKindName(SystemKind kind);  // "lazarus", "checkpoint_restart", "ep_reconfigure"
absl::StatusOr<SystemKind> ParseSystemKind(const std::string& name);

struct SimulationOptions {
  double timeline_interval_s = 60;  // spacing of timeline points
};

struct TimelinePoint {
  double time_s = 0;
  double samples = 0;  // trained and not lost
  int active_nodes = 0;
};

struct SimulationResult {
  SystemKind system = SystemKind::kLazarus;
  double duration_s = 0;
  double samples = 0;
  int64_t steps = 0;
  int failures = 0;          // removals of nodes in use
  int reconfigurations = 0;  // after failures, without losing progress
  int restarts = 0;          // from a checkpoint
  int scale_ups = 0;
  double lost_samples = 0;  // progress thrown away by restarts
  double idle_s = 0;        // time without enough nodes to train
  double overhead_s = 0;    // restart + reconfiguration + checkpoint time
  double mean_active_nodes = 0;
  std::vector<TimelinePoint> timeline;
};

absl::StatusOr<SimulationResult> Simulate(const Scenario& scenario, const Schedule& schedule,
                                          SystemKind system, const SimulationOptions& options = {});

// Step time with `nodes` nodes in use (Lazarus: MRO plan + dispatcher; EP: groups of ep_size);
// Unavailable when the system cannot train on that many nodes.
absl::StatusOr<double> StepTime(const Scenario& scenario, SystemKind system, int nodes);

}  // namespace plexus::moe
