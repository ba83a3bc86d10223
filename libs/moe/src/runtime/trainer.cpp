// The training step of the runtime: route, dispatch over AllToAllV, run the local expert
// replicas, combine, backward the same way, one exact int64 allreduce of every gradient.
#include "runtime/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/file.hpp"
#include "plexus/base/status.hpp"
#include "plexus/moe/allocation.hpp"
#include "plexus/moe/exchange.hpp"
#include "runtime/checkpoint.hpp"

namespace plexus::moe::runtime {
namespace {

using collectives::DataType;
using collectives::ReduceOp;

// dh = g + sum_k dh_k: the residual plus each expert's input gradient, in k order.
void SumInputGradients(const ModelSpec& c, const float* g, const float* const* dh_k, float* dh) {
  for (int d = 0; d < c.hidden; ++d) {
    float v = g[d];
    for (int k = 0; k < c.top_k; ++k) v += dh_k[k][d];
    dh[d] = v;
  }
}

void Scale(const ModelSpec& c, float p, const float* g, float* out) {
  for (int d = 0; d < c.hidden; ++d) out[d] = p * g[d];
}

void ApplyAll(const Layout& L, const std::vector<int64_t>& grad, const std::vector<char>& held,
              std::vector<float>& state) {
  const ModelSpec& c = L.config;
  ApplyUpdate(c, state.data(), state.data() + L.gate_size, grad.data(), L.gate_size,
              c.tokens_per_step);
  for (int l = 0; l < c.layers; ++l) {
    for (int e = 0; e < c.experts; ++e) {
      if (!held[l * c.experts + e]) continue;
      float* w = state.data() + L.ExpertOffset(l, e);
      ApplyUpdate(c, w, w + L.expert_params, grad.data() + L.GradExpertOffset(l, e),
                  L.expert_params, c.tokens_per_step);
    }
  }
}

}  // namespace

absl::Status ValidateConfig(const ModelSpec& c) {
  if (c.layers < 1 || c.experts < 1 || c.hidden < 1 || c.ffn < 1 || c.tokens_per_step < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model config: layers (%d), experts (%d), hidden (%d), ffn (%d) and tokens_per_step (%d) "
        "must be >= 1",
        c.layers, c.experts, c.hidden, c.ffn, c.tokens_per_step));
  }
  if (c.top_k != 1 && c.top_k != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: top_k must be 1 or 2, not ", c.top_k));
  }
  if (c.top_k > c.experts) {
    return absl::InvalidArgumentError("model config: top_k exceeds the number of experts");
  }
  if (!(c.skew >= 0) || !std::isfinite(c.skew)) {
    return absl::InvalidArgumentError("model config: skew must be finite and >= 0");
  }
  return absl::OkStatus();
}

std::vector<double> ExpectedLoads(const ModelSpec& c) {
  std::vector<double> loads(c.experts);
  for (int e = 0; e < c.experts; ++e) loads[e] = std::pow(e + 1.0, -c.skew);
  return loads;
}

TrainerImpl::TrainerImpl(std::shared_ptr<transport::Store> store, int rank, RuntimeOptions options)
    : store_(std::move(store)),
      physical_(rank),
      options_(std::move(options)),
      layout_(options_.model) {}

TrainerImpl::~TrainerImpl() = default;

std::vector<int> TrainerImpl::HeldExperts(int layer) const {
  std::vector<int> out;
  for (int e = 0; e < layout_.config.experts; ++e) {
    if (held_[layer * layout_.config.experts + e]) out.push_back(e);
  }
  return out;
}

void TrainerImpl::SetPlacements(std::vector<Placement> placements) {
  const ModelSpec& c = layout_.config;
  placements_ = std::move(placements);
  held_.assign(c.layers * c.experts, 0);
  for (int l = 0; l < c.layers && index_ >= 0; ++l) {
    for (int e : placements_[l].node_slots[index_]) held_[l * c.experts + e] = 1;
  }
  // Experts this rank does not hold are poisoned, so that using one shows at once.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (state_.empty()) return;
  for (int l = 0; l < c.layers; ++l) {
    for (int e = 0; e < c.experts; ++e) {
      if (held_[l * c.experts + e]) continue;
      float* w = state_.data() + layout_.ExpertOffset(l, e);
      std::fill(w, w + 2 * layout_.expert_params, nan);
    }
  }
}

