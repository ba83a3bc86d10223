// Membership changes (docs/moe.md, "Elasticity protocol"). After a dead peer the survivors agree
// on the new membership through the store, then either re-plan and fetch the experts they now
// host from surviving owners (elastic) or reload the last checkpoint (the baseline, and the
// fallback when an expert lost every replica), and connect a communicator of the next epoch; a
// member failing during that agrees again. A newcomer asks to join through the store; after
// the step at which plan node 0 sees the request, the members re-plan with it and send it the
// gate and its experts.
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/moe/reconfigure.hpp"
#include "runtime/membership_codec.hpp"
#include "runtime/trainer.hpp"

namespace plexus::moe::runtime {
namespace {

std::string EpochPrefix(int epoch) { return absl::StrCat("plexus-moe/epoch", epoch, "/"); }
std::string TicketKey(int physical) { return absl::StrCat("plexus-moe/join/", physical); }

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

bool IsPeerFailure(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted;
}

absl::Status TrainerImpl::StoreError(const absl::Status& status, const char* doing) const {
  return absl::Status(
      status.code(),
      absl::StrFormat(
          "moe runtime: physical rank %d lost the job's store (%s) while %s: %s. When a rank "
          "serves the store (rank 0 under plexus-run, torchrun --standalone or mpirun), its "
          "death ends the job: restart it%s",
          physical_, store_->description(), doing, status.message(),
          options_.checkpoint_path.empty()
              ? std::string()
              : absl::StrCat(" (the last checkpoint is ", options_.checkpoint_path, ")")));
}

// Every rank publishes "alive/<physical>" = its steps completed and generation (membership_codec)
// under the epoch's prefix and bids for leadership with an atomic Add: the first to arrive leads,
// whichever rank it is (rank 0 may be the one that died). The leader waits until every expected
// rank is present or the grace passed, then publishes "members" = step, generation, physical ids:
// the smallest step and generation present (a rank one step or one deployment ahead rolls
// back) and the members present, in the order of `expected`.
absl::StatusOr<TrainerImpl::Agreement> TrainerImpl::AgreeMembership(
    const std::vector<int>& expected, bool retry) {
  const std::string prefix = EpochPrefix(epoch_);
  const auto alive_key = [&](int p) { return absl::StrCat(prefix, "alive/", p); };
  if (absl::Status s = store_->Set(alive_key(physical_), EncodeAlive({step_, generation_}));
      !s.ok()) {
    return StoreError(s, "reporting itself alive after a failure");
  }
  absl::StatusOr<int64_t> bid = store_->Add(absl::StrCat(prefix, "leader"), 1);
  if (!bid.ok()) return StoreError(bid.status(), "agreeing on the membership");
  // After a failure during recovery, a survivor may still be inside a connect or a transfer
  // with the dead rank, which ends within the communicator's timeouts.
  const absl::Duration leader_wait =
      options_.membership_grace +
      (retry ? options_.comm.timeout + options_.comm.connect_timeout : absl::ZeroDuration());
  const std::string members_key = absl::StrCat(prefix, "members");
  if (*bid == 1) {
    std::vector<int> present;
    absl::Status store_error;
    base::PollUntil(absl::Now() + leader_wait, absl::Milliseconds(5), [&] {
      present.clear();
      for (int p : expected) {
        absl::StatusOr<bool> here = store_->Check({alive_key(p)});
        if (!here.ok()) {
          store_error = here.status();
          return true;
        }
        if (*here) present.push_back(p);
      }
      return present.size() == expected.size();
    });
    if (!store_error.ok()) return StoreError(store_error, "agreeing on the membership");
    int64_t step = step_, generation = generation_;
    for (int p : present) {
      absl::StatusOr<std::string> v = store_->Get(alive_key(p), absl::Seconds(5));
      if (!v.ok()) return StoreError(v.status(), "agreeing on the membership");
      PLEXUS_ASSIGN_OR_RETURN(AliveValue alive, DecodeAlive(*v));
      step = std::min(step, alive.step);
      generation = std::min(generation, alive.generation);
    }
    if (absl::Status s = store_->Set(members_key, EncodeMembership({step, generation, present}));
        !s.ok()) {
      return StoreError(s, "publishing the membership");
    }
  }
  absl::StatusOr<std::string> value =
      store_->Get(members_key, leader_wait + options_.comm.timeout + absl::Seconds(5));
  if (!value.ok()) {
    if (absl::IsDeadlineExceeded(value.status())) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "moe runtime: physical rank %d: the leader of the membership agreement of epoch %d "
          "(the first survivor to arrive) did not publish the members within %s: it failed "
          "during recovery; restart the job%s",
          physical_, epoch_, absl::FormatDuration(leader_wait + options_.comm.timeout),
          options_.checkpoint_path.empty()
              ? std::string()
              : absl::StrCat(" from the checkpoint ", options_.checkpoint_path)));
    }
    return StoreError(value.status(), "waiting for the membership");
  }
  PLEXUS_ASSIGN_OR_RETURN(Membership m, DecodeMembership(*value));
  if (!Contains(m.members, physical_)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "moe runtime: physical rank %d was left out of the membership of epoch %d (%s): it "
        "reported itself alive after the leader's deadline of %s",
        physical_, epoch_ + 1, absl::StrJoin(m.members, ","), absl::FormatDuration(leader_wait)));
  }
  return Agreement{std::move(m.members), m.step, m.generation};
}

