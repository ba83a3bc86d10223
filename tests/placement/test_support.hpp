// Shared helpers of the placement tests: a tiny hand-checkable problem and the bundled data.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

#ifndef PLEXUS_PLACEMENT_DATA_DIR
#define PLEXUS_PLACEMENT_DATA_DIR "examples/data/placement"
#endif

namespace plexus::placement::testing {

inline std::string DataFile(const std::string& name) {
  return std::string(PLEXUS_PLACEMENT_DATA_DIR) + "/" + name;
}

// camera (edge) -> detect {small, big} -> track (relational). Workers: an edge CPU (10 req/s with
// small, 4 with big, price 1), a second edge CPU, and a cloud GPU (100 req/s, price 5).
// Frames are 1000 KB; edge -> cloud costs 0.1 per GB.
inline nlohmann::json TinyProblem() {
  return nlohmann::json::parse(R"({
    "name": "tiny",
    "workflow": {
      "operators": [
        {"name": "camera", "kind": "source"},
        {"name": "detect", "kind": "ml", "variants": ["small", "big"]},
        {"name": "track", "kind": "relational"}
      ],
      "edges": [
        {"from": "camera", "to": "detect", "message_kb": [{"kb": 1000}]},
        {"from": "detect", "to": "track", "message_kb": [{"kb": 1}]}
      ]
    },
    "accuracy_profiles": [
      {"operator": "detect", "variants": {"small": [{"in": [], "out": 0.6}],
                                          "big": [{"in": [], "out": 0.8}]}}
    ],
    "execution_profiles": [
      {"operator": "detect", "variant": "small", "worker_type": "cpu", "p50": 90, "p75": 100, "p90": 110},
      {"operator": "detect", "variant": "big", "worker_type": "cpu", "p50": 240, "p75": 250, "p90": 270},
      {"operator": "detect", "variant": "small", "worker_type": "gpu", "p50": 9, "p75": 10, "p90": 11},
      {"operator": "detect", "variant": "big", "worker_type": "gpu", "p50": 9, "p75": 10, "p90": 11},
      {"operator": "track", "worker_type": "cpu", "p50": 1, "p75": 1, "p90": 1},
      {"operator": "track", "worker_type": "gpu", "p50": 1, "p75": 1, "p90": 1}
    ],
    "infrastructure": {
      "tiers": [{"name": "edge"}, {"name": "cloud"}],
      "worker_types": [{"name": "cpu", "price_per_hour": 1.0},
                       {"name": "gpu", "price_per_hour": 5.0, "gpu": true}],
      "workers": [{"name": "e", "type": "cpu", "tier": "edge", "count": 2},
                  {"name": "c", "type": "gpu", "tier": "cloud"},
                  {"name": "t", "type": "cpu", "tier": "cloud"}],
      "network": [{"from": "edge", "to": "cloud", "price_per_gb": 0.1, "latency_ms": 10}],
      "sources": [{"operator": "camera", "tier": "edge"}]
    },
    "objective": {"accuracy_target": 0.7, "input_rate": 8}
  })");
}

}  // namespace plexus::placement::testing
