// The distributed trainer behind plexus::moe::Trainer (runtime.hpp): the training step
// (trainer.cpp) and membership changes (recovery.cpp): recovery from a dead peer, joins.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/moe/placement.hpp"
#include "plexus/moe/runtime.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "runtime/model.hpp"

namespace plexus::moe::runtime {

// Expected load of each expert under the gate's routing bias: what the allocation plans for.
std::vector<double> ExpectedLoads(const ModelSpec& c);
absl::Status ValidateConfig(const ModelSpec& c);

// Keys of the job's store (besides the epochs' "plexus-moe/epoch<k>/..."): the initial world
// size (joiners take physical ids from it on), the counter of join requests, and the ticket of
// joiner <id> ("plexus-moe/join/<id>").
inline constexpr char kInitialWorldKey[] = "plexus-moe/initial-world";
inline constexpr char kJoinRequestsKey[] = "plexus-moe/join-requests";

// A failed or unreachable peer (the step or recovery can be retried with the survivors), as
// opposed to a bug or bad input.
bool IsPeerFailure(const absl::Status& status);

class TrainerImpl final : public Trainer {
 public:
  TrainerImpl(std::shared_ptr<transport::Store> store, int rank, RuntimeOptions options);
  ~TrainerImpl() override;

  // Plans for `members` (fresh allocation and placement) and connects epoch `epoch_`.
  absl::Status Start(std::vector<int> members);
  // recovery.cpp: a newcomer's side of a join (Trainer::Join).
  absl::Status JoinJob();

  absl::StatusOr<StepReport> Step() override;
  int64_t step() const override { return step_; }
  int physical_rank() const override { return physical_; }
  const std::vector<int>& members() const override { return members_; }
  std::vector<int> HeldExperts(int layer) const override;
  absl::StatusOr<std::vector<float>> GatherState() override;
  void set_initial_world(int world) { initial_world_ = world; }

 private:
  // One training step over the current communicator; the state changes only when it succeeds.
  absl::StatusOr<double> TrainStep();
  // Rendezvous + communicator of epoch_ with this rank at `index` of `size`.
  absl::Status Connect(int index, int size);
  void SetPlacements(std::vector<Placement> placements);  // also marks held experts
  absl::Status WriteCheckpoint();
  absl::Status LoadCheckpoint();
  // recovery.cpp. After a failed step: agree on the members among `expected` (through the
  // store), then move to them; a failure while moving agrees again (max_recovery_attempts).
  absl::Status Recover(StepReport& report, std::vector<int> expected);
  // After step() succeeded with `requests` join requests in the store: admit the new ones.
  // `expected` becomes the members to agree among should a member fail while admitting.
  absl::Status AdmitJoins(int64_t requests, StepReport& report, std::vector<int>* expected);
  struct Agreement {
    std::vector<int> members;  // in the order of `expected`
    int64_t step = 0;          // the smallest step completed
    int64_t generation = 0;    // the smallest deployment committed
  };
  absl::StatusOr<Agreement> AgreeMembership(const std::vector<int>& expected, bool retry);
  // Moves the committed deployment (members_, placements_) to `target` at epoch_ (already
  // advanced): re-plan, connect, gate to newcomers, expert transfers, commit. `restart`: reload
  // the checkpoint and plan afresh instead (the baseline; also forced when an expert is lost).
  absl::Status MoveTo(const std::vector<int>& target, bool restart, StepReport& report);
  absl::Status StoreError(const absl::Status& status, const char* doing) const;
  void Hook(const char* point) const {
    if (options_.fault_hook) options_.fault_hook(physical_, point);
  }

  std::shared_ptr<transport::Store> store_;
  int physical_;
  RuntimeOptions options_;
  Layout layout_;
  int epoch_ = 0;
  std::vector<int> members_;  // physical ranks in plan order (= communicator rank order)
  int index_ = 0;             // my plan node / communicator rank (-1: a joiner not yet in)
  std::vector<Placement> placements_;
  std::vector<char> held_;  // [l * E + e]
  // Deployments committed (Start and every MoveTo). A rank that committed one its peers did
  // not (a member died during the move) rolls back to `undo_` when they agree on the older one.
  int64_t generation_ = 0;
  struct Undo {
    std::vector<int> members;
    int index = 0;
    std::vector<Placement> placements;
    std::vector<float> state;
    int64_t step = 0;
  };
  std::optional<Undo> undo_;
  int initial_world_ = 0;       // physical ids >= this are joiners
  int64_t joins_admitted_ = 0;  // join requests handled (the store's counter counts them all)
  int64_t join_requests_ = 0;   // the count the last step's allreduce carried
  std::optional<transport::Rendezvous> rendezvous_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::vector<float> state_;
  // The state before the last applied step: a survivor that finished a step its peers did not
  // (the dead rank failed during the last allreduce) rolls back to it.
  std::vector<float> previous_state_;
  int64_t step_ = 0;
};

}  // namespace plexus::moe::runtime
