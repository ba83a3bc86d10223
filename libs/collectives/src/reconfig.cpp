// Live reconfiguration: the sequence-number barrier of MCCS over the rendezvous store, without a
// daemon (reconfig.hpp; docs/collectives_operations.md, "Live reconfiguration").
//
// A request is numbered by the store's counter (<prefix>count) and written at <prefix>req/<k>.
// Every rank's watcher thread reads requests in that order and runs one round per request:
//   1. freeze: a collective issued now waits (IssueCollective);
//   2. publish how many this rank issued at <prefix>rep/<k>/<rank>;
//   3. read every rank's count; the change lands on collective S = max(counts, previous S);
//   4. unfreeze.
// No rank issued collective S before publishing (it was frozen from its count on), so every rank
// runs collectives < S, including those queued when it learnt of the change, with the old
// configuration and S onwards with the new one (applied when collective S starts to run,
// BeginCollective). The watcher is a thread of its own so that a rank blocked inside a collective
// still publishes: freezing never waits for a collective to finish, so it cannot deadlock.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "communicator_impl.hpp"
#include "peer_transport.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/record.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives {

std::string RingOrderText(const std::vector<int>& order) { return absl::StrJoin(order, ","); }

absl::StatusOr<std::vector<int>> ParseRingOrder(std::string_view text) {
  std::vector<int> order;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipWhitespace())) {
    int r = 0;
    if (!absl::SimpleAtoi(item, &r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring order '", std::string(text), "': '", item, "' is not a rank number"));
    }
    order.push_back(r);
  }
  if (order.empty()) {
    return absl::InvalidArgumentError("ring order is empty (expected e.g. 0,2,1,3)");
  }
  return order;
}

std::string OverridesText(const AlgorithmOverrides& overrides) {
  std::vector<std::string> items;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const Algorithm a = overrides.by_collective[k];
    if (a == Algorithm::kAuto) continue;
    items.push_back(absl::StrCat(std::string(CollectiveName(static_cast<CollectiveKind>(k))), ":",
                                 std::string(AlgorithmName(a))));
  }
  return absl::StrJoin(items, ",");
}

std::string TransportChoiceText(const TransportChoice& choice) {
  const std::string backend(transport::BackendName(choice.backend));
  return choice.policy == TransportPolicy::kPerPeer ? backend + "/per_peer" : backend;
}

absl::StatusOr<TransportChoice> ParseTransportChoice(std::string_view text) {
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(text.data(), text.size()), absl::MaxSplits('/', 1));
  TransportChoice choice;
  auto backend = transport::ParseBackend(parts[0]);
  if (!backend.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport '", std::string(text), "': ", backend.status().message()));
  }
  choice.backend = *backend;
  if (parts.size() == 2) {
    auto policy = internal::ParseTransportPolicy(parts[1]);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("transport '", std::string(text),
                                                     "': ", policy.status().message(),
                                                     " (expected e.g. shm, tcp or tcp/per_peer)"));
    }
    choice.policy = *policy;
  }
  return choice;
}

}  // namespace plexus::collectives

