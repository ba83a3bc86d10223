// Runtime threads: poll attached engines round-robin, spin briefly when idle, then sleep on a
// doorbell that channels and callers ring. Control requests (attach, detach, replace) are queued
// to the owning thread and executed between two polling rounds, so an engine is never touched by
// two threads and a replace costs its engine one step of that thread.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/runtime.hpp"

namespace plexus::transport {
namespace {

constexpr int kMaxThreads = 64;
// Idle rounds between two clock reads while spinning: keeps the spin loop off the vDSO.
constexpr int kIdleRoundsPerClockRead = 32;

enum class SlotState { kAttaching, kRunning, kFailed, kDetached };

struct Slot {
  Slot(uint64_t id, int worker, std::unique_ptr<Engine> engine)
      : id(id), worker(worker), engine(std::move(engine)), name(this->engine->name()) {}

  const uint64_t id;
  const int worker;
  // Touched only by the worker thread between Attach and the Detach that hands it back.
  std::unique_ptr<Engine> engine;
  std::string name;

  mutable std::mutex mu;
  SlotState state = SlotState::kAttaching;  // guarded by mu
  absl::Status status;                      // guarded by mu

  void Set(SlotState new_state, absl::Status new_status) {
    std::lock_guard<std::mutex> lock(mu);
    state = new_state;
    status = std::move(new_status);
  }
  SlotState GetState() const {
    std::lock_guard<std::mutex> lock(mu);
    return state;
  }
};

enum class RequestKind { kAttach, kDetach, kReplace };

struct Request {
  Request(RequestKind kind, std::shared_ptr<Slot> slot) : kind(kind), slot(std::move(slot)) {}
  const RequestKind kind;
  const std::shared_ptr<Slot> slot;
  RestoreFn restore;  // kReplace
  // Results, valid once `done` is notified.
  absl::Status status;
  std::unique_ptr<Engine> engine;  // kDetach
  bool removed = false;            // kDetach: the handle is gone, even if status is an error
  absl::Duration pause;            // kReplace

  void Finish() {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
  }

 private:
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

struct Worker {
  explicit Worker(int index) : index(index), bell(Doorbell::Acquire()) {}

  const int index;
  Doorbell::Ptr bell;
  std::thread thread;
  std::atomic<int> engines{0};  // attached, including failed ones; for placement

  std::mutex mu;
  std::deque<std::shared_ptr<Request>> requests;  // guarded by mu
  bool stopping = false;                          // guarded by mu
  std::atomic<bool> has_requests{false};

  std::vector<std::shared_ptr<Slot>> running;  // worker thread only
};

void BindEndpoints(Engine& engine, Doorbell* bell) {
  for (ChannelEndpoint* endpoint : engine.Endpoints()) {
    if (endpoint != nullptr) endpoint->BindDoorbell(bell);
  }
}

absl::Status WithContext(const absl::Status& status, std::string_view what, const Slot& slot) {
  return absl::Status(status.code(),
                      absl::StrCat(std::string(what), " of engine '", slot.name, "' (handle ",
                                   slot.id, ") failed: ", std::string(status.message())));
}

// Set on runtime threads: Detach/Replace from there would wait for the caller itself.
thread_local const void* current_runtime = nullptr;

}  // namespace

struct Runtime::Impl {
  explicit Impl(RuntimeOptions opts) : options(std::move(opts)) {}

  RuntimeOptions options;
  std::vector<std::unique_ptr<Worker>> workers;

  mutable std::mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Slot>> slots;  // guarded by mu
  uint64_t next_id = 1;                                        // guarded by mu

  void Start() {
    for (auto& worker : workers) {
      Worker* w = worker.get();
      w->thread = std::thread([this, w] { Run(*w); });
      const std::string name = absl::StrCat(options.name.substr(0, 10), "-", w->index);
      pthread_setname_np(w->thread.native_handle(), name.substr(0, 15).c_str());
    }
  }