absl::Status TrainerImpl::Connect(int index, int size) {
  comm_.reset();
  rendezvous_.reset();
  auto store = transport::PrefixStore(store_, absl::StrCat("plexus-moe/epoch", epoch_, "/"));
  PLEXUS_ASSIGN_OR_RETURN(transport::Rendezvous rdv,
                          transport::Rendezvous::Create(index, size, std::move(store)));
  rendezvous_.emplace(std::move(rdv));
  auto comm = collectives::Communicator::Create(*rendezvous_, options_.comm);
  if (!comm.ok()) {
    return base::Annotate(comm.status(), absl::StrFormat("moe runtime: physical rank %d, epoch %d",
                                                         physical_, epoch_));
  }
  comm_ = std::move(*comm);
  return absl::OkStatus();
}

absl::Status TrainerImpl::Start(std::vector<int> members) {
  PLEXUS_RETURN_IF_ERROR(ValidateConfig(layout_.config));
  members_ = std::move(members);
  const int n = static_cast<int>(members_.size());
  index_ =
      static_cast<int>(std::find(members_.begin(), members_.end(), physical_) - members_.begin());
  if (index_ == n) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe runtime: physical rank ", physical_, " is not a member"));
  }
  std::vector<Placement> placements;
  const std::vector<double> loads = ExpectedLoads(layout_.config);
  for (int l = 0; l < layout_.config.layers; ++l) {
    PLEXUS_ASSIGN_OR_RETURN(Allocation alloc,
                            AllocateReplicas(loads, {.num_nodes = n,
                                                     .slots_per_node = options_.slots_per_node,
                                                     .min_replicas = options_.min_replicas}));
    // The library's default, like the re-plans of MoveTo (ReconfigureInput's policy).
    PLEXUS_ASSIGN_OR_RETURN(Placement p, PlaceExperts(PlacementPolicy::kBest, alloc.replicas, n,
                                                      options_.slots_per_node, alloc.ascending));
    placements.push_back(std::move(p));
  }
  if (state_.empty()) state_ = InitialState(layout_);
  SetPlacements(std::move(placements));
  ++generation_;
  return Connect(index_, n);
}