namespace plexus::collectives::internal {
namespace {

// How long a watcher's blocking store call lasts before it looks at its stop flag: idle (a
// destroyed communicator also posts a stop request that wakes it at once), and within a round.
constexpr absl::Duration kIdleSlice = absl::Seconds(1);
constexpr absl::Duration kRoundSlice = absl::Milliseconds(50);

// A request on the store: a base::Record of this kind and version.
constexpr std::string_view kRequestRecord = "collectives.reconfig";
constexpr uint16_t kRequestVersion = 1;
// Bounds the decoder holds a request to (the requester checked the values themselves).
constexpr size_t kMaxRequestRanks = size_t{1} << 20;
constexpr size_t kMaxRequestTextBytes = 4096;

const base::Param<bool> kReconfigParam(
    "PLEXUS_COLL_RECONFIG", true,
    "live reconfiguration: a watcher thread per communicator reading change requests from the "
    "rendezvous store (0: off; must be equal on every rank)");

std::mutex hook_mu;
ReconfigHook& Hook() {
  static ReconfigHook* hook = new ReconfigHook();
  return *hook;
}
ReconfigLandingHook& LandingHook() {
  static ReconfigLandingHook* hook = new ReconfigLandingHook();
  return *hook;
}
void CallHook(int rank, uint64_t epoch, ReconfigStep step) {
  ReconfigHook hook;
  {
    std::lock_guard<std::mutex> lock(hook_mu);
    hook = Hook();
  }
  if (hook) hook(rank, epoch, step);
}

absl::Status CheckRingOrder(const std::vector<int>& order, int n) {
  if (static_cast<int>(order.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("ring order [", RingOrderText(order), "] has ",
                                                   order.size(), " entries; the communicator has ",
                                                   n, " ranks"));
  }
  std::vector<bool> seen(n, false);
  for (int r : order) {
    if (r < 0 || r >= n || seen[r]) {
      return absl::InvalidArgumentError(absl::StrCat("ring order [", RingOrderText(order),
                                                     "] is not a permutation of 0..", n - 1));
    }
    seen[r] = true;
  }
  return absl::OkStatus();
}

}  // namespace

void SetReconfigTestHook(ReconfigHook hook) {
  std::lock_guard<std::mutex> lock(hook_mu);
  Hook() = std::move(hook);
}

void SetReconfigLandingTestHook(ReconfigLandingHook hook) {
  std::lock_guard<std::mutex> lock(hook_mu);
  LandingHook() = std::move(hook);
}

std::string EncodeReconfiguration(const Reconfiguration& change, int requester) {
  base::RecordWriter w(kRequestRecord, kRequestVersion);
  w.Int("requester", requester);
  if (change.ring_order) w.Ints("ring_order", *change.ring_order);
  // Algorithms and transport travel in their own text forms (the ones the admin endpoint and
  // the environment take), parsed back by the same parsers.
  if (change.algorithms) w.String("algorithms", OverridesText(*change.algorithms));
  if (change.channels) w.Int("channels", *change.channels);
  if (change.transport) w.String("transport", TransportChoiceText(*change.transport));
  return w.Finish();
}

absl::StatusOr<DecidedChange> DecodeReconfiguration(std::string_view text) {
  PLEXUS_ASSIGN_OR_RETURN(base::RecordReader r,
                          base::RecordReader::Parse(text, kRequestRecord, kRequestVersion));
  DecidedChange out;
  out.requester = r.IntAs<int>("requester", 0);
  if (r.Has("ring_order")) out.change.ring_order = r.Ints<int>("ring_order", kMaxRequestRanks, 0);
  if (r.Has("algorithms")) {
    auto algorithms = AlgorithmOverrides::Parse(r.String("algorithms", kMaxRequestTextBytes));
    if (algorithms.ok()) {
      out.change.algorithms = *algorithms;
    } else {
      r.Fail("algorithms", std::string(algorithms.status().message()));
    }
  }
  if (r.Has("channels")) out.change.channels = r.IntAs<int>("channels", 1, kMaxChannels);
  if (r.Has("transport")) {
    auto transport = ParseTransportChoice(r.String("transport", kMaxRequestTextBytes));
    if (transport.ok()) {
      out.change.transport = *transport;
    } else {
      r.Fail("transport", std::string(transport.status().message()));
    }
  }
  PLEXUS_RETURN_IF_ERROR(r.Finish());
  return out;
}

std::string Reconfigurer::ReconfigKey(std::string_view what, uint64_t epoch, int rank) const {
  if (rank < 0) return absl::StrCat(reconf_.prefix, std::string(what), "/", epoch);
  return absl::StrCat(reconf_.prefix, std::string(what), "/", epoch, "/", rank);
}

absl::Status Reconfigurer::Start(Setup setup) {
  PLEXUS_ASSIGN_OR_RETURN(const bool enabled, kReconfigParam.Get());
  setup_ = std::move(setup);
  reconf_.prefix = absl::StrCat("plexus/coll/reconf/", setup_.uid, "/");
  reconf_.active = setup_.active;
  if (!enabled) {
    reconf_.lost = absl::FailedPreconditionError(absl::StrCat(
        "rank ", setup_.rank, ": live reconfiguration is off (", kReconfigParam.name(), "=0)"));
  } else if (setup_.n > 1) {
    reconf_.watcher = std::thread([this] { WatchReconfigurations(); });
  }
  return absl::OkStatus();
}

void Reconfigurer::Stop() {
  if (!reconf_.watcher.joinable()) return;
  reconf_.stop.store(true);
  // Wake the watchers blocked on the next request at once (every rank is past the destructor's
  // barrier, or the communicator is broken: no real request can follow). Best effort: without
  // it a watcher notices the stop flag within kIdleSlice.
  auto& store_ = setup_.store;
  if (auto k = store_->Add(absl::StrCat(reconf_.prefix, "count"), 1); k.ok()) {
    (void)store_->Set(ReconfigKey("req", static_cast<uint64_t>(*k)), kCloseRequest);
  }
  reconf_.watcher.join();
}

absl::StatusOr<uint64_t> Reconfigurer::Request(const Reconfiguration& change) {
  const int n = setup_.n;
  const int rank = setup_.rank;
  auto& store_ = setup_.store;
  if (!change.ring_order && !change.algorithms && !change.channels && !change.transport) {
    return absl::InvalidArgumentError(
        absl::StrCat("RequestReconfiguration on rank ", rank,
                     ": the change is empty (set ring_order, algorithms, channels or transport)"));
  }
  if (change.transport) {
    if (setup_.caller_device) {
      return absl::FailedPreconditionError(
          absl::StrCat("RequestReconfiguration on rank ", rank,
                       ": this communicator was created on the caller's device, which decides its "
                       "connections: its transport cannot change"));
    }
    std::string why;
    if (static_cast<unsigned>(change.transport->backend) >
            static_cast<unsigned>(transport::Backend::kVerbs) ||
        !transport::Device::Available(change.transport->backend, &why)) {
      return absl::InvalidArgumentError(
          absl::StrCat("RequestReconfiguration on rank ", rank, ": transport ",
                       TransportChoiceText(*change.transport), " is not available here: ", why));
    }
  }
  if (change.ring_order) {
    if (absl::Status s = CheckRingOrder(*change.ring_order, n); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("RequestReconfiguration on rank ", rank, ": ", s.message()));
    }
  }
  if (change.channels && (*change.channels < 1 || *change.channels > kMaxChannels)) {
    return absl::InvalidArgumentError(absl::StrCat("RequestReconfiguration on rank ", rank,
                                                   ": channels must be 1 to ", kMaxChannels,
                                                   " (kMaxChannels), got ", *change.channels));
  }
  PLEXUS_RETURN_IF_ERROR(setup_.health());
  {
    std::lock_guard<std::mutex> lock(reconf_.mu);
    if (!reconf_.lost.ok()) return reconf_.lost;
  }
  if (n == 1) {
    std::lock_guard<std::mutex> lock(reconf_.mu);
    DecidedChange decided;
    decided.epoch = ++reconf_.local_epochs;
    decided.sequence = std::max(reconf_.issued, reconf_.last_sequence);
    decided.requester = 0;
    decided.change = change;
    reconf_.last_sequence = decided.sequence;
    reconf_.decided_epoch = decided.epoch;
    reconf_.history[decided.epoch] = decided.sequence;
    reconf_.pending.push_back(std::move(decided));
    reconf_.cv.notify_all();
    return reconf_.decided_epoch;
  }
  auto k = store_->Add(absl::StrCat(reconf_.prefix, "count"), 1);
  if (!k.ok()) {
    return absl::Status(k.status().code(), absl::StrCat("RequestReconfiguration on rank ", rank,
                                                        ": numbering the request on the store: ",
                                                        k.status().message()));
  }
  const uint64_t epoch = static_cast<uint64_t>(*k);
  if (absl::Status s = store_->Set(ReconfigKey("req", epoch), EncodeReconfiguration(change, rank));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("RequestReconfiguration on rank ", rank,
                                               ": publishing request ", epoch, ": ", s.message()));
  }
  return epoch;
}