  void Stop() {
    for (auto& w : workers) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->stopping = true;
        w->has_requests.store(true, std::memory_order_release);
      }
      w->bell->Ring();
    }
    for (auto& w : workers) {
      if (w->thread.joinable()) w->thread.join();
    }
    // Destroy the engines left attached, unhooking their channels from our doorbells first.
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [id, slot] : slots) {
      if (slot->engine != nullptr) BindEndpoints(*slot->engine, nullptr);
      slot->engine.reset();
    }
    slots.clear();
  }

  absl::StatusOr<std::shared_ptr<Slot>> Find(EngineHandle handle) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = slots.find(handle.id);
    if (it == slots.end()) {
      return absl::NotFoundError(absl::StrCat("engine handle ", handle.id,
                                              " is not attached to this runtime (detached "
                                              "already, or from another runtime?)"));
    }
    return it->second;
  }

  absl::Status Submit(const std::shared_ptr<Request>& request) {
    Worker& w = *workers[request->slot->worker];
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (w.stopping) {
        return absl::CancelledError("the runtime is shutting down; no engine can be changed");
      }
      w.requests.push_back(request);
      w.has_requests.store(true, std::memory_order_release);
    }
    w.bell->Ring();
    return absl::OkStatus();
  }

  // Waiting for our own thread would never end.
  absl::Status CheckNotOnRuntimeThread(std::string_view method) const {
    if (current_runtime != this) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("Runtime::", std::string(method),
                     " was called from one of the runtime's own threads (in an engine's Poll or "
                     "on_engine_error); call it from another thread"));
  }

  // Submits a request the caller waits for.
  absl::Status SubmitAndWait(const std::shared_ptr<Request>& request) {
    PLEXUS_RETURN_IF_ERROR(Submit(request));
    request->Wait();
    return request->status;
  }

  void Run(Worker& w) {
    using Clock = std::chrono::steady_clock;
    current_runtime = this;
    // Spin, then sleep on the doorbell: no yielding phase (a producer rings the bell).
    const base::WaitPolicy wait(options.spin, options.spin);
    int idle_rounds = 0;
    bool idle_timing = false;
    Clock::time_point idle_since;
    for (;;) {
      if (w.has_requests.load(std::memory_order_acquire) && !ProcessRequests(w)) return;
      if (PollAll(w)) {
        idle_rounds = 0;
        idle_timing = false;
        continue;
      }
      if (++idle_rounds < kIdleRoundsPerClockRead) {
        base::WaitPolicy::CpuRelax();
        continue;
      }
      idle_rounds = 0;
      const Clock::time_point now = Clock::now();
      if (!idle_timing) {
        idle_timing = true;
        idle_since = now;
        continue;
      }
      if (wait.At(absl::FromChrono(now - idle_since)) == base::WaitPolicy::Phase::kSpin) continue;
      // Announce the sleep, then look once more: a producer that published before seeing the
      // announcement is caught by this round, one that publishes after it rings.
      w.bell->PrepareSleep();
      if (w.has_requests.load(std::memory_order_acquire) || PollAll(w)) {
        w.bell->CancelSleep();
      } else {
        w.bell->Sleep(absl::InfiniteDuration());
      }
      idle_timing = false;
    }
  }

  bool PollAll(Worker& w) {
    bool progress = false;
    for (size_t i = 0; i < w.running.size();) {
      Slot& slot = *w.running[i];
      absl::StatusOr<PollResult> result = slot.engine->Poll();
      if (result.ok()) {
        progress |= *result == PollResult::kProgress;
        ++i;
        continue;
      }
      // Keep the engine (Detach hands it back for inspection) but stop polling it.
      std::shared_ptr<Slot> failed = std::move(w.running[i]);
      w.running.erase(w.running.begin() + static_cast<ptrdiff_t>(i));
      absl::Status error = WithContext(result.status(), "Poll", *failed);
      failed->Set(SlotState::kFailed, error);
      if (options.on_engine_error) options.on_engine_error(EngineHandle{failed->id}, error);
      progress = true;
    }
    return progress;
  }

  // Returns false when the thread must exit.
  bool ProcessRequests(Worker& w) {
    std::deque<std::shared_ptr<Request>> batch;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(w.mu);
      batch.swap(w.requests);
      w.has_requests.store(false, std::memory_order_relaxed);
      stopping = w.stopping;
    }
    for (auto& request : batch) {
      switch (request->kind) {
        case RequestKind::kAttach:
          HandleAttach(w, *request);
          break;
        case RequestKind::kDetach:
          HandleDetach(w, *request);
          break;
        case RequestKind::kReplace:
          HandleReplace(w, *request);
          break;
      }
      request->Finish();
    }
    return !stopping;
  }

  void HandleAttach(Worker& w, Request& request) {
    const std::shared_ptr<Slot>& slot = request.slot;
    if (slot->GetState() != SlotState::kAttaching) return;  // detached before it ever ran
    BindEndpoints(*slot->engine, w.bell.get());
    slot->Set(SlotState::kRunning, absl::OkStatus());
    w.running.push_back(slot);
  }

  void HandleDetach(Worker& w, Request& request) {
    const std::shared_ptr<Slot>& slot = request.slot;
    if (slot->GetState() == SlotState::kDetached) {
      request.status = absl::NotFoundError(
          absl::StrCat("engine handle ", slot->id, " was detached by a concurrent call"));
      return;
    }
    std::erase(w.running, slot);
    if (slot->engine != nullptr) {
      BindEndpoints(*slot->engine, nullptr);
      request.engine = std::move(slot->engine);
    } else {
      // A failed restore left no engine: report why while releasing the handle.
      std::lock_guard<std::mutex> lock(slot->mu);
      request.status = slot->status;
    }
    request.removed = true;
    slot->Set(SlotState::kDetached, absl::OkStatus());
    w.engines.fetch_sub(1, std::memory_order_relaxed);
  }

  void HandleReplace(Worker& w, Request& request) {
    const auto start = std::chrono::steady_clock::now();
    const std::shared_ptr<Slot>& slot = request.slot;
    const SlotState state = slot->GetState();
    if (state == SlotState::kDetached || slot->engine == nullptr) {
      request.status = absl::NotFoundError(
          absl::StrCat("engine handle ", slot->id, " was detached by a concurrent call"));
      return;
    }
    absl::StatusOr<EngineState> decomposed = slot->engine->Decompose();
    if (!decomposed.ok()) {
      request.status = WithContext(decomposed.status(), "Decompose", *slot);
      return;  // the contract leaves the engine unchanged: it keeps running
    }
    slot->engine.reset();
    absl::StatusOr<std::unique_ptr<Engine>> restored = request.restore(*std::move(decomposed));
    if (restored.ok() && *restored == nullptr) {
      restored = absl::InternalError("the restore function returned a null engine");
    }
    if (!restored.ok()) {
      request.status = WithContext(restored.status(), "Restore", *slot);
      std::erase(w.running, slot);
      slot->Set(SlotState::kFailed, request.status);
      return;
    }
    slot->engine = *std::move(restored);
    slot->name = std::string(slot->engine->name());
    BindEndpoints(*slot->engine, w.bell.get());
    if (state != SlotState::kRunning) {
      // A failed (or not yet started) engine comes back to life in its new form.
      if (std::find(w.running.begin(), w.running.end(), slot) == w.running.end()) {
        w.running.push_back(slot);
      }
      slot->Set(SlotState::kRunning, absl::OkStatus());
    }
    request.pause = absl::FromChrono(std::chrono::steady_clock::now() - start);
  }
};

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(RuntimeOptions options) {
  if (options.threads < 1 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("RuntimeOptions::threads must be in [1, ",
                                                   kMaxThreads, "] (got ", options.threads,
                                                   "); a few threads serve many engines"));
  }
  if (options.spin < absl::ZeroDuration() || options.spin > absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RuntimeOptions::spin must be in [0, 100ms] (got ",
                     absl::FormatDuration(options.spin), "); longer spinning burns shared cores"));
  }
  if (options.name.empty()) options.name = "plexus-rt";
  auto impl = std::make_unique<Impl>(std::move(options));
  for (int i = 0; i < impl->options.threads; ++i) {
    impl->workers.push_back(std::make_unique<Worker>(i));
  }
  impl->Start();
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() { impl_->Stop(); }

