// The distributed trainer behind plexus::moe::Trainer (runtime.hpp): the training step
// (trainer.cpp) and the recovery from a dead peer (recovery.cpp).
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
std::vector<double> ExpectedLoads(const ModelConfig& c);

class TrainerImpl final : public Trainer {
 public:
  TrainerImpl(std::shared_ptr<transport::Store> store, int rank, RuntimeOptions options);
  ~TrainerImpl() override;

  // Plans for `members` (fresh allocation and placement) and connects epoch `epoch_`.
  absl::Status Start(std::vector<int> members);

  absl::StatusOr<StepReport> Step() override;
  int64_t step() const override { return step_; }
  int physical_rank() const override { return physical_; }
  const std::vector<int>& members() const override { return members_; }
  std::vector<int> HeldExperts(int layer) const override;
  absl::StatusOr<std::vector<float>> GatherState() override;

 private:
  // One training step over the current communicator; the state changes only when it succeeds.
  absl::StatusOr<double> TrainStep();
  absl::Status Connect();  // rendezvous + communicator of epoch_ over members_
  void SetPlacements(std::vector<Placement> placements);  // also marks held experts
  absl::Status WriteCheckpoint();
  absl::Status LoadCheckpoint();
  // recovery.cpp: membership agreement, re-plan, transfers or checkpoint, new communicator.
  absl::Status Recover(StepReport& report);
  absl::StatusOr<std::vector<int>> AgreeMembership(int64_t* agreed_step);

  std::shared_ptr<transport::Store> store_;
  int physical_;
  RuntimeOptions options_;
  Layout layout_;
  int epoch_ = 0;
  std::vector<int> members_;  // physical ranks in plan order (= communicator rank order)
  int index_ = 0;             // my plan node / communicator rank
  std::vector<Placement> placements_;
  std::vector<char> held_;  // [l * E + e]
  std::optional<transport::Rendezvous> rendezvous_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::vector<float> state_;
  // The state before the last applied step: a survivor that finished a step its peers did not
  // (the dead rank failed during the last allreduce) rolls back to it.
  std::vector<float> previous_state_;
  int64_t step_ = 0;
};

}  // namespace plexus::moe::runtime
