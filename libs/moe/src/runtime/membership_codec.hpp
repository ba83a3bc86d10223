// The values the runtime's ranks exchange through the job's store during membership changes
// (docs/moe.md, "Elasticity protocol"), as base::Records: what a survivor reports ("alive"), what
// the leader decides ("members") and what a newcomer is told ("ticket"). Decoding is strict: a
// value another process wrote is checked field by field (DataLoss naming the field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "plexus/moe/placement.hpp"

namespace plexus::moe::runtime {

// "alive/<physical>": steps completed, deployments committed (record moe.alive).
struct AliveValue {
  int64_t step = 0;
  int64_t generation = 0;
};
std::string EncodeAlive(const AliveValue& v);
absl::StatusOr<AliveValue> DecodeAlive(absl::string_view text);

// "members": step, generation, physical ids (distinct, >= 0, at least one; moe.membership).
struct Membership {
  int64_t step = 0;
  int64_t generation = 0;
  std::vector<int> members;
};
std::string EncodeMembership(const Membership& m);
absl::StatusOr<Membership> DecodeMembership(absl::string_view text);

// A joiner's ticket: what it needs to compute the same plan as the members (moe.ticket; the
// placements as one list of experts, layer by layer, node by node, slot by slot).
struct Ticket {
  int epoch = 0;
  int64_t step = 0;
  int64_t generation = 0;
  int64_t admitted_before = 0;
  int64_t admitted_after = 0;
  std::vector<int> members;
  std::vector<Placement> placements;  // one per layer, over `members`
};
std::string EncodeTicket(const Ticket& t);
// Checks the shape against the model: `layers` placements of members.size() nodes with exactly
// `slots` experts in [0, experts) each.
absl::StatusOr<Ticket> DecodeTicket(absl::string_view text, int layers, int experts, int slots);

}  // namespace plexus::moe::runtime
