// A table of descriptors addressed by 32-bit handles, for work-request ids. A handle carries the
// slot index and a generation counter, so the lookup is O(1) and an id that outlived its
// descriptor (a completion flushed after the slot was reused) is recognised as stale instead of
// being applied to whatever now occupies the slot. Pure C++: no libibverbs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace plexus::transport::verbs {

template <typename T>
class SlotTable {
 public:
  static constexpr int kIndexBits = 20;
  static constexpr uint32_t kIndexMask = (uint32_t{1} << kIndexBits) - 1;
  static constexpr uint32_t kGenerationMask = (uint32_t{1} << (32 - kIndexBits)) - 1;
  static constexpr uint32_t kMaxCapacity = kIndexMask + 1;

  explicit SlotTable(uint32_t capacity = kMaxCapacity)
      : capacity_(capacity < kMaxCapacity ? capacity : kMaxCapacity) {}

  // Stores `value` and returns its handle; nullopt when the table holds `capacity` entries.
  // Handles are never 0, so a zero-initialised id is never mistaken for a live one.
  std::optional<uint32_t> Insert(T value) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else if (slots_.size() < capacity_) {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      return std::nullopt;
    }
    Slot& slot = slots_[index];
    slot.value.emplace(std::move(value));
    ++size_;
    return MakeHandle(index, slot.generation);
  }

  // The live entry of `handle`, or nullptr when it is unknown or stale.
  T* Find(uint32_t handle) {
    Slot* slot = Lookup(handle);
    return slot ? &*slot->value : nullptr;
  }

  // Removes and returns the entry; nullopt when the handle is unknown or stale.
  std::optional<T> Take(uint32_t handle) {
    Slot* slot = Lookup(handle);
    if (slot == nullptr) return std::nullopt;
    std::optional<T> out = std::move(slot->value);
    slot->value.reset();
    // Skip generation 0 so that handle 0 stays invalid after wrap-around.
    slot->generation = (slot->generation + 1) & kGenerationMask;
    if (slot->generation == 0) slot->generation = 1;
    free_.push_back(handle & kIndexMask);
    --size_;
    return out;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint32_t capacity() const { return capacity_; }

  // Calls fn(handle, T&) for every live entry, in slot order.
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].value) fn(MakeHandle(i, slots_[i].generation), *slots_[i].value);
    }
  }

 private:
  struct Slot {
    uint32_t generation = 1;
    std::optional<T> value;
  };

  static uint32_t MakeHandle(uint32_t index, uint32_t generation) {
    return (generation << kIndexBits) | index;
  }

  Slot* Lookup(uint32_t handle) {
    const uint32_t index = handle & kIndexMask;
    if (index >= slots_.size()) return nullptr;
    Slot& slot = slots_[index];
    if (!slot.value || slot.generation != (handle >> kIndexBits)) return nullptr;
    return &slot;
  }

  uint32_t capacity_;
  size_t size_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

}  // namespace plexus::transport::verbs