absl::StatusOr<uint64_t> Reconfigurer::Await(uint64_t epoch, absl::Duration timeout) {
  const int rank = setup_.rank;
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(reconf_.mu);
  for (;;) {
    if (reconf_.decided_epoch >= epoch) {
      auto it = reconf_.history.find(epoch);
      if (it == reconf_.history.end()) {
        return absl::NotFoundError(
            absl::StrCat("AwaitReconfiguration on rank ", rank, ": epoch ", epoch,
                         " is not a change of this communicator, or is older than the last ",
                         ReconfigState::kMaxHistory, " decisions"));
      }
      return it->second;
    }
    lock.unlock();
    PLEXUS_RETURN_IF_ERROR(setup_.health());
    lock.lock();
    if (reconf_.decided_epoch >= epoch) continue;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "AwaitReconfiguration on rank ", rank, ": epoch ", epoch, " not decided after ",
          absl::FormatDuration(timeout), " (last decided: ", reconf_.decided_epoch, ")"));
    }
    reconf_.cv.wait_for(lock, absl::ToChronoNanoseconds(std::min(deadline - now, kRoundSlice)));
  }
}

ActiveConfiguration Reconfigurer::configuration() const {
  std::lock_guard<std::mutex> lock(reconf_.mu);
  return reconf_.active;
}

