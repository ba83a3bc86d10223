// What plexus-bench-restructure's modes share: the five pipelines of Fianchetto's Table 3.1 at
// the table's shapes or scaled down, and the random inputs every mode fills programs with.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::bench::restructure {

struct PipelineProgram {
  std::string name;
  absl::StatusOr<plexus::restructure::Program> program;
  bool exact = true;  // false: Pow/Log10 run (the executor is within documented bounds)
};

// The pipelines with their outermost dimension (video height, sound frames, brain windows, PII
// and join rows) scaled by `shape_scale` (1: the table's shapes; at least the smallest shape the
// stage takes). `f16_brain`: brain stimulation emits f16 instead of bf16 (numpy has no bf16).
std::vector<PipelineProgram> PipelinePrograms(double shape_scale, bool f16_brain = false);
// The same shapes as python_peers.py's --shapes object.
nlohmann::json PipelineShapesJson(double shape_scale);

// One input buffer's bytes: f32 uniform in [0.001, 4) (positive: log10 stays finite), other
// types small bytes (no f16/bf16 specials).
std::vector<uint8_t> RandomInput(const plexus::restructure::BufferDecl& buffer, std::mt19937& rng);

}  // namespace plexus::bench::restructure