absl::StatusOr<double> TrainerImpl::TrainStep() {
  const ModelSpec& c = layout_.config;
  const int H = c.hidden, K = c.top_k, E = c.experts;
  const int n_ranks = static_cast<int>(members_.size());
  const int64_t begin = int64_t{c.tokens_per_step} * index_ / n_ranks;
  const int64_t end = int64_t{c.tokens_per_step} * (index_ + 1) / n_ranks;
  const int64_t n = end - begin;
  const int64_t units = n * K;

  struct LayerData {
    std::vector<float> h;  // inputs of the local tokens [n][H]
    std::vector<Route> routes;
    std::vector<float> f;  // expert output of each unit (token, choice) [n*K][H]
    std::vector<int> unit_expert;
    std::vector<int64_t> send_units;   // unit of each send-buffer token
    std::vector<int64_t> local_units;  // units computed here
    std::vector<int> recv_expert;      // expert of each received token
    std::vector<float> recv_h;
    ElementExchange x;
  };
  std::vector<LayerData> layers(c.layers);
  std::vector<float> h(std::max<int64_t>(n, 1) * H), y(std::max<int64_t>(n, 1) * H);
  MakeBatch(c, step_, begin, end, h.data(), y.data());

  // [gradients | loss | join requests]: the last slot is plan node 0's count of join requests
  // (the others add 0), so that every member learns it from the same step.
  std::vector<int64_t> grad(layout_.GradSize() + 1, 0);
  if (index_ == 0 && options_.join_poll_every > 0 && step_ % options_.join_poll_every == 0) {
    absl::StatusOr<int64_t> requests = store_->Add(kJoinRequestsKey, 0);
    if (!requests.ok()) return StoreError(requests.status(), "polling for join requests");
    grad.back() = *requests;
  }
  auto expert_w = [&](int l, int e) { return state_.data() + layout_.ExpertOffset(l, e); };
  auto check_held = [&](int l, int e) -> absl::Status {
    if (held_[l * E + e]) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat(
        "moe runtime: rank %d got tokens of layer %d expert %d, which it does not hold", physical_,
        l, e));
  };

  for (int l = 0; l < c.layers; ++l) {
    LayerData& d = layers[l];
    d.h = h;
    const float* gate = state_.data() + layout_.GateOffset(l);
    d.routes.resize(n);
    d.unit_expert.resize(units);
    std::vector<int64_t> counts(E, 0);
    for (int64_t i = 0; i < n; ++i) {
      d.routes[i] = RouteToken(c, gate, &h[i * H]);
      for (int k = 0; k < K; ++k) {
        d.unit_expert[i * K + k] = d.routes[i].expert[k];
        ++counts[d.routes[i].expert[k]];
      }
    }
    std::vector<int64_t> all(int64_t{E} * n_ranks);
    PLEXUS_RETURN_IF_ERROR(comm_->AllGather(counts.data(), all.data(), E, DataType::kI64));
    DispatchInput in;
    in.num_experts = E;
    in.num_ranks = n_ranks;
    in.tokens.resize(int64_t{E} * n_ranks);
    for (int j = 0; j < n_ranks; ++j) {
      for (int e = 0; e < E; ++e) in.tokens[e * n_ranks + j] = all[j * E + e];
    }
    in.replicas = placements_[l].ReplicaMatrix();
    PLEXUS_ASSIGN_OR_RETURN(RankExchange ex, ComputeRankExchange(in, index_));
    // Units of each expert in unit order: the first local[e] stay, the rest fill the sends.
    std::vector<std::vector<int64_t>> by_expert(E);
    for (int64_t u = 0; u < units; ++u) by_expert[d.unit_expert[u]].push_back(u);
    std::vector<size_t> cursor(E, 0);
    for (int e = 0; e < E; ++e) {
      for (int64_t i = 0; i < ex.local[e]; ++i) d.local_units.push_back(by_expert[e][cursor[e]++]);
    }
    for (const TokenFlow& flow : ex.sends) {
      for (int64_t i = 0; i < flow.count; ++i) {
        d.send_units.push_back(by_expert[flow.expert][cursor[flow.expert]++]);
      }
    }
    for (int e = 0; e < E; ++e) {
      if (cursor[e] != by_expert[e].size()) {
        return absl::InternalError(absl::StrFormat(
            "moe runtime: dispatch of layer %d expert %d covers %d of rank %d's %d tokens", l, e,
            cursor[e], physical_, by_expert[e].size()));
      }
    }
    for (const TokenFlow& flow : ex.receives)
      d.recv_expert.insert(d.recv_expert.end(), flow.count, flow.expert);
    d.x = ToElementExchange(ex, H);

    std::vector<float> send(std::max<size_t>(d.x.send_elements, 1));
    for (size_t s = 0; s < d.send_units.size(); ++s) {
      std::memcpy(&send[s * H], &h[(d.send_units[s] / K) * H], H * sizeof(float));
    }
    d.recv_h.assign(std::max<size_t>(d.x.recv_elements, 1), 0.0f);
    PLEXUS_RETURN_IF_ERROR(DispatchTokens(*comm_, d.x, send.data(), d.recv_h.data()));
    std::vector<float> results(d.recv_h.size());
    for (size_t j = 0; j < d.recv_expert.size(); ++j) {
      PLEXUS_RETURN_IF_ERROR(check_held(l, d.recv_expert[j]));
      ExpertForward(c, expert_w(l, d.recv_expert[j]), &d.recv_h[j * H], &results[j * H]);
    }
    d.f.assign(std::max<int64_t>(units, 1) * H, 0.0f);
    for (int64_t u : d.local_units) {
      PLEXUS_RETURN_IF_ERROR(check_held(l, d.unit_expert[u]));
      ExpertForward(c, expert_w(l, d.unit_expert[u]), &h[(u / K) * H], &d.f[u * H]);
    }
    PLEXUS_RETURN_IF_ERROR(CombineTokens(*comm_, d.x, results.data(), send.data()));
    for (size_t s = 0; s < d.send_units.size(); ++s) {
      std::memcpy(&d.f[d.send_units[s] * H], &send[s * H], H * sizeof(float));
    }
    std::vector<float> next(h.size());
    for (int64_t i = 0; i < n; ++i) {
      const float* f[2] = {&d.f[(i * K) * H], &d.f[(i * K + K - 1) * H]};
      Combine(c, &h[i * H], d.routes[i], f, &next[i * H]);
    }
    h = std::move(next);
  }

  // Backward.
  int64_t* loss = &grad[layout_.GradSize() - 1];
  std::vector<float> g(h.size());
  for (int64_t i = 0; i < n; ++i) LossBackward(c, &h[i * H], &y[i * H], loss, &g[i * H]);
  for (int l = c.layers - 1; l >= 0; --l) {
    LayerData& d = layers[l];
    std::vector<float> go(std::max<int64_t>(units, 1) * H);
    for (int64_t u = 0; u < units; ++u) {
      Scale(c, d.routes[u / K].prob[u % K], &g[(u / K) * H], &go[u * H]);
    }
    std::vector<float> send(std::max<size_t>(d.x.send_elements, 1));
    for (size_t s = 0; s < d.send_units.size(); ++s) {
      std::memcpy(&send[s * H], &go[d.send_units[s] * H], H * sizeof(float));
    }
    std::vector<float> recv_go(d.recv_h.size());
    PLEXUS_RETURN_IF_ERROR(DispatchTokens(*comm_, d.x, send.data(), recv_go.data()));
    std::vector<float> recv_dh(d.recv_h.size());
    for (size_t j = 0; j < d.recv_expert.size(); ++j) {
      const int e = d.recv_expert[j];
      ExpertBackward(c, expert_w(l, e), &d.recv_h[j * H], &recv_go[j * H],
                     &grad[layout_.GradExpertOffset(l, e)], &recv_dh[j * H]);
    }
    std::vector<float> dh_unit(go.size());
    for (int64_t u : d.local_units) {
      const int e = d.unit_expert[u];
      ExpertBackward(c, expert_w(l, e), &d.h[(u / K) * H], &go[u * H],
                     &grad[layout_.GradExpertOffset(l, e)], &dh_unit[u * H]);
    }
    PLEXUS_RETURN_IF_ERROR(CombineTokens(*comm_, d.x, recv_dh.data(), send.data()));
    for (size_t s = 0; s < d.send_units.size(); ++s) {
      std::memcpy(&dh_unit[d.send_units[s] * H], &send[s * H], H * sizeof(float));
    }
    const float* gate = state_.data() + layout_.GateOffset(l);
    std::vector<float> dh(g.size());
    for (int64_t i = 0; i < n; ++i) {
      const float* dk[2] = {&dh_unit[(i * K) * H], &dh_unit[(i * K + K - 1) * H]};
      const float* f[2] = {&d.f[(i * K) * H], &d.f[(i * K + K - 1) * H]};
      SumInputGradients(c, &g[i * H], dk, &dh[i * H]);
      GateBackward(c, gate, &d.h[i * H], d.routes[i], f, &g[i * H], &grad[layout_.GateOffset(l)],
                   &dh[i * H]);
    }
    g = std::move(dh);
  }

  PLEXUS_RETURN_IF_ERROR(
      comm_->AllReduce(grad.data(), grad.data(), grad.size(), DataType::kI64, ReduceOp::kSum));
  previous_state_ = state_;
  ApplyAll(layout_, grad, held_, state_);
  join_requests_ = grad.back();
  undo_.reset();  // every member committed the deployment this step ran on
  return LossFromFixed(c, *loss);
}

