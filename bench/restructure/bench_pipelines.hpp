// What plexus-bench-restructure's modes share: the five pipelines of Fianchetto's Table 3.1 at
// the table's shapes or scaled down, and the random inputs every mode fills programs with.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "plexus/restructure/program.hpp"
#include "stats.hpp"

namespace plexus::bench::restructure {

// Seconds on the monotonic clock.
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// The median (the upper one of an even count); NaN for none.
using plexus::bench::Median;

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

// The interpreter --compare runs the peers with unless --python names another: the one found at
// configuration to import torch (Debian's python3).
inline constexpr char kDefaultPython[] = PLEXUS_RESTRUCTURE_PYTHON;

// Runs python_peers.py under `python` with --runs, the shapes of `shape_scale` and `extra`
// arguments; returns each line's time, keyed by (peer, stage). *ok: false when the script failed
// (the reason on stderr, prefixed by `who`); its other lines go to stderr.
std::map<std::pair<std::string, std::string>, double> PythonPeerTimes(
    const char* who, const std::string& python, int runs, double shape_scale,
    const std::vector<std::string>& extra, bool* ok);

// One input buffer's bytes: f32 uniform in [0.001, 4) (positive: log10 stays finite), other
// types small bytes (no f16/bf16 specials).
std::vector<uint8_t> RandomInput(const plexus::restructure::BufferDecl& buffer, std::mt19937& rng);

}  // namespace plexus::bench::restructure
