#include "plexus/moe/scenario.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::moe {
namespace {

using nlohmann::json;

absl::StatusOr<json> ParseJson(const std::string& text, const char* what) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty (", text.size(), " bytes): expected a JSON object"));
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a JSON object"));
  }
  return doc;
}

// Above this a scenario's times, rates and sizes overflow the simulator's sums (1e308 printed
// inf).
constexpr double kMaxNumber = 1e15;

// Reads an optional number field; InvalidArgument when present with the wrong type or range.
template <typename T>
absl::Status ReadNumber(const json& obj, const char* key, T* out, double min_value,
                        const std::string& context) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(context, ".", key, " must be a number"));
  }
  const double value = it->template get<double>();
  if (!std::isfinite(value) || value < min_value || value > kMaxNumber) {
    return absl::InvalidArgumentError(absl::StrCat(context, ".", key, " must be in ", min_value,
                                                   "..", kMaxNumber, " (got ", value, ")"));
  }
  if constexpr (std::is_integral_v<T>) {
    if (value != std::floor(value) || value > 2e9) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ".", key, " must be an integer below 2e9 (got ", value, ")"));
    }
  }
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

using base::json::CheckKeys;

// The most nodes a scenario may have: the plans hold nodes x slots_per_node entries per layer.
constexpr int kMaxNodes = 1'000'000;

}  // namespace

absl::StatusOr<Scenario> ParseScenario(const std::string& json_text) {
  PLEXUS_ASSIGN_OR_RETURN(json doc, ParseJson(json_text, "scenario"));
  Scenario s;
  PLEXUS_RETURN_IF_ERROR(CheckKeys(doc, "scenario",
                                   {"name", "description", "nodes", "slots_per_node",
                                    "min_replicas", "layer_loads", "training"}));
  if (doc.contains("name") && doc["name"].is_string()) s.name = doc["name"];
  if (doc.contains("description") && doc["description"].is_string()) {
    s.description = doc["description"];
  }
  for (const char* key : {"nodes", "slots_per_node", "layer_loads"}) {
    if (!doc.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("scenario is missing \"", key, "\""));
    }
  }
  PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "nodes", &s.nodes, 1, "scenario"));
  PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "slots_per_node", &s.slots_per_node, 1, "scenario"));
  PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "min_replicas", &s.min_replicas, 1, "scenario"));
  if (s.nodes > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("scenario.nodes must be at most ", kMaxNodes, " (got ", s.nodes, ")"));
  }
  const json& layers = doc["layer_loads"];
  if (!layers.is_array() || layers.empty()) {
    return absl::InvalidArgumentError("scenario.layer_loads must be a non-empty array of arrays");
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].is_array() || layers[l].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scenario.layer_loads[", l, "] must be a non-empty array of numbers"));
    }
    std::vector<double> loads;
    double total = 0;
    for (size_t e = 0; e < layers[l].size(); ++e) {
      const json& v = layers[l][e];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("scenario.layer_loads[", l, "][", e, "] must be a finite number >= 0"));
      }
      loads.push_back(v.get<double>());
      total += loads.back();
    }
    if (total <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("scenario.layer_loads[", l, "] sums to zero"));
    }
    if (!s.layer_loads.empty() && loads.size() != s.layer_loads[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("scenario.layer_loads[", l, "] has ",
                                                     loads.size(), " experts, layer 0 has ",
                                                     s.layer_loads[0].size()));
    }
    s.layer_loads.push_back(std::move(loads));
  }
  if (int64_t{s.nodes} * s.slots_per_node < s.num_experts()) {
    return absl::InvalidArgumentError(absl::StrCat("scenario: ", s.nodes, " nodes x ",
                                                   s.slots_per_node, " slots cannot hold ",
                                                   s.num_experts(), " experts"));
  }
  s.training.max_nodes = s.nodes;
  if (doc.contains("training")) {
    const json& t = doc["training"];
    if (!t.is_object()) return absl::InvalidArgumentError("scenario.training must be an object");
    TrainingModel& m = s.training;
    const std::string ctx = "scenario.training";
    PLEXUS_RETURN_IF_ERROR(
        CheckKeys(t, ctx,
                  {"samples_per_step", "tokens_per_sample", "seconds_per_token", "fixed_step_s",
                   "checkpoint_every_steps", "checkpoint_s", "restart_s", "reconfigure_s",
                   "bandwidth_bytes_per_s", "expert_state_bytes", "ep_size", "scale_up_wait_s",
                   "max_nodes"}));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "samples_per_step", &m.samples_per_step, 1, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "tokens_per_sample", &m.tokens_per_sample, 1, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "seconds_per_token", &m.seconds_per_token, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "fixed_step_s", &m.fixed_step_s, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(
        ReadNumber(t, "checkpoint_every_steps", &m.checkpoint_every_steps, 1, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "checkpoint_s", &m.checkpoint_s, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "restart_s", &m.restart_s, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "reconfigure_s", &m.reconfigure_s, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(
        ReadNumber(t, "bandwidth_bytes_per_s", &m.bandwidth_bytes_per_s, 1, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "expert_state_bytes", &m.expert_state_bytes, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "ep_size", &m.ep_size, 1, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "scale_up_wait_s", &m.scale_up_wait_s, 0, ctx));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(t, "max_nodes", &m.max_nodes, 1, ctx));
    if (m.seconds_per_token <= 0 && m.fixed_step_s <= 0) {
      return absl::InvalidArgumentError(
          "scenario.training: seconds_per_token and fixed_step_s cannot both be zero");
    }
    if (m.samples_per_step * m.tokens_per_sample > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(
          "scenario.training: samples_per_step x tokens_per_sample must stay below 2^31");
    }
  }
  if (s.num_experts() % s.training.ep_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("scenario.training.ep_size ", s.training.ep_size,
                                                   " must divide the ", s.num_experts(),
                                                   " experts"));
  }
  return s;
}