uint64_t Reconfigurer::issued() const {
  std::lock_guard<std::mutex> lock(reconf_.mu);
  return reconf_.issued;
}

absl::Status Reconfigurer::Issue() {
  std::unique_lock<std::mutex> lock(reconf_.mu);
  bool waited = false;
  if (reconf_.frozen) {
    // The watcher always unfreezes: on a decision, an error (the communicator breaks) or a stop.
    reconf_.cv.wait(lock, [&] { return !reconf_.frozen; });
    waited = true;
  }
  ++reconf_.issued;
  lock.unlock();
  return waited ? setup_.health() : absl::OkStatus();
}

void Reconfigurer::TakeLanding(uint64_t sequence, std::vector<DecidedChange>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(reconf_.mu);
  while (!reconf_.pending.empty() && reconf_.pending.front().sequence <= sequence) {
    out->push_back(std::move(reconf_.pending.front()));
    reconf_.pending.pop_front();
  }
}

void Reconfigurer::UpdateActive(absl::FunctionRef<void(ActiveConfiguration&)> update) {
  std::lock_guard<std::mutex> lock(reconf_.mu);
  update(reconf_.active);
}

absl::Status CommunicatorImpl::StartReconfiguration() {
  Reconfigurer::Setup setup;
  setup.rank = layout_.rank;
  setup.n = layout_.n;
  setup.uid = uid_;
  setup.store = store_;
  setup.timeout = options_.timeout;
  setup.caller_device = caller_device_;
  setup.active.ring_order = layout_.order;
  setup.active.algorithms = options_.algorithms;
  setup.active.channels = layout_.channels;
  setup.active.connected_channels = options_.channels;
  setup.active.transport = {options_.device.backend, options_.transport_policy};
  setup.active.peer_backends = peer_backend_;
  setup.health = [this] { return health(); };
  setup.on_error = [this](absl::Status status) { issue_.Break(std::move(status)); };
  return reconfig_.Start(std::move(setup));
}

