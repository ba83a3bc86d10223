// The progress runtime: poll-based engines, connected by SPSC channels, run by a few threads that
// spin briefly when idle and then sleep until a channel or a caller rings their doorbell. An
// engine can be replaced while traffic flows (its state decomposed and restored into a new
// engine, possibly of another type or version) without losing or duplicating an item. The rpc
// and collectives libraries build their policy engines on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/transport/spsc_queue.hpp"

namespace plexus::transport {

namespace internal {
// True once membarrier(PRIVATE_EXPEDITED) is registered: a thread going to sleep then pays a
// process-wide barrier, so that a waker needs no fence at all (folly's asymmetric fences).
inline std::atomic<bool> asymmetric_fences{false};
// Orders a waker's earlier stores (an item published) before its read of the sleeper's state.
inline void WakerFence() noexcept {
  if (asymmetric_fences.load(std::memory_order_relaxed)) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}
}  // namespace internal

// Wakes one sleeping thread (its owner). Ringing costs two loads when the owner is awake or
// spinning (plus a full fence on kernels without membarrier); only a sleeping owner costs a futex
// wake-up. Doorbells come from a process-wide pool and are never freed, so a stale pointer may
// still be rung: it only causes a spurious wake-up. The owner is one thread at a time.
class Doorbell {
 public:
  struct Releaser {
    void operator()(Doorbell* bell) const noexcept;
  };
  using Ptr = std::unique_ptr<Doorbell, Releaser>;
  static Ptr Acquire();

  // Any thread, after publishing what the owner should see.
  void Ring() noexcept {
    internal::WakerFence();
    RingAfterFence();
  }
  void RingAfterFence() noexcept {
    if (state_.load(std::memory_order_relaxed) == kSleeping) RingSlow();
  }

  // Owner: returns true as soon as ready() holds, false after `timeout`. Polls ready() for `spin`,
  // then sleeps until rung; whoever makes ready() true must Ring() afterwards.
  bool Wait(absl::FunctionRef<bool()> ready, absl::Duration timeout,
            absl::Duration spin = absl::Microseconds(20));

  // Owner, the two-phase form of Wait: PrepareSleep, re-check every condition, then CancelSleep
  // or Sleep. A Ring after PrepareSleep makes Sleep return at once.
  void PrepareSleep() noexcept;
  void CancelSleep() noexcept { state_.store(kAwake, std::memory_order_relaxed); }
  void Sleep(absl::Duration timeout) noexcept;

 private:
  friend class DoorbellPool;
  Doorbell() = default;
  void RingSlow() noexcept;

  static constexpr uint32_t kAwake = 0;
  static constexpr uint32_t kSleeping = 1;
  alignas(kQueueCacheLineBytes) std::atomic<uint32_t> state_{kAwake};
  Doorbell* next_free_ = nullptr;
};

namespace internal {
template <typename T>
struct ChannelCore {
  explicit ChannelCore(size_t capacity) : queue(capacity) {}
  SpscQueue<T> queue;
  std::atomic<Doorbell*> receiver_bell{nullptr};  // rung after each push
  std::atomic<Doorbell*> sender_bell{nullptr};    // rung after each pop (space freed)
};
inline void Notify(const std::atomic<Doorbell*>& bell) noexcept {
  internal::WakerFence();
  if (Doorbell* d = bell.load(std::memory_order_acquire)) d->RingAfterFence();
}
}  // namespace internal

template <typename T>
class ChannelSender;
template <typename T>
class ChannelReceiver;
template <typename T>
absl::StatusOr<std::pair<ChannelSender<T>, ChannelReceiver<T>>> MakeChannel(size_t capacity);

// One end of a channel as the runtime sees it: the doorbell its other side rings when it makes
// this end ready (a push for a receiver, a pop that frees space for a sender).
class ChannelEndpoint {
 public:
  void BindDoorbell(Doorbell* bell) noexcept {
    if (bell_ != nullptr) bell_->store(bell, std::memory_order_release);
  }

 protected:
  explicit ChannelEndpoint(std::atomic<Doorbell*>* bell = nullptr) : bell_(bell) {}
  ChannelEndpoint(ChannelEndpoint&& other) noexcept : bell_(std::exchange(other.bell_, nullptr)) {}
  ChannelEndpoint& operator=(ChannelEndpoint&& other) noexcept {
    bell_ = std::exchange(other.bell_, nullptr);
    return *this;
  }
  ~ChannelEndpoint() = default;

