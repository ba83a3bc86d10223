// The Lazarus runtime: trains a small MoE model (CPU) across ranks with expert replicas placed by
// the Lazarus plan, tokens moved by the dispatcher over AllToAllV, and recovery from a dead rank
// either elastically (re-plan, fetch expert state from survivors, continue at the same step) or
// by checkpoint restart (the DeepSpeed-MoE baseline). docs/moe.md, "Runtime".
//
//   auto rdv = plexus::transport::Rendezvous::FromEnv();
//   auto trainer = plexus::moe::Trainer::Create(rdv->store(), rdv->rank(), rdv->world_size(),
//                                               options);
//   while ((*trainer)->step() < steps) {
//     auto r = (*trainer)->Step();  // recovers from a dead peer inside, see StepReport
//     if (!r.ok()) return r.status();
//   }
//
// Results do not depend on the number of ranks or on how tokens are split between them: every
// step trains on a global batch fixed by (seed, step), each token's forward and backward pass is
// computed the same way wherever it runs, and gradients are summed exactly in int64 fixed point.
// A run that lost a rank therefore ends with the same parameters, bit for bit, as one that did
// not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::moe {

struct ModelConfig {
  int layers = 2;
  int experts = 6;            // per layer
  int hidden = 16;            // token width
  int ffn = 32;               // expert MLP width
  int top_k = 1;              // 1 or 2
  double skew = 1.5;          // routing bias: expert e is favoured in proportion to 1/(e+1)^skew
  int tokens_per_step = 384;  // global batch
  uint64_t seed = 1;
  float learning_rate = 0.05f;
  float momentum = 0.9f;
};

// Floats of one expert's weights (W1, b1, W2, b2); its state is twice that (with momentum).
int64_t ExpertParameterCount(const ModelConfig& config);

enum class RecoveryMode {
  kElastic,            // Lazarus: re-plan and continue from the same step
  kCheckpointRestart,  // baseline: everyone reloads the last checkpoint
};
const char* RecoveryModeName(RecoveryMode mode);

struct RuntimeOptions {
  ModelConfig model;
  int slots_per_node = 4;  // expert replicas per rank and layer (c)
  int min_replicas = 2;    // f
  // The communicator's settings; `timeout` bounds how long a dead peer goes unnoticed.
  collectives::CommunicatorOptions comm;
  RecoveryMode recovery = RecoveryMode::kElastic;
  // A checkpoint every this many steps (0: never) to this file (written atomically by rank 0).
  int checkpoint_every = 0;
  std::string checkpoint_path;
  // After a failure, how long survivors wait for each other before the membership is fixed.
  absl::Duration membership_grace = absl::Seconds(1);
};

// What one call of Step did.
struct StepReport {
  int64_t step = 0;          // the step trained (or, after a failure, the step training resumes at)
  double loss = 0;           // mean squared error of the step's global batch (0 when failed)
  bool failed = false;       // a peer failed; the step was not applied and recovery ran
  std::string error;         // the communicator's error that revealed the failure
  std::vector<int> members;  // physical ranks after recovery
  bool checkpoint_restart = false;  // recovery reloaded a checkpoint (mode, or an expert lost)
  int64_t steps_lost = 0;           // steps that must be redone
  int64_t experts_fetched = 0;      // expert states received from surviving owners (all ranks)
  double detect_seconds = 0;        // step start to the error
  double recovery_seconds = 0;      // error to ready for the next step
};

class Trainer {
 public:
  // Collective over `world_size` ranks sharing `store` (every rank calls it). Rank r is physical
  // node r of the plan; rank 0 must outlive the job (it serves the store).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(std::shared_ptr<transport::Store> store,
                                                         int rank, int world_size,
                                                         RuntimeOptions options);
  virtual ~Trainer() = default;

  // Trains step(); on success step() advances. When a peer fails, recovers (elastic, or from the
  // checkpoint when asked or when an expert lost every replica) and returns failed = true; the
  // caller simply calls Step() again. An error only when recovery itself is impossible (this
  // rank was left out of the new membership, no checkpoint to fall back to, store unreachable).
  virtual absl::StatusOr<StepReport> Step() = 0;

  virtual int64_t step() const = 0;
  virtual int physical_rank() const = 0;
  virtual const std::vector<int>& members() const = 0;  // physical ranks, in plan order
  // The experts this rank holds in `layer` (ascending, no duplicates).
  virtual std::vector<int> HeldExperts(int layer) const = 0;

  // Collective: every parameter of the model (gate, then every expert of every layer: weights
  // and momentum), assembled from the ranks holding them. For tests and checkpoints.
  virtual absl::StatusOr<std::vector<float>> GatherState() = 0;

 protected:
  Trainer() = default;
};

// The same model trained on one process without communication: the reference the distributed
// runs must match bit for bit. Returns GatherState()'s layout after `steps` steps, and the loss
// of each step in `losses` when not null.
absl::StatusOr<std::vector<float>> TrainReference(const ModelConfig& config, int64_t steps,
                                                  std::vector<double>* losses = nullptr);

}  // namespace plexus::moe