absl::StatusOr<StepReport> TrainerImpl::Step() {
  StepReport report;
  report.step = step_;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<double> loss = absl::UnavailableError("moe runtime: no communicator");
  std::vector<int> expected = members_;  // who to agree among should the step fail
  if (comm_ != nullptr) loss = TrainStep();
  if (loss.ok()) {
    report.loss = *loss;
    ++step_;
    if (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0) {
      if (absl::Status s = WriteCheckpoint(); !s.ok()) {
        if (!comm_->health().ok())
          loss = s;  // a peer died during the checkpoint's gather
        else
          return s;
      }
    }
    if (loss.ok() && join_requests_ > joins_admitted_) {
      const auto admit_start = std::chrono::steady_clock::now();
      absl::Status s = AdmitJoins(join_requests_, report, &expected);
      if (!s.ok()) loss = s;  // a member failed while admitting: recover below
      report.recovery_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - admit_start).count();
    }
    if (loss.ok()) {
      report.members = members_;
      return report;
    }
  }
  if (!IsPeerFailure(loss.status())) return loss.status();  // a bug, bad input, no store
  report.failed = true;
  report.error = std::string(loss.status().message());
  report.detect_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto recover_start = std::chrono::steady_clock::now();
  PLEXUS_RETURN_IF_ERROR(Recover(report, std::move(expected)));
  report.recovery_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - recover_start).count();
  report.step = step_;
  report.members = members_;
  return report;
}

