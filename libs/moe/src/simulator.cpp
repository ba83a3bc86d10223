#include "plexus/moe/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/moe/allocation.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/reconfigure.hpp"

namespace plexus::moe {

const char* SystemKindName(SystemKind kind) {
  switch (kind) {
    case SystemKind::kLazarus:
      return "lazarus";
    case SystemKind::kCheckpointRestart:
      return "checkpoint_restart";
    case SystemKind::kEpReconfigure:
      return "ep_reconfigure";
  }
  return "?";
}

absl::StatusOr<SystemKind> ParseSystemKind(const std::string& name) {
  if (name == "lazarus") return SystemKind::kLazarus;
  if (name == "checkpoint_restart") return SystemKind::kCheckpointRestart;
  if (name == "ep_reconfigure") return SystemKind::kEpReconfigure;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown system '", name, "' (expected lazarus, checkpoint_restart or ep_reconfigure)"));
}

namespace {

// Integer token counts per expert that sum to `total` (largest remainder on the loads).
std::vector<int64_t> SplitTokens(const std::vector<double>& loads, int64_t total) {
  double sum = 0;
  for (double l : loads) sum += l;
  std::vector<int64_t> out(loads.size());
  std::vector<std::pair<double, int>> fraction;
  int64_t assigned = 0;
  for (size_t e = 0; e < loads.size(); ++e) {
    const double exact = loads[e] / sum * static_cast<double>(total);
    out[e] = static_cast<int64_t>(std::floor(exact));
    assigned += out[e];
    fraction.emplace_back(-(exact - std::floor(exact)), static_cast<int>(e));
  }
  std::sort(fraction.begin(), fraction.end());
  for (size_t i = 0; assigned < total; ++i, ++assigned) ++out[fraction[i % fraction.size()].second];
  return out;
}

int EpUsable(const Scenario& s, int nodes) {
  const int capped = std::min(nodes, s.training.max_nodes);
  return capped / s.training.ep_size * s.training.ep_size;
}

}  // namespace

absl::StatusOr<double> StepTime(const Scenario& s, SystemKind system, int nodes) {
  const TrainingModel& m = s.training;
  const int experts = s.num_experts();
  const int64_t tokens_layer = m.samples_per_step * m.tokens_per_sample;
  double busiest_sum = 0;
  if (system == SystemKind::kLazarus) {
    if (nodes <= 0 || int64_t{nodes} * s.slots_per_node < experts) {
      return absl::UnavailableError(absl::StrCat(nodes, " nodes x ", s.slots_per_node,
                                                 " slots cannot hold ", experts, " experts"));
    }
    for (const auto& loads : s.layer_loads) {
      PLEXUS_ASSIGN_OR_RETURN(
          Allocation alloc,
          AllocateReplicas(loads, AllocationOptions{nodes, s.slots_per_node, s.min_replicas}));
      PLEXUS_ASSIGN_OR_RETURN(Placement placement,
                              PlaceExperts(PlacementPolicy::kMro, alloc.replicas, nodes,
                                           s.slots_per_node, alloc.ascending));
      // Every rank's gate routes an equal share of each expert's tokens (data-parallel input).
      DispatchInput in;
      in.num_experts = experts;
      in.num_ranks = nodes;
      in.replicas = placement.ReplicaMatrix();
      in.tokens.resize(static_cast<size_t>(experts) * nodes);
      const std::vector<int64_t> per_expert = SplitTokens(loads, tokens_layer);
      for (int e = 0; e < experts; ++e) {
        for (int j = 0; j < nodes; ++j) {
          in.tokens[static_cast<size_t>(e) * nodes + j] =
              per_expert[e] / nodes + (j < per_expert[e] % nodes ? 1 : 0);
        }
      }
      PLEXUS_ASSIGN_OR_RETURN(DispatchPlan plan, ComputeDispatch(in));
      int64_t busiest = 0;
      for (int j = 0; j < nodes; ++j) {
        int64_t load = 0;
        for (int e = 0; e < experts; ++e) load += plan.capacity[static_cast<size_t>(e) * nodes + j];
        busiest = std::max(busiest, load);
      }
      busiest_sum += static_cast<double>(busiest);
    }
  } else {
    const int used = EpUsable(s, nodes);
    if (used == 0) {
      return absl::UnavailableError(
          absl::StrCat(nodes, " nodes are fewer than the EP size ", m.ep_size));
    }
    // EP groups split the batch; node i of a group holds experts [i*E/ep, (i+1)*E/ep).
    const int groups = used / m.ep_size;
    const int per_node = experts / m.ep_size;
    for (const auto& loads : s.layer_loads) {
      double sum = 0;
      for (double l : loads) sum += l;
      double busiest = 0;
      for (int i = 0; i < m.ep_size; ++i) {
        double load = 0;
        for (int e = i * per_node; e < (i + 1) * per_node; ++e) load += loads[e] / sum;
        busiest = std::max(busiest, load * static_cast<double>(tokens_layer) / groups);
      }
      busiest_sum += busiest;
    }
  }
  return m.fixed_step_s + m.seconds_per_token * busiest_sum;
}

namespace {

class Simulation {
 public:
  Simulation(const Scenario& s, const Schedule& schedule, SystemKind kind,
             const SimulationOptions& options)
      : s_(s), m_(s.training), schedule_(schedule), kind_(kind), options_(options) {
    result_.system = kind;
  }