absl::Status TrainerImpl::MoveTo(const std::vector<int>& target, bool restart, StepReport& report) {
  ReconfigurePlan plan;
  if (!restart) {
    ReconfigureInput in;
    in.current = placements_;
    in.current_physical = members_;
    in.new_physical = target;
    in.layer_loads.assign(layout_.config.layers, ExpectedLoads(layout_.config));
    in.slots_per_node = options_.slots_per_node;
    in.min_replicas = options_.min_replicas;
    in.expert_state_bytes = 2 * layout_.expert_params * static_cast<int64_t>(sizeof(float));
    PLEXUS_ASSIGN_OR_RETURN(plan, PlanReconfiguration(in));
    restart = plan.needs_checkpoint_restart();
  }
  report.checkpoint_restart = restart;
  undo_ = Undo{members_, index_, placements_, state_, step_};
  if (restart) {
    std::vector<int> sorted = target;
    std::sort(sorted.begin(), sorted.end());
    PLEXUS_RETURN_IF_ERROR(LoadCheckpoint());
    return Start(std::move(sorted));
  }

  const std::vector<int>& next = plan.physical;  // plan order = the new communicator's ranks
  const auto rank_of = [&](int physical) {
    return static_cast<int>(std::find(next.begin(), next.end(), physical) - next.begin());
  };
  const int me = rank_of(physical_);
  PLEXUS_RETURN_IF_ERROR(Connect(me, static_cast<int>(next.size())));
  Hook("connected");
  // Newcomers get the gate (replicated on every member: weights and momentum) from the first
  // member in plan order; then every rank walks the same transfer list in the same order, so
  // the sends and receives of each pair match and no cycle of waits can form.
  int gate_src = -1;
  for (int p : next) {
    if (Contains(members_, p)) {
      gate_src = rank_of(p);
      break;
    }
  }
  for (int p : next) {
    if (Contains(members_, p) || gate_src < 0) continue;
    if (gate_src == me) {
      PLEXUS_RETURN_IF_ERROR(comm_->Send(state_.data(), 2 * layout_.gate_size,
                                         collectives::DataType::kF32, rank_of(p)));
    } else if (p == physical_) {
      PLEXUS_RETURN_IF_ERROR(
          comm_->Recv(state_.data(), 2 * layout_.gate_size, collectives::DataType::kF32, gate_src));
    }
  }
  const int64_t floats = 2 * layout_.expert_params;
  for (const ExpertTransfer& t : plan.transfers) {
    const int src = rank_of(t.src_physical), dst = rank_of(t.dst_physical);
    float* w = state_.data() + layout_.ExpertOffset(t.layer, t.expert);
    if (src == me) {
      PLEXUS_RETURN_IF_ERROR(comm_->Send(w, floats, collectives::DataType::kF32, dst));
    } else if (dst == me) {
      PLEXUS_RETURN_IF_ERROR(comm_->Recv(w, floats, collectives::DataType::kF32, src));
    }
  }
  Hook("transferred");
  // Commit. Only now drop (poison) the experts this rank no longer hosts: it may have been a
  // source.
  members_ = next;
  index_ = me;
  SetPlacements(plan.placements);
  ++generation_;
  report.experts_fetched += static_cast<int64_t>(plan.transfers.size());
  return absl::OkStatus();
}

absl::Status TrainerImpl::Recover(StepReport& report, std::vector<int> expected) {
  comm_.reset();  // broken: its destructor skips the barrier
  rendezvous_.reset();
  int64_t failed_at = step_;
  const int attempts = std::max(1, options_.max_recovery_attempts);
  for (int attempt = 1;; ++attempt) {
    report.recovery_attempts = attempt;
    // A rank that moved to a new deployment and has not trained since (undo_) may be facing
    // peers still inside that move: wait for them as after a failure during recovery.
    PLEXUS_ASSIGN_OR_RETURN(Agreement agreed,
                            AgreeMembership(expected, attempt > 1 || undo_.has_value()));
    if (generation_ > agreed.generation) {
      // This rank committed a deployment some survivor did not: back to the one before.
      if (generation_ != agreed.generation + 1 || !undo_.has_value()) {
        return absl::InternalError(absl::StrFormat(
            "moe runtime: rank %d committed deployment %d, the survivors agreed on %d", physical_,
            generation_, agreed.generation));
      }
      members_ = undo_->members;
      index_ = undo_->index;
      state_ = undo_->state;
      step_ = undo_->step;
      SetPlacements(undo_->placements);
      --generation_;
      undo_.reset();
    }
    if (step_ > agreed.step) {
      if (step_ != agreed.step + 1 || previous_state_.empty()) {
        return absl::InternalError(
            absl::StrFormat("moe runtime: rank %d is at step %d, the survivors agreed on %d",
                            physical_, step_, agreed.step));
      }
      state_ = previous_state_;
      step_ = agreed.step;
    }
    if (attempt == 1) failed_at = step_;
    Hook("agreed");
    ++epoch_;
    absl::Status moved =
        MoveTo(agreed.members, options_.recovery == RecoveryMode::kCheckpointRestart, report);
    if (moved.ok()) {
      report.steps_lost = failed_at - step_;
      return absl::OkStatus();
    }
    if (!IsPeerFailure(moved) || attempt >= attempts) {
      return base::Annotate(moved, absl::StrFormat("moe runtime: physical rank %d, recovery "
                                                   "attempt %d of %d",
                                                   physical_, attempt, attempts));
    }
    absl::StrAppend(&report.error, "; then, during recovery: ", moved.message());
    comm_.reset();
    rendezvous_.reset();
    expected = agreed.members;
  }
}