absl::StatusOr<Scenario> LoadScenario(const std::string& path) {
  PLEXUS_ASSIGN_OR_RETURN(std::string text, base::ReadFile(path));
  absl::StatusOr<Scenario> s = ParseScenario(text);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat(path, ": ", std::string(s.status().message())));
  }
  return s;
}

namespace {

// Checks that removals name present nodes and additions absent ones, in time order.
absl::Status CheckEvents(const Schedule& schedule) {
  std::vector<std::string> present;
  double last = 0;
  for (size_t i = 0; i < schedule.events.size(); ++i) {
    const NodeEvent& ev = schedule.events[i];
    if (!std::isfinite(ev.time_s) || ev.time_s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("event ", i, ": time must be >= 0"));
    }
    if (ev.time_s < last) {
      return absl::InvalidArgumentError(absl::StrCat("event ", i, ": times must not decrease (",
                                                     ev.time_s, " after ", last, ")"));
    }
    last = ev.time_s;
    if (ev.node.empty()) return absl::InvalidArgumentError(absl::StrCat("event ", i, ": no node"));
    auto it = std::find(present.begin(), present.end(), ev.node);
    if (ev.add) {
      if (it != present.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("event ", i, ": node '", ev.node, "' added twice"));
      }
      present.push_back(ev.node);
    } else {
      if (it == present.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("event ", i, ": node '", ev.node, "' removed but not present"));
      }
      present.erase(it);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> ParseSpotTrace(const std::string& csv_text) {
  Schedule schedule;
  schedule.name = "spot-trace";
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(csv_text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no,
                                                     ": expected time_ms,add|remove,node (got '",
                                                     std::string(line.data(), line.size()), "')"));
    }
    double ms = 0;
    if (!absl::SimpleAtod(fields[0], &ms) || !std::isfinite(ms) || ms < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace line ", line_no, ": bad time '",
                       std::string(fields[0].data(), fields[0].size()), "'"));
    }
    const absl::string_view op = absl::StripAsciiWhitespace(fields[1]);
    NodeEvent ev;
    ev.time_s = ms / 1000.0;
    if (op == "add") {
      ev.add = true;
    } else if (op == "remove") {
      ev.add = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no,
                                                     ": operation must be add or remove (got '",
                                                     std::string(op.data(), op.size()), "')"));
    }
    const absl::string_view node = absl::StripAsciiWhitespace(fields[2]);
    ev.node = std::string(node.data(), node.size());
    schedule.events.push_back(std::move(ev));
  }
  if (schedule.events.empty()) return absl::InvalidArgumentError("trace has no events");
  if (absl::Status s = CheckEvents(schedule); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("trace: ", std::string(s.message())));
  }
  schedule.end_s = schedule.events.back().time_s;
  return schedule;
}