absl::Status CommunicatorImpl::BeginCollective() {
  reconfig_.TakeLanding(collective_seq_, &landing_);
  if (landing_.empty()) return absl::OkStatus();
  std::optional<TransportChoice> transport;
  std::optional<int> channels;
  uint64_t epoch = 0;
  for (const DecidedChange& decided : landing_) {
    ApplyChange(decided);
    // The last one landing here wins (per field). Every rank reads the same requests, so an
    // out-of-range count (only from a corrupted store: the requester checked it) is ignored
    // everywhere alike.
    const std::optional<int>& c = decided.change.channels;
    if (c && *c >= 1 && *c <= kMaxChannels) {
      channels = *c;
      epoch = decided.epoch;
    }
    if (decided.change.transport) {
      transport = decided.change.transport;
      epoch = decided.epoch;
    }
  }
  reconfig_.UpdateActive([&](ActiveConfiguration& active) {
    active.ring_order = layout_.order;
    active.algorithms = options_.algorithms;
    active.epoch = config_epoch_;
    active.since_sequence = collective_seq_;
  });
  // Connecting takes a while; the watcher runs the next round meanwhile.
  if (transport || channels) return ChangeConnections(transport, channels, epoch);
  return absl::OkStatus();
}

void CommunicatorImpl::ApplyChange(const DecidedChange& decided) {
  const Reconfiguration& change = decided.change;
  if (change.ring_order && CheckRingOrder(*change.ring_order, layout_.n).ok()) {
    layout_.order = *change.ring_order;
    for (int i = 0; i < layout_.n; ++i) layout_.position[layout_.order[i]] = i;
    call_layout_.order = layout_.order;
    call_layout_.position = layout_.position;
    options_.ring_order = layout_.order;
  }
  if (change.algorithms) options_.algorithms = *change.algorithms;
  // Channels and transport: ChangeConnections, once every change landing here is read.
  config_epoch_ = decided.epoch;
  if (debug_) {
    base::Logf(base::LogLevel::kInfo,
               "[plexus-coll rank %d] reconfiguration epoch %llu (from rank %d) lands on "
               "collective %llu: ring order [%s], algorithms '%s', %d channel(s) asked",
               layout_.rank, static_cast<unsigned long long>(decided.epoch), decided.requester,
               static_cast<unsigned long long>(decided.sequence),
               RingOrderText(layout_.order).c_str(), OverridesText(options_.algorithms).c_str(),
               change.channels.value_or(layout_.channels));
  }
}

void Reconfigurer::BreakFromWatcher(absl::Status status) {
  setup_.on_error(std::move(status));
  std::lock_guard<std::mutex> lock(reconf_.mu);
  reconf_.frozen = false;
  reconf_.cv.notify_all();
}

