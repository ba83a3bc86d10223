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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::moe {

struct ModelSpec {
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
int64_t ExpertParameterCount(const ModelSpec& config);

enum class RecoveryMode {
  kElastic,            // Lazarus: re-plan and continue from the same step
  kCheckpointRestart,  // baseline: everyone reloads the last checkpoint
};
const char* RecoveryModeName(RecoveryMode mode);

struct RuntimeOptions {
  ModelSpec model;
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
  // Every this many steps plan node 0 looks for join requests in the store (one store round
  // trip); the count rides on the step's allreduce, so every member admits the same joiners
  // after the same step. 0: the job admits nobody.
  int join_poll_every = 1;
  // Trainer::Join: how long a newcomer waits for the job to admit it.
  absl::Duration join_timeout = absl::Minutes(5);
  // A failure during recovery makes the survivors agree again and retry, at most this many
  // times in a row, before Step() returns the error.
  int max_recovery_attempts = 3;
  // Fault injection for tests: called with the physical rank and a point of the protocol
  // ("agreed", "connected", "transferred"); it may block to play a rank that hangs or dies there.
  std::function<void(int physical, const char* point)> fault_hook;
};

// What one call of Step did.
struct StepReport {
  int64_t step = 0;          // the step trained (or, after a failure, the step training resumes at)
  double loss = 0;           // mean squared error of the step's global batch (0 when failed)
  bool failed = false;       // a peer failed; the step was not applied and recovery ran
  std::string error;         // the communicator's error that revealed the failure
  std::vector<int> members;  // physical ranks after recovery (or after admitting joiners)
  std::vector<int> joined;   // physical ranks admitted after this step (they host experts now)
  int recovery_attempts = 0;        // agreements needed: > 1 when a member failed during recovery
  bool checkpoint_restart = false;  // recovery reloaded a checkpoint (mode, or an expert lost)
  int64_t steps_lost = 0;           // steps that must be redone
  int64_t experts_fetched = 0;      // expert states received from surviving owners (all ranks)
  double detect_seconds = 0;        // step start to the error
  double recovery_seconds = 0;      // error to ready for the next step
};

class Trainer {
 public:
  // Collective over `world_size` ranks sharing `store` (every rank calls it). Rank r is physical
  // node r of the plan. When the store is served by one of the ranks (rank 0 under plexus-run,
  // torchrun --standalone, mpirun), that rank's death ends the job with an error naming the
  // store; with a store that outlives it (FileStore, an external TcpStoreServer) any rank may die.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(std::shared_ptr<transport::Store> store,
                                                         int rank, int world_size,
                                                         RuntimeOptions options);
  // A new rank joining the running job that uses `store` (the job's store, e.g. from
  // transport::OpenJobStore in plexus/transport/join.hpp; `options` as the job's). It asks to
  // join; at its next poll (RuntimeOptions::join_poll_every) the job finishes the step, the
  // members re-plan with it, send it the gate and the experts it now hosts (spread over their
  // owners), and training goes on at the same step with it. Returns once it is a member (step() is
  // the step it joined at); DeadlineExceeded after `join_timeout` when no job admits it.
  static absl::StatusOr<std::unique_ptr<Trainer>> Join(std::shared_ptr<transport::Store> store,
                                                       RuntimeOptions options);
  virtual ~Trainer() = default;

  // Trains step(); on success step() advances, and joiners waiting then are admitted (joined).
  // When a peer fails, recovers (elastic, or from the checkpoint when asked or when an expert
  // lost every replica) and returns failed = true; the caller simply calls Step() again. A
  // failure during recovery restarts the agreement with the new membership. An error only when
  // recovery itself is impossible (this rank was left out of the new membership, no checkpoint
  // to fall back to, store unreachable, max_recovery_attempts failures in a row).
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
absl::StatusOr<std::vector<float>> TrainReference(const ModelSpec& config, int64_t steps,
                                                  std::vector<double>* losses = nullptr);

}  // namespace plexus::moe