absl::StatusOr<Schedule> ParseSchedule(const std::string& json_text) {
  PLEXUS_ASSIGN_OR_RETURN(json doc, ParseJson(json_text, "schedule"));
  Schedule schedule;
  PLEXUS_RETURN_IF_ERROR(CheckKeys(doc, "schedule",
                                   {"name", "description", "end_s", "events", "steps",
                                    "fail_every_s", "initial_nodes", "replace_after_s"}));
  if (doc.contains("name") && doc["name"].is_string()) schedule.name = doc["name"];
  PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "end_s", &schedule.end_s, 0, "schedule"));
  if (doc.contains("events")) {
    const json& events = doc["events"];
    if (!events.is_array()) return absl::InvalidArgumentError("schedule.events must be an array");
    for (size_t i = 0; i < events.size(); ++i) {
      const json& e = events[i];
      const std::string ctx = absl::StrCat("schedule.events[", i, "]");
      if (!e.is_object() || !e.contains("op") || !e["op"].is_string() || !e.contains("node") ||
          !e["node"].is_string() || !e.contains("time_s")) {
        return absl::InvalidArgumentError(
            absl::StrCat(ctx, " needs time_s, op (\"add\"/\"remove\") and node"));
      }
      PLEXUS_RETURN_IF_ERROR(CheckKeys(e, ctx, {"time_s", "op", "node"}));
      NodeEvent ev;
      PLEXUS_RETURN_IF_ERROR(ReadNumber(e, "time_s", &ev.time_s, 0, ctx));
      const std::string op = e["op"];
      if (op != "add" && op != "remove") {
        return absl::InvalidArgumentError(absl::StrCat(ctx, ".op must be add or remove"));
      }
      ev.add = op == "add";
      ev.node = e["node"];
      schedule.events.push_back(std::move(ev));
    }
  } else if (doc.contains("steps")) {
    const json& steps = doc["steps"];
    if (!steps.is_array() || steps.empty()) {
      return absl::InvalidArgumentError("schedule.steps must be a non-empty array");
    }
    int present = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string ctx = absl::StrCat("schedule.steps[", i, "]");
      if (!steps[i].is_object() || !steps[i].contains("time_s") || !steps[i].contains("nodes")) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, " needs time_s and nodes"));
      }
      PLEXUS_RETURN_IF_ERROR(CheckKeys(steps[i], ctx, {"time_s", "nodes"}));
      double time = 0;
      int nodes = 0;
      PLEXUS_RETURN_IF_ERROR(ReadNumber(steps[i], "time_s", &time, 0, ctx));
      PLEXUS_RETURN_IF_ERROR(ReadNumber(steps[i], "nodes", &nodes, 0, ctx));
      while (present < nodes) {
        schedule.events.push_back(NodeEvent{time, true, absl::StrCat("node", present)});
        ++present;
      }
      while (present > nodes) {
        --present;
        schedule.events.push_back(NodeEvent{time, false, absl::StrCat("node", present)});
      }
    }
  } else if (doc.contains("fail_every_s")) {
    int initial = 0;
    double every = 0, replace_after = -1;
    PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "initial_nodes", &initial, 1, "schedule"));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "fail_every_s", &every, 1e-3, "schedule"));
    PLEXUS_RETURN_IF_ERROR(ReadNumber(doc, "replace_after_s", &replace_after, 0, "schedule"));
    if (initial < 1 || schedule.end_s <= 0) {
      return absl::InvalidArgumentError(
          "a periodic schedule needs initial_nodes >= 1 and end_s > 0");
    }
    if (schedule.end_s / every > 1e6) {
      return absl::InvalidArgumentError("a periodic schedule may have at most 1e6 failures");
    }
    std::vector<std::string> present;
    for (int i = 0; i < initial; ++i) {
      present.push_back(absl::StrCat("node", i));
      schedule.events.push_back(NodeEvent{0, true, present.back()});
    }
    // Failures hit nodes in a fixed pseudo-random order (an LCG); each is replaced later.
    uint64_t state = 0x9E3779B97F4A7C15ull;
    int fresh = initial;
    std::vector<std::pair<double, std::string>> returns;  // sorted by time
    for (int k = 1; k * every < schedule.end_s; ++k) {
      const double t = k * every;
      while (!returns.empty() && returns.front().first <= t) {
        schedule.events.push_back(NodeEvent{returns.front().first, true, returns.front().second});
        present.push_back(returns.front().second);
        returns.erase(returns.begin());
      }
      if (present.empty()) continue;
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const size_t victim = (state >> 33) % present.size();
      schedule.events.push_back(NodeEvent{t, false, present[victim]});
      present.erase(present.begin() + static_cast<std::ptrdiff_t>(victim));
      if (replace_after >= 0) {
        returns.emplace_back(t + replace_after, absl::StrCat("node", fresh++));
      }
    }
    for (const auto& [t, name] : returns) {
      if (t < schedule.end_s) schedule.events.push_back(NodeEvent{t, true, name});
    }
  } else {
    return absl::InvalidArgumentError(
        "schedule needs \"events\", \"steps\" or \"fail_every_s\" (see docs/moe.md)");
  }
  std::stable_sort(schedule.events.begin(), schedule.events.end(),
                   [](const NodeEvent& a, const NodeEvent& b) { return a.time_s < b.time_s; });
  if (schedule.events.empty()) return absl::InvalidArgumentError("schedule has no events");
  if (absl::Status s = CheckEvents(schedule); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule: ", std::string(s.message())));
  }
  schedule.end_s = std::max(schedule.end_s, schedule.events.back().time_s);
  return schedule;
}

absl::StatusOr<Schedule> LoadSchedule(const std::string& path) {
  PLEXUS_ASSIGN_OR_RETURN(std::string text, base::ReadFile(path));
  const bool csv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  absl::StatusOr<Schedule> s = csv ? ParseSpotTrace(text) : ParseSchedule(text);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat(path, ": ", std::string(s.status().message())));
  }
  if (s->name.empty() || s->name == "spot-trace") {
    const size_t slash = path.find_last_of('/');
    s->name = slash == std::string::npos ? path : path.substr(slash + 1);
  }
  return s;
}

}  // namespace plexus::moe
