// Where a workflow's data sits and what moving it costs, as the cost model, the simulator and the
// serving runtime see it: positions of workers and sources, the link between two positions, its
// price, and the bytes of one message.
#pragma once

#include <limits>

#include "plexus/placement/problem.hpp"

namespace plexus::placement {

// Message sizes are in KB, prices per GB; KB and GB are 10^3 and 10^9 bytes, or 2^10 and 2^30
// under ByteUnits::kBinary (the JellyBean release's KB / 1024 / 1024).
inline double BytesPerKb(const Problem& problem) {
  return problem.options.byte_units == ByteUnits::kBinary ? 1024.0 : 1e3;
}
inline double BytesPerGb(const Problem& problem) {
  return problem.options.byte_units == ByteUnits::kBinary ? 1073741824.0 : 1e9;
}

// A place data can be at: a tier and a location of it (0 on a replicated tier, whose copies each
// serve their own location's traffic).
struct Position {
  int tier = 0;
  int location = 0;
};

inline Position WorkerPosition(const Problem& problem, int worker) {
  const Worker& w = problem.workers[worker];
  return {w.tier, problem.tiers[w.tier].replicated ? 0 : w.location};
}

inline Position SourcePosition(const Problem& problem, int op) {
  const Operator& o = problem.operators[op];
  return {o.source_tier, problem.tiers[o.source_tier].replicated ? 0 : o.source_location};
}

// The link data crosses from a to b: nullptr when both are the same place (free, assumption A1);
// also nullptr, with *downwards set, when b is on a lower tier (forbidden, assumption A2).
inline const Link* LinkBetween(const Problem& problem, Position a, Position b,
                               bool* downwards = nullptr) {
  if (downwards != nullptr) *downwards = a.tier > b.tier;
  if (a.tier > b.tier) return nullptr;
  if (a.tier == b.tier) {
    if (a.location == b.location) return nullptr;
    return &problem.tiers[a.tier].between_locations;
  }
  return &*problem.tier_links[a.tier][b.tier];
}

// Price per GB from a to b; infinity when b is below a.
inline double PricePerGb(const Problem& problem, Position a, Position b) {
  bool downwards = false;
  const Link* link = LinkBetween(problem, a, b, &downwards);
  if (downwards) return std::numeric_limits<double>::infinity();
  return link == nullptr ? 0 : link->price_per_gb;
}

// Size in KB of one message on `edge` for the given variants (sources count as variant 0).
inline double MessageKb(const Problem& problem, int edge, int from_variant, int to_variant) {
  const Edge& e = problem.edges[edge];
  return e.size_kb[from_variant < 0 ? 0 : from_variant][to_variant];
}

}  // namespace plexus::placement
