// Host staging of device buffers: a collective on CUDA memory copies its inputs into pinned host
// memory, runs on the host copies and copies its outputs back. Pinned memory is slow to get
// (cudaMallocHost maps and locks pages: about a millisecond, and cudaFreeHost synchronises the
// device), so a communicator keeps the buffers of earlier calls in a PinnedPool, bounded by
// CommunicatorOptions::staging_cache_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::collectives::internal {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (null pointers share none).
inline bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

// Device-buffer allreduces of at least this many bytes run pipelined: at most kStagingSegments
// equal segments of about max(kStagingSegmentBytes, bytes / kStagingSegments) each, the copies of
// one overlapping the ring of another.
inline constexpr size_t kPipelinedStagingBytes = size_t{8} << 20;
inline constexpr size_t kStagingSegments = 8;
inline constexpr size_t kStagingSegmentBytes = size_t{2} << 20;

// Pinned host buffers for reuse. Thread-safe. Sizes are rounded up to a power of two (at least
// 64 KiB) so that calls of nearby sizes share buffers; Acquire hands out the smallest cached
// buffer that fits.
class PinnedPool {
 public:
  using AllocFn = std::function<void*(size_t)>;
  using FreeFn = std::function<void(void*)>;
  // The CUDA runtime's pinned allocator (cuda_staging.hpp) unless given (tests).
  PinnedPool();
  PinnedPool(AllocFn alloc, FreeFn free);
  ~PinnedPool();  // frees every cached buffer
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  struct Buffer {
    void* data = nullptr;
    size_t capacity = 0;
  };
  // A buffer of at least `bytes`; ResourceExhausted naming the size when none can be allocated.
  absl::StatusOr<Buffer> Acquire(size_t bytes);
  // Returns `buffer` to the cache, evicting (freeing) the smallest cached buffers while the cache
  // would hold more than `max_cached_bytes`; a buffer larger than that is freed at once.
  void Release(Buffer buffer, size_t max_cached_bytes);

  size_t cached_bytes() const;
  size_t allocations() const;  // buffers allocated so far (cache misses)

 private:
  AllocFn alloc_;
  FreeFn free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // capacity -> buffer
  size_t cached_bytes_ = 0;
  size_t allocations_ = 0;
};

// The staging of one call: host stand-ins for its device buffers, returned to the pool at the end.
class Staging {
 public:
  Staging(PinnedPool* pool, size_t max_cached_bytes) : pool_(pool), max_cached_(max_cached_bytes) {}
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // A host pointer holding `bytes` of `user` (copied in when `copy_in`); `user` itself when it
  // is host memory.
  absl::StatusOr<uint8_t*> In(const void* user, size_t bytes, bool copy_in);
  // As In, and registers `user` as an output: CopyOut() copies the host bytes back.
  absl::StatusOr<uint8_t*> Output(void* user, size_t bytes, bool copy_in);
  absl::Status CopyOut();
  bool any() const { return !staged_.empty(); }

 private:
  struct Entry {
    void* user;
    PinnedPool::Buffer host;
    size_t bytes;
  };
  PinnedPool* pool_;
  size_t max_cached_;
  std::vector<Entry> staged_;
  std::vector<Entry> outputs_;
};

}  // namespace plexus::collectives::internal