absl::Status TrainerImpl::AdmitJoins(int64_t requests, StepReport& report,
                                     std::vector<int>* expected) {
  std::vector<int> joiners;
  for (int64_t j = joins_admitted_; j < requests; ++j) {
    joiners.push_back(initial_world_ + static_cast<int>(j));
  }
  // The baseline scales up by checkpoint and restart (written before the tickets, so that the
  // newcomers find it); with no checkpoints it joins elastically too.
  const bool restart =
      options_.recovery == RecoveryMode::kCheckpointRestart && options_.checkpoint_every > 0;
  if (restart) {
    PLEXUS_RETURN_IF_ERROR(WriteCheckpoint());
    // Plan node 0 writes the file after the gather: nobody reloads it before it is complete.
    PLEXUS_RETURN_IF_ERROR(comm_->Barrier());
  }
  std::vector<int> target = members_;
  target.insert(target.end(), joiners.begin(), joiners.end());
  if (index_ == 0) {
    Ticket t{epoch_, step_, generation_, joins_admitted_, requests, members_, placements_};
    const std::string ticket = EncodeTicket(t);
    for (int p : joiners) {
      if (absl::Status s = store_->Set(TicketKey(p), ticket); !s.ok()) {
        return StoreError(s, "admitting a joining rank");
      }
    }
  }
  joins_admitted_ = requests;
  *expected = target;
  comm_.reset();  // healthy: its destructor waits for every member
  rendezvous_.reset();
  ++epoch_;
  report.joined = joiners;
  return MoveTo(target, restart, report);
}

absl::Status TrainerImpl::JoinJob() {
  const absl::Duration timeout = options_.join_timeout;
  absl::StatusOr<std::string> world = store_->Get(kInitialWorldKey, timeout);
  int initial = 0;
  if (!world.ok()) {
    return absl::Status(world.status().code(),
                        absl::StrCat("moe runtime: joining: no Lazarus job uses ",
                                     store_->description(), ": ", world.status().message()));
  }
  if (!absl::SimpleAtoi(*world, &initial) || initial < 1) {
    return absl::DataLossError(absl::StrCat("moe runtime: bad initial world '", *world, "'"));
  }
  initial_world_ = initial;
  absl::StatusOr<int64_t> request = store_->Add(kJoinRequestsKey, 1);
  if (!request.ok()) return StoreError(request.status(), "asking to join");
  physical_ = initial + static_cast<int>(*request - 1);
  absl::StatusOr<std::string> text = store_->Get(TicketKey(physical_), timeout);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrFormat("moe runtime: physical rank %d asked to join the job at %s, but no "
                        "member admitted it within %s (the job finished, or it polls for joins "
                        "rarely or never: join_poll_every): %s",
                        physical_, store_->description(), absl::FormatDuration(timeout),
                        text.status().message()));
  }
  PLEXUS_ASSIGN_OR_RETURN(Ticket t, DecodeTicket(*text, layout_.config.layers,
                                                 layout_.config.experts, options_.slots_per_node));
  epoch_ = t.epoch;
  step_ = t.step;
  generation_ = t.generation;
  joins_admitted_ = t.admitted_after;
  members_ = t.members;
  index_ = -1;
  state_ = InitialState(layout_);
  // Until the gate arrives it is poison, like the experts this rank does not hold.
  std::fill(state_.begin(), state_.begin() + 2 * layout_.gate_size,
            std::numeric_limits<float>::quiet_NaN());
  SetPlacements(t.placements);
  std::vector<int> target = members_;
  for (int64_t j = t.admitted_before; j < t.admitted_after; ++j) {
    target.push_back(initial + static_cast<int>(j));
  }
  const bool restart =
      options_.recovery == RecoveryMode::kCheckpointRestart && options_.checkpoint_every > 0;
  ++epoch_;
  StepReport report;
  absl::Status joined = MoveTo(target, restart, report);
  if (!joined.ok() && IsPeerFailure(joined)) joined = Recover(report, target);
  return joined;
}

}  // namespace plexus::moe::runtime