 private:
  std::atomic<Doorbell*>* bell_;
};

// The producing end of a channel: move-only, used by one thread at a time. An empty (default or
// moved-from) sender must not be used.
template <typename T>
class ChannelSender : public ChannelEndpoint {
 public:
  ChannelSender() = default;
  // Moves `item` in and wakes the consumer's thread if it sleeps; false (item untouched) when
  // the channel is full.
  bool TryPush(T&& item) noexcept {
    if (!core_->queue.TryPush(std::move(item))) return false;
    internal::Notify(core_->receiver_bell);
    return true;
  }
  bool FullApprox() const noexcept { return core_->queue.FullApprox(); }
  size_t capacity() const noexcept { return core_->queue.capacity(); }
  bool valid() const noexcept { return core_ != nullptr; }

 private:
  friend absl::StatusOr<std::pair<ChannelSender<T>, ChannelReceiver<T>>> MakeChannel<T>(size_t);
  explicit ChannelSender(std::shared_ptr<internal::ChannelCore<T>> core)
      : ChannelEndpoint(&core->sender_bell), core_(std::move(core)) {}
  std::shared_ptr<internal::ChannelCore<T>> core_;
};

// The consuming end of a channel; same rules as ChannelSender.
template <typename T>
class ChannelReceiver : public ChannelEndpoint {
 public:
  ChannelReceiver() = default;
  // The oldest item (waking the producer's thread if it sleeps), or nullopt when empty.
  std::optional<T> TryPop() noexcept {
    std::optional<T> item = core_->queue.TryPop();
    if (item.has_value()) internal::Notify(core_->sender_bell);
    return item;
  }
  bool EmptyApprox() const noexcept { return core_->queue.EmptyApprox(); }
  size_t SizeApprox() const noexcept { return core_->queue.SizeApprox(); }
  bool valid() const noexcept { return core_ != nullptr; }

 private:
  friend absl::StatusOr<std::pair<ChannelSender<T>, ChannelReceiver<T>>> MakeChannel<T>(size_t);
  explicit ChannelReceiver(std::shared_ptr<internal::ChannelCore<T>> core)
      : ChannelEndpoint(&core->receiver_bell), core_(std::move(core)) {}
  std::shared_ptr<internal::ChannelCore<T>> core_;
};

// A channel of `capacity` items (rounded up to a power of two); InvalidArgument for 0 or more
// than SpscQueue<T>::kMaxCapacity.
template <typename T>
absl::StatusOr<std::pair<ChannelSender<T>, ChannelReceiver<T>>> MakeChannel(size_t capacity) {
  if (capacity == 0 || capacity > SpscQueue<T>::kMaxCapacity) {
    return absl::InvalidArgumentError("channel capacity must be between 1 and 2^31 items (got " +
                                      std::to_string(capacity) + ")");
  }
  auto core = std::make_shared<internal::ChannelCore<T>>(capacity);
  return std::pair<ChannelSender<T>, ChannelReceiver<T>>(ChannelSender<T>(core),
                                                         ChannelReceiver<T>(core));
}

// The whole state of a decomposed engine: typed fields by name (channel endpoints, buffered and
// in-flight items, counters), tagged with the engine kind and version that wrote them so that a
// restore function can accept or convert it. Move-only.
class EngineState {
 public:
  EngineState(std::string kind, uint32_t version) : kind_(std::move(kind)), version_(version) {}
  EngineState(EngineState&&) noexcept = default;
  EngineState& operator=(EngineState&&) noexcept = default;

  const std::string& kind() const { return kind_; }
  uint32_t version() const { return version_; }

  // Stores `value` under `key`, replacing any earlier field of that name.
  template <typename T>
  void Put(std::string key, T value) {
    fields_.insert_or_assign(
        std::move(key), Field{&typeid(T), ValuePtr(new T(std::move(value)),
                                                   [](void* p) { delete static_cast<T*>(p); })});
  }
  // Moves the field out; NotFound when absent, InvalidArgument when it holds another type.
  template <typename T>
  absl::StatusOr<T> Take(std::string_view key) {
    auto it = fields_.find(key);
    if (it == fields_.end() || *it->second.type != typeid(T)) return FieldError(key, typeid(T));
    T value(std::move(*static_cast<T*>(it->second.value.get())));
    fields_.erase(it);
    return value;
  }
  bool Has(std::string_view key) const { return fields_.find(key) != fields_.end(); }
  std::vector<std::string> Keys() const;

