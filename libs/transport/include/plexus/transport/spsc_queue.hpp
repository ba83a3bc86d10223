// A bounded lock-free single-producer / single-consumer queue for hot paths.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

namespace plexus::transport {

// Bytes between the producer's and the consumer's hot fields. 128 rather than 64 because x86's
// adjacent-line prefetcher pulls cache lines in pairs, which would still share them.
inline constexpr size_t kQueueCacheLineBytes = 128;

// Exactly one thread may push and exactly one (possibly other) thread may pop at any time; the
// roles may change hands only through a happens-before edge (a mutex, a thread start/join). Each
// side keeps a private copy of the other side's index, so that the shared indices are read only
// when the queue looks full (producer) or empty (consumer): in the steady state, one push and one
// pop touch no cache line written by the other side except the slot itself.
//
// T needs only to be move-constructible (move-only types such as std::unique_ptr work).
template <typename T>
class SpscQueue {
  static_assert(std::is_nothrow_move_constructible_v<T>,
                "SpscQueue moves items in and out of its slots and cannot roll back a throwing "
                "move");

 public:
  static constexpr size_t kMaxCapacity = size_t{1} << 31;

  // Holds `capacity` items, rounded up to a power of two; 0 counts as 1 and values above
  // kMaxCapacity are clamped to it.
  explicit SpscQueue(size_t capacity) : mask_(RoundUp(capacity) - 1), slots_(new Slot[mask_ + 1]) {}
  SpscQueue(const SpscQueue&) = delete;
  SpscQueue& operator=(const SpscQueue&) = delete;
  ~SpscQueue() {
    while (TryPop().has_value()) {
    }
  }

  // Producer: moves `item` in and returns true, or returns false (leaving `item` untouched) when
  // the queue is full.
  bool TryPush(T&& item) noexcept { return TryEmplace(std::move(item)); }
  bool TryPush(const T& item) noexcept(
      std::is_nothrow_copy_constructible_v<T>) requires std::is_copy_constructible_v<T> {
    return TryEmplace(item);
  }
  template <typename... Args>
  bool TryEmplace(Args&&... args) noexcept(std::is_nothrow_constructible_v<T, Args...>) {
    const size_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - cached_head_ > mask_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail - cached_head_ > mask_) return false;
    }
    ::new (static_cast<void*>(slots_[tail & mask_].bytes)) T(std::forward<Args>(args)...);
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer: the oldest item, or nullopt when the queue is empty.
  std::optional<T> TryPop() noexcept {
    const size_t head = head_.load(std::memory_order_relaxed);
    if (head == cached_tail_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head == cached_tail_) return std::nullopt;
    }
    T* item = std::launder(reinterpret_cast<T*>(slots_[head & mask_].bytes));
    std::optional<T> out(std::move(*item));
    item->~T();
    head_.store(head + 1, std::memory_order_release);
    return out;
  }

  // Consumer: the oldest item without removing it, or nullptr when empty. Valid until the next
  // TryPop.
  T* Front() noexcept {
    const size_t head = head_.load(std::memory_order_relaxed);
    if (head == cached_tail_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head == cached_tail_) return nullptr;
    }
    return std::launder(reinterpret_cast<T*>(slots_[head & mask_].bytes));
  }

  // Either side: a snapshot that may be stale by the time it is used.
  size_t SizeApprox() const noexcept {
    const size_t head = head_.load(std::memory_order_acquire);
    const size_t tail = tail_.load(std::memory_order_acquire);
    return tail >= head ? tail - head : 0;
  }
  bool EmptyApprox() const noexcept { return SizeApprox() == 0; }
  bool FullApprox() const noexcept { return SizeApprox() > mask_; }
  size_t capacity() const noexcept { return mask_ + 1; }

 private:
  struct Slot {
    alignas(T) unsigned char bytes[sizeof(T)];
  };

  static size_t RoundUp(size_t capacity) {
    if (capacity >= kMaxCapacity) return kMaxCapacity;
    size_t rounded = 1;
    while (rounded < capacity) rounded <<= 1;
    return rounded;
  }

  // Producer-owned line: the next index to write and the last head it saw.
  alignas(kQueueCacheLineBytes) std::atomic<size_t> tail_{0};
  size_t cached_head_ = 0;
  // Consumer-owned line: the next index to read and the last tail it saw.
  alignas(kQueueCacheLineBytes) std::atomic<size_t> head_{0};
  size_t cached_tail_ = 0;
  // Read-only after construction.
  alignas(kQueueCacheLineBytes) const size_t mask_;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace plexus::transport
