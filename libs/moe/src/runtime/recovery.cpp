// Recovery from a dead peer (docs/moe.md, "Elasticity protocol"): the survivors agree on the new
// membership through the store, then either re-plan and fetch the experts they now host from
// surviving owners (elastic) or reload the last checkpoint (the baseline, and the fallback when
// an expert lost every replica), and connect a communicator of the next epoch.
#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "plexus/base/status.hpp"
#include "plexus/moe/reconfigure.hpp"
#include "runtime/trainer.hpp"

namespace plexus::moe::runtime {

// Every survivor publishes "alive/<physical>" = the number of steps it completed under the
// epoch's prefix. The leader (plan node 0's physical rank 0, which serves the store and is
// required to survive) waits until every old member is present or `membership_grace` passed
// since it arrived, then publishes "members" = "<step>;<physical>,...". The agreed step is the
// smallest completed step: a survivor that completed one more step (its peers failed in the
// step's last allreduce) rolls back.
absl::StatusOr<std::vector<int>> TrainerImpl::AgreeMembership(int64_t* agreed_step) {
  const std::string prefix = absl::StrCat("plexus-moe/epoch", epoch_, "/");
  PLEXUS_RETURN_IF_ERROR(
      store_->Set(absl::StrCat(prefix, "alive/", physical_), absl::StrCat(step_)));
  const std::string members_key = absl::StrCat(prefix, "members");
  const int leader = *std::min_element(members_.begin(), members_.end());
  if (physical_ == leader) {
    const absl::Time deadline = absl::Now() + options_.membership_grace;
    std::vector<int> present;
    while (true) {
      present.clear();
      for (int p : members_) {
        PLEXUS_ASSIGN_OR_RETURN(bool here, store_->Check({absl::StrCat(prefix, "alive/", p)}));
        if (here) present.push_back(p);
      }
      if (present.size() == members_.size() || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    int64_t step = step_;
    for (int p : present) {
      PLEXUS_ASSIGN_OR_RETURN(std::string v,
                              store_->Get(absl::StrCat(prefix, "alive/", p), absl::Seconds(5)));
      int64_t s = 0;
      if (!absl::SimpleAtoi(v, &s)) {
        return absl::DataLossError(absl::StrCat("moe runtime: bad alive value '", v, "' of rank ",
                                                p, " in ", store_->description()));
      }
      step = std::min(step, s);
    }
    PLEXUS_RETURN_IF_ERROR(
        store_->Set(members_key, absl::StrCat(step, ";", absl::StrJoin(present, ","))));
  }
  const absl::Duration wait = options_.membership_grace + options_.comm.timeout + absl::Seconds(5);
  absl::StatusOr<std::string> value = store_->Get(members_key, wait);
  if (!value.ok()) {
    return base::Annotate(value.status(),
                          absl::StrFormat("moe runtime: physical rank %d waiting for the "
                                          "membership of epoch %d from rank %d",
                                          physical_, epoch_ + 1, leader));
  }
  std::vector<std::string> parts = absl::StrSplit(*value, ';');
  std::vector<int> members;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], agreed_step)) {
    return absl::DataLossError(absl::StrCat("moe runtime: bad membership '", *value, "'"));
  }
  for (absl::string_view p : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
    int id = 0;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::DataLossError(absl::StrCat("moe runtime: bad membership '", *value, "'"));
    }
    members.push_back(id);
  }
  if (std::find(members.begin(), members.end(), physical_) == members.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "moe runtime: physical rank %d was left out of the membership of epoch %d (%s): it "
        "reported itself alive after rank %d's deadline of %s",
        physical_, epoch_ + 1, parts[1], leader, absl::FormatDuration(options_.membership_grace)));
  }
  return members;
}

absl::Status TrainerImpl::Recover(StepReport& report) {
  comm_.reset();  // broken: its destructor skips the barrier
  rendezvous_.reset();
  int64_t agreed_step = 0;
  PLEXUS_ASSIGN_OR_RETURN(std::vector<int> survivors, AgreeMembership(&agreed_step));
  if (step_ > agreed_step) {
    if (step_ != agreed_step + 1 || previous_state_.empty()) {
      return absl::InternalError(
          absl::StrFormat("moe runtime: rank %d is at step %d, the survivors agreed on %d",
                          physical_, step_, agreed_step));
    }
    state_ = previous_state_;
    step_ = agreed_step;
  }
  const int64_t failed_at = step_;
  ++epoch_;

  ReconfigurePlan plan;
  bool restart = options_.recovery == RecoveryMode::kCheckpointRestart;
  if (!restart) {
    ReconfigureInput in;
    in.current = placements_;
    in.current_physical = members_;
    in.new_physical = survivors;
    in.layer_loads.assign(layout_.config.layers, ExpectedLoads(layout_.config));
    in.slots_per_node = options_.slots_per_node;
    in.min_replicas = options_.min_replicas;
    in.expert_state_bytes = 2 * layout_.expert_params * static_cast<int64_t>(sizeof(float));
    PLEXUS_ASSIGN_OR_RETURN(plan, PlanReconfiguration(in));
    restart = plan.needs_checkpoint_restart();
  }
  report.checkpoint_restart = restart;
  if (restart) {
    std::sort(survivors.begin(), survivors.end());
    PLEXUS_RETURN_IF_ERROR(LoadCheckpoint());
    report.steps_lost = failed_at - step_;
    PLEXUS_RETURN_IF_ERROR(Start(std::move(survivors)));
    return absl::OkStatus();
  }

  // Elastic: plan order is the new communicator's rank order.
  members_ = plan.physical;
  index_ =
      static_cast<int>(std::find(members_.begin(), members_.end(), physical_) - members_.begin());
  auto rank_of = [&](int physical) {
    return static_cast<int>(std::find(members_.begin(), members_.end(), physical) -
                            members_.begin());
  };
  PLEXUS_RETURN_IF_ERROR(Connect());
  // Every rank walks the same transfer list in the same order, so the sends and receives of
  // each pair match and no cycle of waits can form.
  const int64_t floats = 2 * layout_.expert_params;
  for (const ExpertTransfer& t : plan.transfers) {
    const int src = rank_of(t.src_physical), dst = rank_of(t.dst_physical);
    float* w = state_.data() + layout_.ExpertOffset(t.layer, t.expert);
    if (src == index_) {
      PLEXUS_RETURN_IF_ERROR(comm_->Send(w, floats, collectives::DataType::kF32, dst));
    } else if (dst == index_) {
      PLEXUS_RETURN_IF_ERROR(comm_->Recv(w, floats, collectives::DataType::kF32, src));
    }
  }
  // Only now drop (poison) the experts this rank no longer hosts: it may have been a source.
  SetPlacements(plan.placements);
  report.experts_fetched = static_cast<int64_t>(plan.transfers.size());
  report.steps_lost = 0;
  return absl::OkStatus();
}

}  // namespace plexus::moe::runtime
