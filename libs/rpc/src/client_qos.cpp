#include "client_qos.hpp"

#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace plexus::rpc::internal {
namespace {

// How often the reorder point looks again while calls wait and no slot was freed through it.
constexpr absl::Duration kLookAgain = absl::Milliseconds(5);

}  // namespace

std::shared_ptr<ClientQos> ClientQos::ForDevice(const std::shared_ptr<transport::Device>& device) {
  struct Entry {
    std::weak_ptr<transport::Device> device;
    const transport::Device* key;
    std::shared_ptr<ClientQos> qos;
  };
  // Never destroyed: its reorder points' threads may outlive static destruction.
  static auto* mu = new std::mutex;
  static auto* registry = new std::vector<Entry>;
  std::vector<std::shared_ptr<ClientQos>> gone;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(*mu);
  std::shared_ptr<ClientQos> found;
  for (auto it = registry->begin(); it != registry->end();) {
    if (it->device.expired()) {
      gone.push_back(std::move(it->qos));
      it = registry->erase(it);
      continue;
    }
    if (it->key == device.get()) found = it->qos;
    ++it;
  }
  if (found == nullptr) {
    found = std::make_shared<ClientQos>();
    registry->push_back({device, device.get(), found});
  }
  return found;
}

ClientQos::~ClientQos() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void ClientQos::Fail(const std::shared_ptr<CallState>& call, absl::Status why) {
  call->has_result = true;
  call->sent = true;
  call->result = std::move(why);
  ChannelCore::Finalize(call);
}

absl::Status ClientQos::Submit(const std::shared_ptr<CallState>& call,
                               const std::shared_ptr<ChannelCore>& core, const CallOptions& options,
                               QosClass cls, const QosSchedule* schedule) {
  call->qos = shared_from_this();
  call->channel = core;  // a blocking caller polls the connection while its call waits here
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::CancelledError("rpc: the QoS reorder point is shutting down");
    if (schedule != nullptr) order_.set_schedule(*schedule);
    const absl::Time now = absl::Now();
    order_.Push(cls, Waiting{call, core, options, cls, now}, now);
    core->qos_queued.fetch_add(1, std::memory_order_relaxed);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    cv_.notify_all();
  }
  Dispatch();
  return absl::OkStatus();
}

void ClientQos::Done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ > 0) --in_flight_;
    if (order_.empty()) return;
  }
  Dispatch();
}

bool ClientQos::Cancel(CallState& call) {
  std::vector<Waiting> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (leaving_ == &call) {
      leaving_cancelled_ = true;  // Dispatch cancels it once it is registered
      return true;
    }
    order_.Extract([&](const Waiting& w) { return w.call.get() == &call; }, &cancelled);
  }
  for (Waiting& w : cancelled) {
    w.core->qos_queued.fetch_sub(1, std::memory_order_relaxed);
    Fail(w.call, absl::CancelledError(absl::StrCat("call ", w.call->info.service->full_name, "/",
                                                   w.call->info.method->name,
                                                   " cancelled by the client while queued for "
                                                   "QoS")));
  }
  return !cancelled.empty();
}

void ClientQos::Dispatch() {
  std::unique_lock<std::mutex> lock(mu_);
  if (dispatching_) {
    again_ = true;
    return;
  }
  dispatching_ = true;
  while (true) {
    again_ = false;
    // Per connection, whether it can take a call now (looked up once per round).
    enum Room : uint8_t { kFull, kFree, kDead };
    absl::InlinedVector<std::pair<const ChannelCore*, Room>, 4> rooms;
    auto room = [&](ChannelCore& core) {
      for (const auto& [c, r] : rooms) {
        if (c == &core) return r;
      }
      std::lock_guard<std::mutex> cl(core.mu);
      const Room r = !core.broken.ok() ? kDead : core.in_flight < core.window ? kFree : kFull;
      rooms.emplace_back(&core, r);
      return r;
    };
    const uint32_t budget = order_.schedule().max_in_flight;
    const bool budget_free = budget == 0 || in_flight_ < budget;
    std::optional<Waiting> w = order_.Pop(absl::Now(), [&](const Waiting& x) {
      const Room r = room(*x.core);
      return r == kDead || (r == kFree && budget_free);  // the dead ones fail at once
    });
    if (!w) {
      if (again_) continue;
      break;
    }
    w->core->qos_queued.fetch_sub(1, std::memory_order_relaxed);
    ++in_flight_;
    w->call->qos_counted = true;  // before it can complete: Finalize gives the slot back
    leaving_ = w->call.get();
    leaving_cancelled_ = false;
    lock.unlock();
    std::optional<absl::Status> sent = w->core->TrySubmit(w->call, w->options);
    lock.lock();
    leaving_ = nullptr;
    const bool cancel = leaving_cancelled_;
    if (!sent && !cancel) {
      // Its slot was taken meanwhile (a call that did not pass this point): first again.
      w->call->qos_counted = false;
      --in_flight_;
      w->core->qos_queued.fetch_add(1, std::memory_order_relaxed);
      const QosClass cls = w->cls;
      const absl::Time queued = w->queued;
      order_.Unpop(cls, std::move(*w), queued);
      continue;
    }
    lock.unlock();
    if (!sent) {  // cancelled while it could not leave
      w->call->qos_counted = false;
      {
        std::lock_guard<std::mutex> relock(mu_);
        --in_flight_;
      }
      Fail(w->call, absl::CancelledError(absl::StrCat(
                        "call ", w->call->info.service->full_name, "/", w->call->info.method->name,
                        " cancelled by the client while queued for QoS")));
    } else if (!sent->ok()) {
      Fail(w->call, *sent);  // Finalize gives the slot back (Done)
    } else if (cancel) {
      CancelCall(*w->call);  // registered with its connection now: the usual cancel
    }
    w.reset();
    lock.lock();
  }
  dispatching_ = false;
}

void ClientQos::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (order_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !order_.empty(); });
      continue;
    }
    absl::Time wake = absl::Now() + kLookAgain;
    order_.ForEach([&](const Waiting& w) { wake = std::min(wake, w.call->deadline); });
    cv_.wait_until(lock, absl::ToChronoTime(wake));
    if (stop_) break;
    const absl::Time now = absl::Now();
    std::vector<Waiting> expired;
    order_.Extract([&](const Waiting& w) { return w.call->deadline <= now; }, &expired);
    lock.unlock();
    for (Waiting& w : expired) {
      w.core->qos_queued.fetch_sub(1, std::memory_order_relaxed);
      const CallInfo& info = w.call->info;
      Fail(w.call,
           absl::DeadlineExceededError(absl::StrCat(
               "deadline exceeded: ", info.service->full_name, "/", info.method->name, " to ",
               w.core->peer, " waited ", absl::FormatDuration(now - w.queued),
               " in the QoS queue for a window slot (", w.core->window, " calls in flight)")));
    }
    expired.clear();
    Dispatch();
    lock.lock();
  }
}

QosStats ClientQos::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& c = order_.counts();
  return {c.latency, c.bulk, c.aged, c.shared, order_.size(), c.max_queued};
}

}  // namespace plexus::rpc::internal
