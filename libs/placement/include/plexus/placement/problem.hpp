// The input of the workflow placement optimizer: an ML inference workflow, its model variants and
// profiles, the infrastructure it may run on, and the objective. The JSON format is documented in
// docs/placement.md and described by libs/placement/schema/placement-input.schema.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::placement {

enum class OperatorKind : uint8_t {
  kSource,      // injects requests; pinned to a tier and location, never placed on a worker
  kMl,          // has model variants and accuracy profiles
  kRelational,  // one implicit variant ("default"), passes accuracy through
};

// How an operator with several incoming edges combines them.
enum class Combine : uint8_t {
  kJoin,   // one request per tuple: every incoming edge must carry the same rate
  kUnion,  // every incoming message is a request: the rates add up
};

// Latency of one (operator, variant, worker type) in milliseconds.
struct LatencyProfile {
  double p50 = 0;
  double p75 = 0;
  double p90 = 0;
};

// One row of an accuracy-response profile: accuracies of the operator's ML inputs (in the order of
// Operator::accuracy_inputs) -> the accuracy of its output.
struct AccuracyRow {
  std::vector<double> inputs;
  double output = 0;
};

struct Operator {
  std::string name;
  OperatorKind kind = OperatorKind::kMl;
  Combine combine = Combine::kJoin;
  // Sources have none; relational operators have exactly {"default"}.
  std::vector<std::string> variants;
  // ML operators only: the ML operators whose accuracies the profile rows list, and the rows of
  // each variant (accuracy_rows[variant]).
  std::vector<int> accuracy_inputs;
  std::vector<std::vector<AccuracyRow>> accuracy_rows;
  // Sources only: where requests enter and how many per second (0: the objective's input_rate).
  int source_tier = -1;
  int source_location = 0;
  double source_rate = 0;
};

// Message size on an edge for a pair of variants; "*" matches any variant.
struct MessageSize {
  std::string from_variant = "*";
  std::string to_variant = "*";
  double kb = 0;  // kilobytes (1000 bytes) per message
};

struct Edge {
  int from = -1;
  int to = -1;
  double rate_ratio = 1;  // messages on this edge per request processed by `from`
  std::vector<MessageSize> message_sizes;
  // Filled by validation: size_kb[from variant][to variant] (a source counts one variant).
  std::vector<std::vector<double>> size_kb;
};

// Network between two places. Delay and bandwidth are used by the simulator only.
struct Link {
  double price_per_gb = 0;  // per 10^9 bytes
  double latency_ms = 0;
  double bandwidth_gbps = 0;  // 0: unlimited
};

struct Tier {
  std::string name;
  int locations = 1;
  // When true every worker declared on this tier stands for one identical copy per location, each
  // serving its own location's traffic: throughput and price are multiplied by `locations` and
  // traffic inside the tier stays local (free).
  bool replicated = false;
  Link between_locations;  // traffic between two different locations of this tier
};

struct WorkerType {
  std::string name;
  double price_per_hour = 0;
  bool gpu = false;
};

struct Worker {
  std::string name;
  int type = -1;
  int tier = -1;
  int location = 0;
};

enum class Percentile : uint8_t { kP50, kP75, kP90 };
std::string_view PercentileName(Percentile percentile);

// How message sizes and link prices convert. Plexus's default is decimal (KB = 10^3 bytes, GB =
// 10^9 bytes); the JellyBean release divides KB by 1024 * 1024 to get GB (binary).
enum class ByteUnits : uint8_t { kDecimal, kBinary };
std::string_view ByteUnitsName(ByteUnits units);  // "decimal", "binary"

// How the optimizers split an operator's rate among its workers.
enum class ShareRule : uint8_t {
  kProportional,  // in proportion to throughput: every worker runs at the same utilisation
  // The JellyBean release's rule: workers in the order its greedy picks them (cheapest per
  // request first: price / throughput, then price) serve their full throughput, the last one the
  // rest.
  kFillInOrder,
};
std::string_view ShareRuleName(ShareRule rule);  // "proportional", "fill_in_order"

struct Objective {
  double accuracy_target = 0;
  double input_rate = 0;  // requests per second of every source without its own rate
  int sink = -1;          // the ML operator whose accuracy is the workflow's
};

struct OptimizerOptions {
  int model_selection_beam = 10;    // B_ms
  int worker_assignment_beam = 10;  // B_wa
  int topological_orders = 10;
  Percentile percentile = Percentile::kP75;  // latency used to derive a worker's throughput
  double lb_time_limit_s = 60;               // the exact search stops here: not proven optimal
  int64_t lb_node_limit = 200'000'000;
  // The cost model. {kBinary, kFillInOrder} prices plans as the JellyBean release does.
  ByteUnits byte_units = ByteUnits::kDecimal;
  ShareRule share_rule = ShareRule::kProportional;
};

struct Problem {
  std::string name;
  std::string description;
  std::vector<Operator> operators;
  std::vector<Edge> edges;
  std::vector<Tier> tiers;  // lowest (edge) first
  std::vector<WorkerType> worker_types;
  std::vector<Worker> workers;
  // tier_links[a][b] for a < b: traffic from tier a to tier b (data never flows downwards).
  std::vector<std::vector<std::optional<Link>>> tier_links;
  // latency[operator][variant][worker type]; empty = the variant cannot run on that type.
  std::vector<std::vector<std::vector<std::optional<LatencyProfile>>>> latency;
  Objective objective;
  OptimizerOptions options;

  // Derived by validation.
  std::vector<int> topological_order;       // every operator, sources first
  std::vector<std::vector<int>> in_edges;   // edge indices per operator
  std::vector<std::vector<int>> out_edges;  // edge indices per operator
  std::vector<double> rate;                 // requests per second processed by each operator

  int FindOperator(std::string_view name) const;  // -1 when absent
  int FindVariant(int op, std::string_view variant) const;
  int FindWorker(std::string_view name) const;
  int FindTier(std::string_view name) const;
};

// Parses and validates the JSON text of a placement input. Errors name the offending element, e.g.
// "workflow.edges[3].to: unknown operator 'VQ'".
absl::StatusOr<Problem> ParseProblem(std::string_view json_text);
absl::StatusOr<Problem> LoadProblem(const std::string& path);

// Serialises a problem back to the JSON input format (derived fields omitted).
std::string ProblemToJson(const Problem& problem);

// Requests per second a worker can serve for (operator, variant): 1000 / latency at the chosen
// percentile, times the tier's locations when the tier is replicated; 0 when it cannot run there.
double WorkerThroughput(const Problem& problem, int op, int variant, int worker);
// Price per hour of a worker, times the tier's locations when the tier is replicated.
double WorkerPrice(const Problem& problem, int worker);

// Parses "decimal"/"binary" and "proportional"/"fill_in_order" ("fill-in-order" too).
absl::StatusOr<ByteUnits> ParseByteUnits(std::string_view name);
absl::StatusOr<ShareRule> ParseShareRule(std::string_view name);

}  // namespace plexus::placement