void Reconfigurer::WatchReconfigurations() {
  auto& store_ = setup_.store;
  for (uint64_t epoch = 1; !reconf_.stop.load();) {
    auto payload = store_->Get(ReconfigKey("req", epoch), kIdleSlice);
    if (reconf_.stop.load()) return;
    if (!payload.ok()) {
      if (payload.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      // The store is gone (e.g. rank 0 destroyed the rendezvous serving it): collectives go on;
      // only reconfiguration stops (a request fails with this error; a peer that still reaches
      // the store and requests a change times out waiting for this rank and breaks).
      std::lock_guard<std::mutex> lock(reconf_.mu);
      reconf_.lost = absl::Status(
          payload.status().code(),
          absl::StrCat("rank ", setup_.rank, ": live reconfiguration is off: reading request ",
                       epoch, " from the store failed: ", payload.status().message()));
      return;
    }
    if (*payload == kCloseRequest) return;
    if (absl::Status s = RunReconfigRound(epoch, *payload); !s.ok()) {
      if (!reconf_.stop.load()) BreakFromWatcher(std::move(s));
      std::lock_guard<std::mutex> lock(reconf_.mu);
      reconf_.frozen = false;
      reconf_.cv.notify_all();
      return;
    }
    ++epoch;
  }
}

absl::Status Reconfigurer::RunReconfigRound(uint64_t epoch, const std::string& payload) {
  const int n = setup_.n;
  const int rank = setup_.rank;
  auto& store_ = setup_.store;
  const absl::Duration timeout = setup_.timeout;
  CallHook(rank, epoch, ReconfigStep::kSeen);
  // Every rank reads the same text, so an undecodable request is a no-op round everywhere (the
  // requester validated it; this only guards against a corrupted store).
  auto decoded = DecodeReconfiguration(payload);
  DecidedChange decided = decoded.ok() ? *std::move(decoded) : DecidedChange{};
  decided.epoch = epoch;
  uint64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(reconf_.mu);
    reconf_.frozen = true;
    count = reconf_.issued;
  }
  CallHook(rank, epoch, ReconfigStep::kFrozen);
  const std::string where = absl::StrCat("rank ", rank, ": live reconfiguration epoch ", epoch);
  if (absl::Status s = store_->Set(ReconfigKey("rep", epoch, rank), absl::StrCat(count)); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(where, ": publishing this rank's count: ", s.message()));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(ReconfigKey("rep", epoch, r));
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Status s = store_->Wait(keys, kRoundSlice);
    if (s.ok()) break;
    if (reconf_.stop.load()) return absl::CancelledError(where + ": communicator destroyed");
    if (s.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(s.code(),
                          absl::StrCat(where, ": waiting for the ranks' counts: ", s.message()));
    }
    if (absl::Now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r) {
        auto there = store_->Check({keys[r]});
        if (there.ok() && !*there) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": rank(s) ", absl::StrJoin(missing, ","),
          " published no collective count within ", absl::FormatDuration(timeout),
          " (dead, its communicator destroyed, or ", kReconfigParam.name(), "=0 there)"));
    }
  }
  uint64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(reconf_.mu);
    sequence = reconf_.last_sequence;
  }
  for (int r = 0; r < n; ++r) {
    auto value = store_->Get(keys[r], timeout);
    uint64_t theirs = 0;
    if (!value.ok() || !absl::SimpleAtoi(*value, &theirs)) {
      return absl::DataLossError(absl::StrCat(
          where, ": reading rank ", r, "'s count: ",
          value.ok() ? "'" + *value + "' is not a number" : std::string(value.status().message())));
    }
    sequence = std::max(sequence, theirs);
  }
  decided.sequence = sequence;
  {
    ReconfigLandingHook landing;
    {
      std::lock_guard<std::mutex> lock(hook_mu);
      landing = LandingHook();
    }
    if (landing) decided.sequence = landing(rank, epoch, sequence);
  }
  {
    std::lock_guard<std::mutex> lock(reconf_.mu);
    reconf_.last_sequence = sequence;
    reconf_.decided_epoch = epoch;
    reconf_.history[epoch] = sequence;
    while (reconf_.history.size() > ReconfigState::kMaxHistory) {
      reconf_.history.erase(reconf_.history.begin());
    }
    reconf_.pending.push_back(std::move(decided));
    reconf_.frozen = false;
  }
  reconf_.cv.notify_all();
  CallHook(rank, epoch, ReconfigStep::kDecided);
  // Every rank finished round epoch - 1 before publishing for this one, so nobody reads the keys
  // of round epoch - 2 any more: each rank removes its count, rank 0 the request.
  if (epoch > 2) {
    const uint64_t old = epoch - 2;
    (void)store_->Delete(ReconfigKey("rep", old, rank));
    if (rank == 0) (void)store_->Delete(ReconfigKey("req", old));
  }
  return absl::OkStatus();
}

}  // namespace plexus::collectives::internal
