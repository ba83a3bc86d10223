// Registered memory: the unit of one-sided access.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

// Where the registered bytes live.
enum class MemoryKind : uint8_t {
  kHost = 0,
  kCuda = 1,  // CUDA device memory (builds with PLEXUS_WITH_CUDA); tcp/shm stage through host
};

// What a peer needs to write into a region: plain data, safe to send over any channel.
struct RegionHandle {
  static constexpr size_t kEncodedSize = 40;

  uint64_t id = 0;       // unique per registration on the owning device; never reused
  uint64_t address = 0;  // virtual address in the owner's address space (verbs rkey access)
  uint64_t length = 0;   // bytes the peer may write, starting at offset 0
  uint32_t rkey = 0;     // verbs remote key; 0 for other backends
  Backend backend = Backend::kTcp;
  MemoryKind kind = MemoryKind::kHost;

  // Fixed-size little-endian encoding, versioned; Decode rejects anything malformed.
  std::array<uint8_t, kEncodedSize> Encode() const;
  static absl::StatusOr<RegionHandle> Decode(absl::Span<const uint8_t> bytes);
};

// A registration of caller-owned memory with a Device. Deregisters on destruction; the caller
// keeps the memory alive for at least as long as the region and any operation using it.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  // The handle to give peers so they can PostWrite() into this region.
  const RegionHandle& handle() const { return handle_; }
  // Backend-private local key (verbs lkey); 0 elsewhere.
  uint32_t lkey() const { return lkey_; }

 protected:
  MemoryRegion(void* data, size_t size, MemoryKind kind, RegionHandle handle, uint32_t lkey = 0)
      : data_(data), size_(size), kind_(kind), handle_(handle), lkey_(lkey) {}

 private:
  void* data_;
  size_t size_;
  MemoryKind kind_;
  RegionHandle handle_;
  uint32_t lkey_;
};

// True when this build has CUDA support and at least one CUDA device is usable right now;
// otherwise false with the reason in *why_not.
bool CudaAvailable(std::string* why_not = nullptr);

}  // namespace plexus::transport
