// Random placement problems for tests and benchmarks, built around the real JellyBean VQA
// profiles (latencies of the released measurements, scaled per instance).
#pragma once

#include <cstdint>

#include "plexus/placement/problem.hpp"

namespace plexus::placement {

struct RandomInstanceOptions {
  uint64_t seed = 1;
  int min_workers = 4;  // random workers per instance, plus one cloud GPU
  int max_workers = 7;
  int max_tiers = 3;
};

// A validated problem: a VQA-shaped (two branches joined) or a chain workflow with 2-3 ML
// operators of 2-3 variants, 2-3 tiers and a handful of workers; the accuracy target and rate are
// chosen so that the instance is feasible. Deterministic in the seed.
Problem RandomInstance(const RandomInstanceOptions& options);

}  // namespace plexus::placement