 private:
  using ValuePtr = std::unique_ptr<void, void (*)(void*)>;
  struct Field {
    const std::type_info* type;
    ValuePtr value;
  };
  absl::Status FieldError(std::string_view key, const std::type_info& wanted) const;

  std::string kind_;
  uint32_t version_;
  std::map<std::string, Field, std::less<>> fields_;
};

enum class PollResult : uint8_t {
  kIdle = 0,      // nothing to do right now
  kProgress = 1,  // moved, produced or consumed something
};

// A unit of protocol work driven by a runtime thread. Only that thread calls Poll; Decompose is
// called on a detached engine, after which the engine is only destroyed.
class Engine {
 public:
  virtual ~Engine() = default;
  // Short kind name for messages, e.g. "batcher".
  virtual std::string_view name() const = 0;
  // Does a bounded amount of work (never blocks). A non-OK status detaches the engine; the
  // status is then reported by Runtime::EngineStatus.
  virtual absl::StatusOr<PollResult> Poll() = 0;
  // Moves the whole state out: channel endpoints, buffered and in-flight items. On error the
  // engine must be left unchanged (it stays attached).
  virtual absl::StatusOr<EngineState> Decompose() = 0;
  // The channel endpoints whose other side can give this engine work; the runtime binds them to
  // its thread's doorbell. Engines waiting on anything else get woken through
  // Runtime::GetDoorbell.
  virtual std::vector<ChannelEndpoint*> Endpoints() = 0;
};

// Builds an engine from a decomposed state (any kind/version it understands). It should check
// kind() and version() before taking fields: a state it fails on is lost with its items.
using RestoreFn = absl::AnyInvocable<absl::StatusOr<std::unique_ptr<Engine>>(EngineState)>;

struct EngineHandle {
  uint64_t id = 0;
  friend bool operator==(EngineHandle a, EngineHandle b) { return a.id == b.id; }
};

struct RuntimeOptions {
  int threads = 1;                               // 1..64 runtime threads
  absl::Duration spin = absl::Microseconds(50);  // idle polling before a thread sleeps
  std::string name = "plexus-rt";                // thread name prefix (at most 10 characters)
  // Called on the runtime thread when an engine's Poll fails (after it is detached).
  std::function<void(EngineHandle, const absl::Status&)> on_engine_error = nullptr;
};

// Runs engines on its threads. Every method is thread-safe, but Detach, Replace and the
// destructor must not be called from a runtime thread (Poll or on_engine_error).
class Runtime {
 public:
  static constexpr int kAnyThread = -1;

  // InvalidArgument for bad options (threads outside 1..64, spin outside 0..100 ms).
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(RuntimeOptions options = {});
  // Stops the threads and destroys the engines still attached.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Starts polling `engine` on `thread` (kAnyThread: the one with the fewest engines).
  absl::StatusOr<EngineHandle> Attach(std::unique_ptr<Engine> engine, int thread = kAnyThread);
  // Waits until the engine is not being polled and hands it back (a failed one too) and
  // releases the handle. When a failed restore left no engine, returns that restore's error.
  absl::StatusOr<std::unique_ptr<Engine>> Detach(EngineHandle handle);
  // Swaps the engine for restore(engine.Decompose()) on the same thread, in one step of that
  // thread: producers keep pushing into its channels meanwhile and nothing is lost or duplicated.
  // Returns the pause, the time between the old engine's last and the new engine's first Poll
  // opportunity. `restore` runs on that runtime thread and must not block. A failed engine may
  // be replaced too (recovery). When restore fails, the handle fails with its error.
  absl::StatusOr<absl::Duration> Replace(EngineHandle handle, RestoreFn restore);
  // OK while the engine runs; the error that detached it otherwise; NotFound for an unknown handle.
  absl::Status EngineStatus(EngineHandle handle) const;
  // The doorbell of the engine's thread, for wake-ups from outside its channels (a completion
  // queue, a timer). Stays safe to ring forever.
  absl::StatusOr<Doorbell*> GetDoorbell(EngineHandle handle) const;
  int threads() const;

 private:
  struct Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::transport