  absl::StatusOr<SimulationResult> Run() {
    const double end = schedule_.end_s;
    size_t next = 0;
    // The initial cluster forms at time 0 without the scale-up wait.
    while (next < schedule_.events.size() && schedule_.events[next].time_s <= 0) {
      ApplyPoolEvent(schedule_.events[next++], nullptr);
    }
    while (static_cast<int>(active_.size()) < m_.max_nodes && !idle_.empty()) {
      active_.push_back(idle_.front().first);
      idle_.erase(idle_.begin());
    }
    PLEXUS_RETURN_IF_ERROR(Start(/*restart_cost=*/false));
    while (t_ < end) {
      const double event_time =
          next < schedule_.events.size() ? schedule_.events[next].time_s : end;
      const double horizon = std::min({event_time, NextScaleUp(), end});
      PLEXUS_RETURN_IF_ERROR(Advance(horizon));
      if (t_ >= end) break;
      std::vector<std::string> removed;
      while (next < schedule_.events.size() && schedule_.events[next].time_s <= t_) {
        ApplyPoolEvent(schedule_.events[next++], &removed);
      }
      std::vector<std::string> added;
      for (size_t i = 0; i < idle_.size() && static_cast<int>(active_.size()) < m_.max_nodes;) {
        if (idle_[i].second + m_.scale_up_wait_s <= t_) {
          active_.push_back(idle_[i].first);
          added.push_back(idle_[i].first);
          idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (!removed.empty() || !added.empty()) {
        PLEXUS_RETURN_IF_ERROR(React(removed));
      }
    }
    RecordUntil(end);
    result_.duration_s = end;
    result_.samples = samples_;
    // The clock may pass `end` by the last step or checkpoint; average over what ran.
    result_.mean_active_nodes = t_ > 0 ? node_seconds_ / t_ : 0;
    return result_;
  }

 private:
  int Id(const std::string& name) {
    return ids_.emplace(name, static_cast<int>(ids_.size())).first->second;
  }

  void ApplyPoolEvent(const NodeEvent& ev, std::vector<std::string>* removed) {
    if (ev.add) {
      idle_.emplace_back(ev.node, ev.time_s);
      return;
    }
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].first == ev.node) {
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
    auto it = std::find(active_.begin(), active_.end(), ev.node);
    if (it != active_.end()) {
      active_.erase(it);
      if (removed) removed->push_back(ev.node);
    }
  }

  double NextScaleUp() const {
    if (static_cast<int>(active_.size()) >= m_.max_nodes || idle_.empty()) {
      return std::numeric_limits<double>::infinity();
    }
    double earliest = std::numeric_limits<double>::infinity();
    for (const auto& [name, since] : idle_) earliest = std::min(earliest, since);
    return std::max(t_, earliest + m_.scale_up_wait_s);
  }

  int NodesInUse() const {
    if (!running_) return 0;
    return kind_ == SystemKind::kLazarus ? static_cast<int>(active_.size())
                                         : static_cast<int>(used_.size());
  }

  absl::StatusOr<double> CurrentStepTime() {
    const int nodes = NodesInUse();
    auto it = step_cache_.find(nodes);
    if (it != step_cache_.end()) return it->second;
    PLEXUS_ASSIGN_OR_RETURN(double st, StepTime(s_, kind_, nodes));
    step_cache_.emplace(nodes, st);
    return st;
  }

  void RecordUntil(double time) {
    while (next_point_ <= time) {
      result_.timeline.push_back(TimelinePoint{next_point_, samples_, NodesInUse()});
      next_point_ += options_.timeline_interval_s;
    }
  }

  // Moves the clock; nodes in use are counted as held throughout.
  void Tick(double seconds) {
    node_seconds_ += NodesInUse() * seconds;
    t_ += seconds;
    RecordUntil(t_);
  }

  void Spend(double seconds) {  // restart, reconfiguration or checkpoint: nothing trains
    result_.overhead_s += seconds;
    Tick(seconds);
  }

  absl::Status Advance(double horizon) {
    if (!running_) {
      if (horizon > t_) {
        result_.idle_s += horizon - t_;
        Tick(horizon - t_);
      }
      return absl::OkStatus();
    }
    PLEXUS_ASSIGN_OR_RETURN(double step, CurrentStepTime());
    while (t_ + step <= horizon) {
      Tick(step);
      samples_ += static_cast<double>(m_.samples_per_step);
      ++result_.steps;
      if (++since_checkpoint_ >= m_.checkpoint_every_steps) {
        Spend(m_.checkpoint_s);
        committed_ = samples_;
        since_checkpoint_ = 0;
      }
    }
    // A step cut short by the event is lost: the clock moves to the event.
    if (horizon > t_) Tick(horizon - t_);
    return absl::OkStatus();
  }

  void LoseProgress() {
    result_.lost_samples += samples_ - committed_;
    samples_ = committed_;
    since_checkpoint_ = 0;
  }

  bool LazarusCanTrain() const {
    return !active_.empty() &&
           static_cast<int64_t>(active_.size()) * s_.slots_per_node >= s_.num_experts();
  }

  // A fresh deployment on the active nodes (at time 0 or from a checkpoint).
  absl::Status Start(bool restart_cost) {
    if (kind_ == SystemKind::kLazarus) {
      if (!LazarusCanTrain()) {
        running_ = false;
        return absl::OkStatus();
      }
      placements_.clear();
      physical_.clear();
      const int n = static_cast<int>(active_.size());
      for (const auto& loads : s_.layer_loads) {
        PLEXUS_ASSIGN_OR_RETURN(
            Allocation alloc,
            AllocateReplicas(loads, AllocationOptions{n, s_.slots_per_node, s_.min_replicas}));
        PLEXUS_ASSIGN_OR_RETURN(Placement p, PlaceExperts(PlacementPolicy::kMro, alloc.replicas, n,
                                                          s_.slots_per_node, alloc.ascending));
        placements_.push_back(std::move(p));
      }
      for (const std::string& name : active_) physical_.push_back(Id(name));
    } else {
      const int usable = EpUsable(s_, static_cast<int>(active_.size()));
      used_.assign(active_.begin(), active_.begin() + usable);
      if (usable == 0) {
        running_ = false;
        return absl::OkStatus();
      }
    }
    running_ = true;
    needs_restart_ = false;
    if (restart_cost) Spend(m_.restart_s);
    return absl::OkStatus();
  }

  absl::Status Restart() {
    LoseProgress();
    ++result_.restarts;
    needs_restart_ = true;
    return Start(/*restart_cost=*/true);
  }

  // Joined nodes are already in active_; only removals need the names.
  absl::Status React(const std::vector<std::string>& removed) {
    if (kind_ == SystemKind::kLazarus) return ReactLazarus(removed);
    return ReactEp(removed);
  }

  absl::Status ReactLazarus(const std::vector<std::string>& removed) {
    if (running_) result_.failures += static_cast<int>(removed.size());
    if (!running_ && (needs_restart_ || placements_.empty())) {
      return Start(/*restart_cost=*/needs_restart_);
    }
    // Does every expert of every layer keep a replica on a surviving node?
    absl::flat_hash_map<int, bool> alive;
    for (const std::string& name : active_) alive[Id(name)] = true;
    for (const Placement& p : placements_) {
      std::vector<bool> kept(p.num_experts, false);
      for (int q = 0; q < p.num_nodes; ++q) {
        if (!alive.contains(physical_[q])) continue;
        for (int e : p.node_slots[q]) kept[e] = true;
      }
      if (std::find(kept.begin(), kept.end(), false) != kept.end()) return Restart();
    }
    if (!LazarusCanTrain()) {
      running_ = false;  // survivors keep their experts; training resumes by reconfiguring
      return absl::OkStatus();
    }
    ReconfigureInput in;
    in.current = placements_;
    in.current_physical = physical_;
    for (const std::string& name : active_) in.new_physical.push_back(Id(name));
    in.layer_loads = s_.layer_loads;
    in.slots_per_node = s_.slots_per_node;
    in.min_replicas = s_.min_replicas;
    in.expert_state_bytes = m_.expert_state_bytes;
    // The simulator models the paper's method: MRO, whose node groups line up across layers,
    // like its initial plans (the measured figures in docs/moe.md are MRO's).
    in.policy = PlacementPolicy::kMro;
    PLEXUS_ASSIGN_OR_RETURN(ReconfigurePlan plan, PlanReconfiguration(in));
    placements_ = std::move(plan.placements);
    physical_ = std::move(plan.physical);
    running_ = true;
    if (removed.empty()) {
      ++result_.scale_ups;
    } else {
      ++result_.reconfigurations;
    }
    Spend(m_.reconfigure_s + static_cast<double>(plan.bytes_moved) / m_.bandwidth_bytes_per_s);
    return absl::OkStatus();
  }

  absl::Status ReactEp(const std::vector<std::string>& removed) {
    const int ep = m_.ep_size;
    const int groups = static_cast<int>(used_.size()) / ep;
    std::vector<bool> broken(groups, false);
    int hits = 0;
    for (const std::string& name : removed) {
      auto it = std::find(used_.begin(), used_.end(), name);
      if (it == used_.end()) continue;
      ++hits;
      broken[(it - used_.begin()) / ep] = true;
    }
    const int usable = EpUsable(s_, static_cast<int>(active_.size()));
    if (!running_) {
      if (usable == 0) return absl::OkStatus();
      return Start(/*restart_cost=*/needs_restart_);
    }
    result_.failures += hits;
    std::vector<std::string> intact;
    int intact_groups = 0;
    for (int g = 0; g < groups; ++g) {
      if (broken[g]) continue;
      ++intact_groups;
      intact.insert(intact.end(), used_.begin() + g * ep, used_.begin() + (g + 1) * ep);
    }
    if (hits > 0 && (kind_ == SystemKind::kCheckpointRestart || intact_groups == 0)) {
      return Restart();
    }
    if (hits == 0 && usable <= static_cast<int>(used_.size())) {
      // Only nodes outside the EP groups changed. Drop used nodes that left (none did) and
      // keep training.
      return absl::OkStatus();
    }
    std::vector<std::string> next_used = intact;
    for (const std::string& name : active_) {
      if (static_cast<int>(next_used.size()) >= usable) break;
      if (std::find(next_used.begin(), next_used.end(), name) == next_used.end()) {
        next_used.push_back(name);
      }
    }
    if (kind_ == SystemKind::kCheckpointRestart) {
      // Scaling up needs a restart: a checkpoint first, so that nothing is lost.
      Spend(m_.checkpoint_s);
      committed_ = samples_;
      since_checkpoint_ = 0;
      used_ = std::move(next_used);
      ++result_.scale_ups;
      Spend(m_.restart_s);
      return absl::OkStatus();
    }
    // Every node of a newly formed group loads its E/ep experts of every layer from a replica.
    const int fresh_nodes = usable - intact_groups * ep;
    const double bytes = static_cast<double>(fresh_nodes) * (s_.num_experts() / ep) *
                         static_cast<double>(s_.layer_loads.size()) *
                         static_cast<double>(m_.expert_state_bytes);
    used_ = std::move(next_used);
    if (hits > 0) {
      ++result_.reconfigurations;
    } else {
      ++result_.scale_ups;
    }
    Spend(m_.reconfigure_s + bytes / m_.bandwidth_bytes_per_s);
    return absl::OkStatus();
  }

  const Scenario& s_;
  const TrainingModel& m_;
  const Schedule& schedule_;
  SystemKind kind_;
  SimulationOptions options_;
  SimulationResult result_;

  double t_ = 0;
  double samples_ = 0;
  double committed_ = 0;
  int64_t since_checkpoint_ = 0;
  double next_point_ = 0;
  double node_seconds_ = 0;
  bool running_ = false;
  bool needs_restart_ = false;

  std::vector<std::pair<std::string, double>> idle_;  // available, not training; since when
  std::vector<std::string> active_;                   // taken into training
  std::vector<std::string> used_;                     // EP: nodes in whole EP groups
  absl::flat_hash_map<std::string, int> ids_;
  std::vector<Placement> placements_;  // Lazarus: current plan, plan node -> physical_
  std::vector<int> physical_;
  std::map<int, double> step_cache_;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Scenario& scenario, const Schedule& schedule,
                                          SystemKind system, const SimulationOptions& options) {
  if (scenario.layer_loads.empty() || scenario.slots_per_node <= 0) {
    return absl::InvalidArgumentError("scenario has no layers or no slots");
  }
  if (!(options.timeline_interval_s > 0)) {
    return absl::InvalidArgumentError("timeline_interval_s must be positive");
  }
  if (scenario.training.ep_size <= 0 || scenario.num_experts() % scenario.training.ep_size != 0) {
    return absl::InvalidArgumentError("ep_size must be positive and divide the number of experts");
  }
  if (schedule.events.empty()) return absl::InvalidArgumentError("the schedule has no events");
  if (schedule.end_s / options.timeline_interval_s > 1e7) {
    return absl::InvalidArgumentError("timeline_interval_s is too small for this schedule");
  }
  Simulation sim(scenario, schedule, system, options);
  return sim.Run();
}

}  // namespace plexus::moe
