// A two-level hierarchical aggregation plan (PLink's 2LHA): the buffer is cut into chunks; per
// chunk every group has a local master (LM) and one LM is the global master (GM). Members send
// to their LM, LMs to the GM, the GM optimizes once and broadcasts back down the same tree. The
// plan is a DAG of send / receive / aggregate / optimize / broadcast steps that a verifier
// checks, an interpreter evaluates (the bit-exact reference) and the executor runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/netmodel/flow_sim.hpp"

namespace plexus::aggregation {

enum class StepKind : uint8_t {
  kSend,       // the node's merge buffer of the chunk to peers[0]
  kReceive,    // a message from peers[0]; install = replace the merge buffer, else an aggregate
               // later adds it
  kAggregate,  // merge buffer += every non-install receive in `after`, in `after`'s order
  kOptimize,   // the optimizer runs on the chunk (exactly once per node and chunk, on the sum)
  kBroadcast,  // the merge buffer to every node in peers
};

std::string_view StepKindName(StepKind kind);

struct Step {
  StepKind kind = StepKind::kSend;
  int node = 0;
  int chunk = 0;
  std::vector<int> peers;
  std::vector<int> after;  // earlier steps OF THE SAME NODE this one waits for
  bool install = false;
};

struct PlanChunk {
  int64_t offset = 0;  // elements
  int64_t elements = 0;
  int gm = -1;
  std::vector<int> lm;  // per group
};

// A receive is matched with the k-th send (or broadcast) from its peer to its node for its
// chunk, k counted in step order on both sides.
struct Plan {
  int nodes = 0;
  std::vector<std::vector<int>> groups;
  std::vector<PlanChunk> chunks;
  std::vector<Step> steps;  // a topological order of the DAG
};

struct TwoLevelOptions {
  int64_t chunk_elements = 16384;  // 64 KB of fp32, the dissertation's AggEngine default
  // Relative capacity of every node (empty = all equal): a group receives GMs in proportion to
  // its members' total, a node LMs in proportion to its own (Quicktune passes bandwidths).
  std::vector<double> node_weight = {};
};

// Builds the 2LHA plan for `elements` values on the nodes of `groups` (a partition of
// 0..nodes-1; every group non-empty). GMs and LMs are spread by weighted LPT (each chunk to the
// bin with the least (load + chunk) / weight), identically on every node.
absl::StatusOr<Plan> BuildTwoLevelPlan(const std::vector<std::vector<int>>& groups,
                                       int64_t elements, const TwoLevelOptions& options = {});

// The same plan with the chunk masters already chosen (`chunks` with gm and lm set).
absl::StatusOr<Plan> BuildTwoLevelPlanFromMasters(const std::vector<std::vector<int>>& groups,
                                                  std::vector<PlanChunk> chunks);

// Checks the plan by running it symbolically: every node ends with every node's contribution
// exactly once, optimized exactly once, and nothing is sent that is not received (or the
// reverse), nothing waits forever, nothing is optimized before it is complete. Errors name the
// step, node and chunk.
absl::Status VerifyPlan(const Plan& plan);

// Evaluates the plan on real values: inputs[node] has the buffer of every node (all the same
// length); returns every node's final buffer. `scale` is the optimizer (applied once to the sum,
// as the GM's optimize step does: value *= scale). The executor's result must equal this bit for
// bit. The plan must verify.
absl::StatusOr<std::vector<std::vector<float>>> EvaluatePlan(
    const Plan& plan, const std::vector<std::vector<float>>& inputs, float scale);

// The plan as flow-simulator transfers (hosts[node] = host; element_bytes per value). With
// `fifo_connections` a node's messages to one peer leave one after another in step order (the
// seed's AggEngine: one send queue per connection, bytes on the wire in SendTo order), which lets
// chunks pipeline through the phases; without it they all share the link at once.
absl::StatusOr<netmodel::sim::Schedule> PlanToSchedule(const Plan& plan, std::span<const int> hosts,
                                                       double element_bytes,
                                                       bool fifo_connections = true);

// The communication round of every step (send, broadcast and their receives): the length of the
// longest chain of communication steps ending at it; 0 for local steps.
std::vector<int> CommunicationRounds(const Plan& plan);

}  // namespace plexus::aggregation