absl::StatusOr<std::vector<float>> TrainerImpl::GatherState() {
  const ModelSpec& c = layout_.config;
  std::vector<int32_t> bits(layout_.total, 0);
  // Each value comes from exactly one rank (the others add zeros): an exact integer sum.
  if (index_ == 0) std::memcpy(bits.data(), state_.data(), 2 * layout_.gate_size * sizeof(float));
  for (int l = 0; l < c.layers; ++l) {
    const std::vector<std::vector<int>> nodes = placements_[l].ExpertNodes();
    for (int e = 0; e < c.experts; ++e) {
      if (nodes[e].empty() || nodes[e].front() != index_) continue;
      const int64_t off = layout_.ExpertOffset(l, e);
      std::memcpy(&bits[off], &state_[off], 2 * layout_.expert_params * sizeof(float));
    }
  }
  PLEXUS_RETURN_IF_ERROR(
      comm_->AllReduce(bits.data(), bits.data(), bits.size(), DataType::kI32, ReduceOp::kSum));
  std::vector<float> out(layout_.total);
  std::memcpy(out.data(), bits.data(), out.size() * sizeof(float));
  return out;
}

absl::Status TrainerImpl::WriteCheckpoint() {
  PLEXUS_ASSIGN_OR_RETURN(std::vector<float> full, GatherState());
  if (index_ != 0) return absl::OkStatus();
  return base::WriteFileAtomic(options_.checkpoint_path, EncodeCheckpoint(layout_, step_, full));
}

// Every rank loads the same file and decides the same way: a file that is not this run's
// (another model, a later step, corrupt, non-finite) fails the restart on every rank with its
// reason, instead of resuming from it.
absl::Status TrainerImpl::LoadCheckpoint() {
  const std::string& path = options_.checkpoint_path;
  if (options_.checkpoint_every <= 0 || path.empty()) {
    // No checkpoints: a restart begins from the initial model.
    state_ = InitialState(layout_);
    step_ = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> data = base::ReadFile(path);
  if (!data.ok() && data.status().code() == absl::StatusCode::kNotFound) {
    state_ = InitialState(layout_);  // failed before the first checkpoint
    step_ = 0;
    return absl::OkStatus();
  }
  PLEXUS_RETURN_IF_ERROR(data.status());
  PLEXUS_ASSIGN_OR_RETURN(Checkpoint checkpoint, DecodeCheckpoint(*data, path, layout_, step_));
  state_ = std::move(checkpoint.state);
  step_ = checkpoint.step;
  return absl::OkStatus();
}

}  // namespace plexus::moe::runtime

namespace plexus::moe {

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(std::shared_ptr<transport::Store> store,
                                                         int rank, int world_size,
                                                         RuntimeOptions options) {
  if (world_size < 1 || rank < 0 || rank >= world_size || store == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "moe runtime: rank %d of world size %d (and a store) required", rank, world_size));
  }
  if (options.checkpoint_every > 0 && options.checkpoint_path.empty()) {
    return absl::InvalidArgumentError("moe runtime: checkpoint_every > 0 needs checkpoint_path");
  }
  if (rank == 0) {
    // Joiners take the physical ids from world_size on. A counter, not a Set: a counter is the
    // job's, not its writer's, so it outlives rank 0 where keys expire with their writer (etcd);
    // and a second job on the same store and job id is caught here instead of mixing ranks.
    PLEXUS_ASSIGN_OR_RETURN(const int64_t initial,
                            store->Add(runtime::kInitialWorldKey, world_size));
    if (initial != world_size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "moe runtime: %s already holds a Lazarus job's initial world (%d ranks before this "
          "one): another job uses the same store and job id (set a PLEXUS_JOB_ID of its own)",
          store->description(), initial - world_size));
    }
  }
  auto trainer = std::make_unique<runtime::TrainerImpl>(std::move(store), rank, std::move(options));
  trainer->set_initial_world(world_size);
  std::vector<int> members(world_size);
  for (int i = 0; i < world_size; ++i) members[i] = i;
  PLEXUS_RETURN_IF_ERROR(trainer->Start(std::move(members)));
  return trainer;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Join(std::shared_ptr<transport::Store> store,
                                                       RuntimeOptions options) {
  if (store == nullptr)
    return absl::InvalidArgumentError("moe runtime: Join needs the job's store");
  if (options.checkpoint_every > 0 && options.checkpoint_path.empty()) {
    return absl::InvalidArgumentError("moe runtime: checkpoint_every > 0 needs checkpoint_path");
  }
  PLEXUS_RETURN_IF_ERROR(runtime::ValidateConfig(options.model));
  auto trainer = std::make_unique<runtime::TrainerImpl>(std::move(store), -1, std::move(options));
  PLEXUS_RETURN_IF_ERROR(trainer->JoinJob());
  return trainer;
}

}  // namespace plexus::moe
