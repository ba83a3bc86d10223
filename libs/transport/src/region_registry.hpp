// Registered regions of the software backends (inproc, shm, tcp): incoming one-sided writes name
// a region by id, and the registry resolves and bounds-checks it before any byte is placed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "plexus/transport/memory.hpp"

namespace plexus::transport::internal {

struct WriteTarget {
  uint8_t* data = nullptr;  // start of the destination range
  MemoryKind kind = MemoryKind::kHost;
};

class RegionRegistry : public std::enable_shared_from_this<RegionRegistry> {
 public:
  explicit RegionRegistry(Backend backend) : backend_(backend) {}

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes, MemoryKind kind);
  // The destination of a write of `length` bytes at `offset` of region `id`; an error naming
  // the problem when the region is unknown (never registered, or deregistered) or too small.
  absl::StatusOr<WriteTarget> Resolve(uint64_t id, uint64_t offset, uint64_t length) const;

 private:
  friend class RegisteredRegion;
  void Remove(uint64_t id);

  struct Entry {
    uint8_t* data;
    size_t size;
    MemoryKind kind;
  };
  const Backend backend_;
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> regions_;
};

// Source bytes of a local region range, validated (kind, bounds).
absl::Status CheckLocalRange(const MemoryRegion& region, size_t offset, size_t length);

}  // namespace plexus::transport::internal