int Runtime::threads() const { return static_cast<int>(impl_->workers.size()); }

absl::StatusOr<EngineHandle> Runtime::Attach(std::unique_ptr<Engine> engine, int thread) {
  if (engine == nullptr) return absl::InvalidArgumentError("Runtime::Attach got a null engine");
  const int count = threads();
  if (thread != kAnyThread && (thread < 0 || thread >= count)) {
    return absl::InvalidArgumentError(absl::StrCat("Runtime::Attach thread ", thread,
                                                   " is out of range: the runtime has ", count,
                                                   " threads (or pass kAnyThread)"));
  }
  if (thread == kAnyThread) {
    thread = 0;
    for (int i = 1; i < count; ++i) {
      if (impl_->workers[i]->engines.load(std::memory_order_relaxed) <
          impl_->workers[thread]->engines.load(std::memory_order_relaxed)) {
        thread = i;
      }
    }
  }
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    slot = std::make_shared<Slot>(impl_->next_id++, thread, std::move(engine));
    impl_->slots.emplace(slot->id, slot);
  }
  impl_->workers[thread]->engines.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = impl_->Submit(std::make_shared<Request>(RequestKind::kAttach, slot));
      !s.ok()) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->slots.erase(slot->id);
    return s;
  }
  return EngineHandle{slot->id};
}

absl::StatusOr<std::unique_ptr<Engine>> Runtime::Detach(EngineHandle handle) {
  PLEXUS_RETURN_IF_ERROR(impl_->CheckNotOnRuntimeThread("Detach"));
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot, impl_->Find(handle));
  auto request = std::make_shared<Request>(RequestKind::kDetach, slot);
  absl::Status status = impl_->SubmitAndWait(request);
  if (request->removed) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->slots.erase(handle.id);
  }
  PLEXUS_RETURN_IF_ERROR(status);
  return std::move(request->engine);
}

absl::StatusOr<absl::Duration> Runtime::Replace(EngineHandle handle, RestoreFn restore) {
  if (!restore) return absl::InvalidArgumentError("Runtime::Replace got an empty restore function");
  PLEXUS_RETURN_IF_ERROR(impl_->CheckNotOnRuntimeThread("Replace"));
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot, impl_->Find(handle));
  auto request = std::make_shared<Request>(RequestKind::kReplace, slot);
  request->restore = std::move(restore);
  PLEXUS_RETURN_IF_ERROR(impl_->SubmitAndWait(request));
  return request->pause;
}

absl::Status Runtime::EngineStatus(EngineHandle handle) const {
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot, impl_->Find(handle));
  std::lock_guard<std::mutex> lock(slot->mu);
  return slot->status;
}

absl::StatusOr<Doorbell*> Runtime::GetDoorbell(EngineHandle handle) const {
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot, impl_->Find(handle));
  return impl_->workers[slot->worker]->bell.get();
}

}  // namespace plexus::transport
