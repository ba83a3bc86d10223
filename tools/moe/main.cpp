// plexus-moe: Lazarus expert planning, recovery analysis, dispatch, reconfiguration and
// spot-trace simulation from the command line. JSON in, a readable table or --json out.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fmt/core.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/moe/allocation.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/reconfigure.hpp"
#include "plexus/moe/recovery.hpp"
#include "plexus/moe/scenario.hpp"
#include "plexus/moe/simulator.hpp"
#include "plexus/tooling/cli.hpp"

namespace moe = plexus::moe;
namespace json_reader = plexus::base::json;
using nlohmann::json;

namespace {

constexpr char kDescription[] =
    "Lazarus expert planning, recovery analysis, dispatch, reconfiguration and spot-trace\n"
    "simulation. Scenarios and schedules are described in docs/moe.md; examples in\n";

// Plans hold nodes x slots_per_node expert slots per layer; more than this does not fit in the
// memory of a machine that runs the tool (1e8 nodes died with std::bad_alloc).
constexpr int64_t kMaxPlanSlots = 50'000'000;
// Monte Carlo draws of `recovery`, and nodes joining in `reconfigure` (a scenario's own limit).
constexpr int kMaxSamples = 100'000'000;
constexpr int kMaxJoin = 1'000'000;

struct Args {
  std::string command;
  std::map<std::string, std::string> options;
  bool json = false;
  bool cuda = false;
};

const plexus::tooling::Tool* g_tool = nullptr;

int Fail(const std::string& message) { return g_tool->Fail(message); }

int Fail(const absl::Status& status) { return Fail(std::string(status.message())); }

std::string Opt(const Args& a, const std::string& key, const std::string& fallback = "") {
  auto it = a.options.find(key);
  return it == a.options.end() || it->second.empty() ? fallback : it->second;
}

// Option errors are usage errors (exit 2), like those CLI11 finds.
int Usage(const absl::Status& status) { return g_tool->Usage(std::string(status.message())); }

// An integer option within [min, max] (tooling::ParseInteger: garbage and out-of-range values
// are told apart and the range named), or `fallback` when absent.
absl::StatusOr<int> IntOpt(const Args& a, const std::string& key, int fallback, int min = 0,
                           int max = std::numeric_limits<int>::max()) {
  const std::string text = Opt(a, key);
  if (text.empty()) return fallback;
  PLEXUS_ASSIGN_OR_RETURN(int64_t value, plexus::tooling::ParseInteger("--" + key, text, min, max));
  return static_cast<int>(value);
}

absl::StatusOr<moe::Scenario> ScenarioOpt(const Args& a) {
  const std::string path = Opt(a, "scenario");
  if (path.empty()) return absl::InvalidArgumentError("--scenario FILE is required");
  return moe::LoadScenario(path);
}

// A plan over `nodes` nodes must fit in memory (a product of the flags and the scenario).
absl::Status CheckPlanSize(const moe::Scenario& s, int64_t nodes) {
  const int64_t slots = nodes * s.slots_per_node * static_cast<int64_t>(s.layer_loads.size());
  if (slots > kMaxPlanSlots) {
    return absl::InvalidArgumentError(fmt::format(
        "{} nodes x {} slots x {} layers = {} expert slots; at most {} fit (use fewer nodes)",
        nodes, s.slots_per_node, s.layer_loads.size(), slots, kMaxPlanSlots));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<moe::Placement>> PlanLayers(const moe::Scenario& s, int nodes,
                                                       moe::PlacementPolicy policy,
                                                       std::vector<moe::Allocation>* allocs,
                                                       int failures = 1) {
  if (nodes < 1) return absl::InvalidArgumentError("num_nodes must be positive");
  PLEXUS_RETURN_IF_ERROR(CheckPlanSize(s, nodes));
  std::vector<moe::Placement> layers;
  for (size_t l = 0; l < s.layer_loads.size(); ++l) {
    absl::StatusOr<moe::Allocation> a =
        moe::AllocateReplicas(s.layer_loads[l], {nodes, s.slots_per_node, s.min_replicas});
    if (!a.ok()) {
      return absl::Status(a.status().code(),
                          "layer " + std::to_string(l) + ": " + std::string(a.status().message()));
    }
    PLEXUS_ASSIGN_OR_RETURN(
        moe::Placement p,
        moe::PlaceExperts(policy, a->replicas, nodes, s.slots_per_node, a->ascending, failures));
    layers.push_back(std::move(p));
    if (allocs) allocs->push_back(*std::move(a));
  }
  return layers;
}

int CmdPlan(const Args& a) {
  absl::StatusOr<moe::Scenario> s = ScenarioOpt(a);
  if (!s.ok()) return Fail(s.status());
  absl::StatusOr<int> nodes = IntOpt(a, "nodes", s->nodes, 1);
  if (!nodes.ok()) return Usage(nodes.status());
  absl::StatusOr<moe::PlacementPolicy> policy = moe::ParsePlacementPolicy(Opt(a, "policy", "best"));
  if (!policy.ok()) return Fail(policy.status());
  std::vector<moe::Allocation> allocs;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<moe::Placement>> layers = PlanLayers(*s, *nodes, *policy, &allocs);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!layers.ok()) return Fail(layers.status());
  if (a.json) {
    json out = {{"scenario", s->name},
                {"nodes", *nodes},
                {"slots_per_node", s->slots_per_node},
                {"policy", moe::PlacementPolicyName(*policy)},
                {"plan_ms", ms}};
    for (size_t l = 0; l < layers->size(); ++l) {
      out["layers"].push_back({{"replicas", allocs[l].replicas},
                               {"min_replicas", allocs[l].min_replicas},
                               {"min_replicas_lowered", allocs[l].min_replicas_lowered},
                               {"node_slots", (*layers)[l].node_slots}});
    }
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  fmt::print("{}: {} nodes x {} slots, {} experts, {} layers, {} placement ({:.2f} ms)\n", s->name,
             *nodes, s->slots_per_node, s->num_experts(), layers->size(),
             moe::PlacementPolicyName(*policy), ms);
  for (size_t l = 0; l < layers->size(); ++l) {
    std::string reps;
    for (int r : allocs[l].replicas) reps += fmt::format(" {:>2}", r);
    fmt::print("layer {:>2} replicas{}{}\n", l, reps,
               allocs[l].min_replicas_lowered ? "  (f lowered)" : "");
    for (int n = 0; n < (*layers)[l].num_nodes; ++n) {
      std::string slots;
      for (int e : (*layers)[l].node_slots[n]) slots += fmt::format("{:>3}", e);
      fmt::print("   node {:>3}:{}\n", n, slots);
    }
  }
  return 0;
}

json RecoveryJson(const moe::RecoveryResult& r) {
  return {{"probability", r.probability}, {"ci_low", r.ci_low},
          {"ci_high", r.ci_high},         {"exact", r.exact},
          {"method", r.method},           {"recovering_sets", r.recovering_sets},
          {"total_sets", r.total_sets},   {"samples", r.samples}};
}

int CmdRecovery(const Args& a) {
  absl::StatusOr<moe::Scenario> s = ScenarioOpt(a);
  if (!s.ok()) return Fail(s.status());
  absl::StatusOr<int> nodes = IntOpt(a, "nodes", s->nodes, 1);
  absl::StatusOr<int> failures = IntOpt(a, "failures", -1);
  absl::StatusOr<int> samples = IntOpt(a, "samples", 200000, 1, kMaxSamples);
  if (!nodes.ok()) return Usage(nodes.status());
  if (!failures.ok()) return Usage(failures.status());
  if (!samples.ok()) return Usage(samples.status());
  if (*failures < 0) return Fail("--failures K (>= 0) is required");
  if (*failures > *nodes) {
    return Fail(fmt::format("--failures {} exceeds the {} nodes", *failures, *nodes));
  }
  const std::string which = Opt(a, "policy", "all");
  const std::string method = Opt(a, "method", "auto");
  std::vector<moe::PlacementPolicy> policies;
  if (which == "all") {
    policies = {moe::PlacementPolicy::kBest, moe::PlacementPolicy::kMro,
                moe::PlacementPolicy::kSpread, moe::PlacementPolicy::kCompact};
  } else {
    absl::StatusOr<moe::PlacementPolicy> p = moe::ParsePlacementPolicy(which);
    if (!p.ok()) return Fail(p.status());
    policies = {*p};
  }
  json out = {{"scenario", s->name}, {"nodes", *nodes}, {"failures", *failures}};
  // The table is printed only once every row is computed: an error must not leave half of it.
  std::string table = fmt::format("{}: {} of {} nodes fail, {} layers\n", s->name, *failures,
                                  *nodes, s->layer_loads.size()) +
                      fmt::format("{:<8} {:>10} {:>21} {:>12} {:>13}\n", "policy", "recovery",
                                  "95% interval", "method", "layer mean");
  for (moe::PlacementPolicy policy : policies) {
    absl::StatusOr<std::vector<moe::Placement>> layers =
        PlanLayers(*s, *nodes, policy, nullptr, *failures);
    if (!layers.ok()) return Fail(layers.status());
    absl::StatusOr<moe::RecoveryResult> r;
    if (method == "auto") {
      r = moe::RecoveryProbability(*layers, *failures);
    } else if (method == "closed") {
      r = moe::RecoveryClosedForm(*layers, *failures);
    } else if (method == "enumerate") {
      r = moe::RecoveryEnumerate(*layers, *failures);
    } else if (method == "montecarlo") {
      r = moe::RecoveryMonteCarlo(*layers, *failures, *samples);
    } else {
      return Fail("--method must be auto, closed, enumerate or montecarlo");
    }
    if (!r.ok()) return Fail(r.status());
    double layer_mean = 0;
    for (const moe::Placement& p : *layers) {
      absl::StatusOr<moe::RecoveryResult> one = moe::RecoveryProbability({p}, *failures);
      if (!one.ok()) return Fail(one.status());
      layer_mean += one->probability / static_cast<double>(layers->size());
    }
    json entry = RecoveryJson(*r);
    entry["layer_mean"] = layer_mean;
    out["policies"][moe::PlacementPolicyName(policy)] = entry;
    table += fmt::format("{:<8} {:>10.4f}    [{:.4f}, {:.4f}] {:>12} {:>13.4f}\n",
                         moe::PlacementPolicyName(policy), r->probability, r->ci_low, r->ci_high,
                         r->method, layer_mean);
  }
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::fputs(table.c_str(), stdout);
  }
  return 0;
}

absl::StatusOr<moe::DispatchInput> DispatchInputFromFile(const std::string& path) {
  PLEXUS_ASSIGN_OR_RETURN(std::string text, plexus::base::ReadFile(path));
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(path + ": not a JSON object");
  }
  moe::DispatchInput in;
  try {
    in.num_experts = doc.at("num_experts").get<int>();
    in.num_ranks = doc.at("num_ranks").get<int>();
    const json& tokens = doc.at("tokens");
    const json& replicas = doc.at("replicas");
    if (!tokens.is_array() || !replicas.is_array() ||
        static_cast<int>(tokens.size()) != in.num_experts ||
        static_cast<int>(replicas.size()) != in.num_experts) {
      return absl::InvalidArgumentError(path +
                                        ": tokens and replicas must be arrays of num_experts rows");
    }
    for (int e = 0; e < in.num_experts; ++e) {
      if (static_cast<int>(tokens[e].size()) != in.num_ranks ||
          static_cast<int>(replicas[e].size()) != in.num_ranks) {
        return absl::InvalidArgumentError(path + ": row " + std::to_string(e) +
                                          " must have num_ranks entries");
      }
      for (int j = 0; j < in.num_ranks; ++j) {
        const std::string at = absl::StrCat("[", e, "][", j, "]");
        absl::StatusOr<int64_t> t =
            json_reader::IntegerValue(tokens[e][j], "tokens" + at, 0, moe::kMaxTokensPerExpert);
        if (!t.ok()) return plexus::base::Annotate(t.status(), path);
        absl::StatusOr<int64_t> r = json_reader::IntegerValue(replicas[e][j], "replicas" + at, 0,
                                                              std::numeric_limits<int>::max());
        if (!r.ok()) return plexus::base::Annotate(r.status(), path);
        in.tokens.push_back(*t);
        in.replicas.push_back(static_cast<int>(*r));
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(path + ": " + e.what() +
                                      " (expected num_experts, num_ranks, tokens, replicas)");
  }
  return in;
}

int CmdDispatch(const Args& a) {
  moe::DispatchInput in;
  if (!Opt(a, "input").empty()) {
    absl::StatusOr<moe::DispatchInput> parsed = DispatchInputFromFile(Opt(a, "input"));
    if (!parsed.ok()) return Fail(parsed.status());
    in = *std::move(parsed);
  } else {
    if (Opt(a, "scenario").empty()) return Fail("--input FILE or --scenario FILE is required");
    absl::StatusOr<moe::Scenario> s = ScenarioOpt(a);
    if (!s.ok()) return Fail(s.status());  // the file's own error: empty, a directory, no load
    absl::StatusOr<int> layer = IntOpt(a, "layer", 0);
    absl::StatusOr<int> per_rank = IntOpt(a, "tokens-per-rank", 4096);
    if (!layer.ok()) return Usage(layer.status());
    if (!per_rank.ok()) return Usage(per_rank.status());
    if (*layer < 0 || *layer >= static_cast<int>(s->layer_loads.size())) {
      return Fail(fmt::format("--layer must be in [0, {})", s->layer_loads.size()));
    }
    if (*per_rank < 0) return Fail("--tokens-per-rank must be >= 0");
    std::vector<moe::Allocation> allocs;
    absl::StatusOr<std::vector<moe::Placement>> layers =
        PlanLayers(*s, s->nodes, moe::PlacementPolicy::kMro, &allocs);
    if (!layers.ok()) return Fail(layers.status());
    const auto& loads = s->layer_loads[*layer];
    double sum = 0;
    for (double l : loads) sum += l;
    in.num_experts = s->num_experts();
    in.num_ranks = s->nodes;
    in.replicas = (*layers)[*layer].ReplicaMatrix();
    for (int e = 0; e < in.num_experts; ++e) {
      for (int j = 0; j < in.num_ranks; ++j) {
        in.tokens.push_back(static_cast<int64_t>(loads[e] / sum * *per_rank));
      }
    }
  }
  absl::StatusOr<moe::DispatchPlan> plan = moe::ComputeDispatch(in);
  if (!plan.ok()) return Fail(plan.status());
  json out = {{"num_experts", in.num_experts}, {"num_ranks", in.num_ranks}};
  if (a.cuda) {
    absl::StatusOr<std::vector<int64_t>> dense = moe::ComputeDispatchDenseCuda(in);
    if (!dense.ok()) return Fail(dense.status());
    out["cuda_matches_cpu"] = *dense == moe::DenseFlows(*plan);
  }
  for (int j = 0; j < in.num_ranks; ++j) {
    const moe::RankExchange ex = moe::ExtractRankExchange(*plan, j);
    out["ranks"].push_back({{"rank", j},
                            {"local", ex.local},
                            {"processed", ex.processed},
                            {"send_counts", ex.send_counts},
                            {"send_offsets", ex.send_offsets},
                            {"recv_counts", ex.recv_counts},
                            {"recv_offsets", ex.recv_offsets}});
  }
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  fmt::print(
      "{} experts on {} ranks{}\n", in.num_experts, in.num_ranks,
      a.cuda ? fmt::format(", CUDA matches CPU: {}", out["cuda_matches_cpu"].get<bool>()) : "");
  fmt::print("{:>5} {:>10} {:>10} {:>10}  send counts\n", "rank", "processed", "sent", "received");
  for (const json& r : out["ranks"]) {
    int64_t sent = 0, received = 0;
    std::string counts;
    for (int64_t c : r["send_counts"]) {
      sent += c;
      counts += fmt::format(" {}", c);
    }
    for (int64_t c : r["recv_counts"]) received += c;
    fmt::print("{:>5} {:>10} {:>10} {:>10}  [{} ]\n", r["rank"].get<int>(),
               r["processed"].get<int64_t>(), sent, received, counts);
  }
  return 0;
}

// The reconfiguration as JSON, built only for --json: a plan for many joining nodes has
// millions of transfers, and a JSON object each costs far more memory than the plan itself.
json ReconfigureJson(const moe::Scenario& s, const std::vector<int>& failed, int join,
                     const std::string& assignment, const moe::ReconfigurePlan& p) {
  json out = {{"scenario", s.name},
              {"failed", failed},
              {"joined", join},
              {"assignment", assignment},
              {"physical_of_plan_node", p.physical},
              {"newly_assigned", p.newly_assigned},
              {"bytes_moved", p.bytes_moved},
              {"needs_checkpoint_restart", p.needs_checkpoint_restart()}};
  out["lost_experts"] = json::array();
  for (const auto& [l, e] : p.lost_experts) out["lost_experts"].push_back({l, e});
  out["transfers"] = json::array();
  for (const moe::ExpertTransfer& t : p.transfers) {
    out["transfers"].push_back({{"layer", t.layer},
                                {"expert", t.expert},
                                {"src", t.src_physical},
                                {"dst", t.dst_physical},
                                {"bytes", t.bytes}});
  }
  return out;
}

int CmdReconfigure(const Args& a) {
  absl::StatusOr<moe::Scenario> s = ScenarioOpt(a);
  if (!s.ok()) return Fail(s.status());
  absl::StatusOr<int> join = IntOpt(a, "join", 0, 0, kMaxJoin);
  if (!join.ok()) return Usage(join.status());
  std::vector<int> failed;
  for (absl::string_view part : absl::StrSplit(Opt(a, "fail"), ',', absl::SkipEmpty())) {
    absl::StatusOr<int64_t> node = plexus::tooling::ParseInteger(
        "--fail", std::string(part.data(), part.size()), 0, s->nodes - 1);
    if (!node.ok()) return Usage(node.status());
    if (std::find(failed.begin(), failed.end(), *node) != failed.end()) {
      return g_tool->Usage(fmt::format("--fail names node {} twice", *node));
    }
    failed.push_back(static_cast<int>(*node));
  }
  if (failed.empty() && *join == 0) return Fail("give --fail I,J,... and/or --join K");
  if (absl::Status size = CheckPlanSize(*s, int64_t{s->nodes} + *join); !size.ok()) {
    return Fail(size);
  }
  moe::ReconfigureInput in;
  absl::StatusOr<std::vector<moe::Placement>> layers =
      PlanLayers(*s, s->nodes, moe::PlacementPolicy::kMro, nullptr);
  if (!layers.ok()) return Fail(layers.status());
  in.current = *layers;
  for (int n = 0; n < s->nodes; ++n) {
    in.current_physical.push_back(n);
    if (std::find(failed.begin(), failed.end(), n) == failed.end()) in.new_physical.push_back(n);
  }
  for (int j = 0; j < *join; ++j) in.new_physical.push_back(s->nodes + j);
  in.layer_loads = s->layer_loads;
  in.slots_per_node = s->slots_per_node;
  in.min_replicas = s->min_replicas;
  in.expert_state_bytes = s->training.expert_state_bytes;
  const std::string assignment = Opt(a, "assignment", "greedy");
  if (assignment == "optimal") {
    in.assignment = moe::AssignmentMethod::kOptimal;
  } else if (assignment != "greedy") {
    return Fail("--assignment must be greedy or optimal");
  }
  absl::StatusOr<moe::ReconfigurePlan> plan = moe::PlanReconfiguration(in);
  if (!plan.ok()) return Fail(plan.status());
  if (a.json) {
    std::printf("%s\n", ReconfigureJson(*s, failed, *join, assignment, *plan).dump(1).c_str());
    return 0;
  }
  fmt::print("{}: {} failed, {} joined -> {} nodes ({} assignment)\n", s->name, failed.size(),
             *join, plan->physical.size(), assignment);
  std::string mapping;
  for (size_t q = 0; q < plan->physical.size(); ++q) {
    mapping += fmt::format(" {}->{}", plan->physical[q], q);
  }
  fmt::print("physical->plan node:{}\n", mapping);
  fmt::print("newly assigned experts: {}, transfers: {}, bytes moved: {:.1f} MiB\n",
             plan->newly_assigned, plan->transfers.size(), plan->bytes_moved / 1048576.0);
  if (plan->needs_checkpoint_restart()) {
    fmt::print("{} experts lost every replica: restart from the checkpoint\n",
               plan->lost_experts.size());
  }
  return 0;
}

int CmdSimulate(const Args& a) {
  absl::StatusOr<moe::Scenario> s = ScenarioOpt(a);
  if (!s.ok()) return Fail(s.status());
  const std::string schedule_path = Opt(a, "schedule");
  if (schedule_path.empty()) return Fail("--schedule FILE is required");
  absl::StatusOr<moe::Schedule> schedule = moe::LoadSchedule(schedule_path);
  if (!schedule.ok()) return Fail(schedule.status());
  moe::SimulationOptions options;
  absl::StatusOr<double> interval =
      plexus::tooling::ParseReal("--interval", Opt(a, "interval", "60"), 0.001, 1e9);
  if (!interval.ok()) return Usage(interval.status());
  options.timeline_interval_s = *interval;
  std::vector<moe::SystemKind> systems;
  const std::string which = Opt(a, "system", "all");
  if (which == "all") {
    systems = {moe::SystemKind::kLazarus, moe::SystemKind::kCheckpointRestart,
               moe::SystemKind::kEpReconfigure};
  } else {
    absl::StatusOr<moe::SystemKind> k = moe::ParseSystemKind(which);
    if (!k.ok()) return Fail(k.status());
    systems = {*k};
  }
  json out = {{"scenario", s->name},
              {"schedule", schedule->name},
              {"duration_s", schedule->end_s},
              {"events", schedule->events.size()}};
  std::vector<moe::SimulationResult> results;
  for (moe::SystemKind kind : systems) {
    std::fprintf(stderr, "simulating %s over %.0f s of %s...\n", moe::SystemKindName(kind),
                 schedule->end_s, schedule->name.c_str());
    absl::StatusOr<moe::SimulationResult> r = moe::Simulate(*s, *schedule, kind, options);
    if (!r.ok()) return Fail(r.status());
    json timeline = json::array();
    for (const moe::TimelinePoint& p : r->timeline) {
      timeline.push_back({p.time_s, p.samples, p.active_nodes});
    }
    out["systems"][moe::SystemKindName(kind)] = {
        {"samples", r->samples},
        {"steps", r->steps},
        {"samples_per_s", r->duration_s > 0 ? r->samples / r->duration_s : 0},
        {"failures", r->failures},
        {"reconfigurations", r->reconfigurations},
        {"restarts", r->restarts},
        {"scale_ups", r->scale_ups},
        {"lost_samples", r->lost_samples},
        {"idle_s", r->idle_s},
        {"overhead_s", r->overhead_s},
        {"mean_nodes_in_use", r->mean_active_nodes},
        {"timeline_columns", {"time_s", "samples", "nodes_in_use"}},
        {"timeline", timeline}};
    results.push_back(*std::move(r));
  }
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  fmt::print("{} on {} ({:.1f} h, {} events)\n", s->name, schedule->name, schedule->end_s / 3600.0,
             schedule->events.size());
  fmt::print("{:<20} {:>12} {:>9} {:>9} {:>9} {:>12} {:>10} {:>8}\n", "system", "samples",
             "failures", "reconfig", "restarts", "lost", "overhead", "nodes");
  for (const moe::SimulationResult& r : results) {
    fmt::print("{:<20} {:>12.0f} {:>9} {:>9} {:>9} {:>12.0f} {:>9.0f}s {:>8.2f}\n",
               moe::SystemKindName(r.system), r.samples, r.failures, r.reconfigurations, r.restarts,
               r.lost_samples, r.overhead_s, r.mean_active_nodes);
  }
  if (results.size() > 1 && results[1].samples > 0) {
    fmt::print("lazarus / checkpoint_restart samples: {:.2f}x\n",
               results[0].samples / results[1].samples);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool("plexus-moe",
                             absl::StrCat(kDescription, plexus::tooling::DataDir(), "/moe."));
  g_tool = &tool;
  tool.app().require_subcommand(1);
  Args args;
  // Every option is kept as text here and parsed strictly by the command (IntOpt, ...).
  // The scenario file is positional, as the input file of every Plexus tool is (plexus-place
  // run IN.json, plexus-reorder cost MATRIX.json); --scenario FILE is accepted too.
  auto option = [&](CLI::App* sub, const std::string& name, const std::string& help) {
    sub->add_option(name == "scenario" ? "scenario,--scenario" : "--" + name, args.options[name],
                    help);
  };
  struct Command {
    const char* name;
    const char* help;
    std::vector<std::pair<const char*, const char*>> options;
  };
  const std::vector<Command> commands = {
      {"plan",
       "replicas per expert (Eq. 6.1) and the placement of every layer",
       {{"scenario", "scenario FILE (required)"},
        {"nodes", "number of nodes (default: the scenario's)"},
        {"policy", "best|mro|spread|compact|exact (default best: never below the others)"}}},
      {"recovery",
       "probability that training survives K random node failures without a restart",
       {{"scenario", "scenario FILE (required)"},
        {"failures", "K failed nodes (required)"},
        {"nodes", "number of nodes (default: the scenario's)"},
        {"policy", "all|best|mro|spread|compact|exact (default all but exact)"},
        {"method", "auto|closed|enumerate|montecarlo (default auto)"},
        {"samples", "Monte Carlo samples"}}},
      {"dispatch",
       "per-rank local tokens and all-to-all counts/offsets (Algorithm 2)",
       {{"input", "dispatch input FILE"},
        {"scenario", "scenario FILE (instead of --input)"},
        {"layer", "layer L of the scenario (default 0)"},
        {"tokens-per-rank", "T tokens per rank (default 4096)"}}},
      {"reconfigure",
       "new plan, node mapping and expert transfers after failures/joins",
       {{"scenario", "scenario FILE (required)"},
        {"fail", "failed nodes I,J,..."},
        {"join", "K joining nodes"},
        {"assignment", "greedy|optimal (default greedy)"}}},
      {"simulate",
       "samples trained over time for Lazarus and the checkpoint-restart baselines",
       {{"scenario", "scenario FILE (required)"},
        {"schedule", "FILE: .csv spot trace or .json schedule (required)"},
        {"system", "all|lazarus|checkpoint_restart|ep_reconfigure (default all)"},
        {"interval", "timeline interval in seconds (default 60)"}}},
  };
  std::vector<CLI::App*> subs;
  for (const Command& c : commands) {
    CLI::App* sub = tool.Subcommand(c.name, c.help);
    for (const auto& [name, help] : c.options) option(sub, name, help);
    plexus::tooling::AddJsonFlag(sub, &args.json);
    if (std::string(c.name) == "dispatch") {
      sub->add_flag("--cuda", args.cuda, "also compute the dense flows on the GPU and compare");
    }
    subs.push_back(sub);
  }
  if (auto code = tool.Parse(argc, argv)) return *code;
  for (CLI::App* sub : subs) {
    if (sub->parsed()) args.command = sub->get_name();
  }
  if (args.command == "plan") return CmdPlan(args);
  if (args.command == "recovery") return CmdRecovery(args);
  if (args.command == "dispatch") return CmdDispatch(args);
  if (args.command == "reconfigure") return CmdReconfigure(args);
  return CmdSimulate(args);
}
