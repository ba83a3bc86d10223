// Device buffers moved device to device between the ranks of a one-host communicator (every peer
// over shm or inproc): each rank publishes its call's buffers (the pointers, and their CUDA IPC
// handles for the other processes), maps its peers', and the collective runs as kernels and
// device copies that read peers' memory directly, separated by barriers over the mailboxes
// (device_peers.cpp; the calls are CommunicatorImpl's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "plexus/base/cuda.hpp"

namespace plexus::collectives::internal {

// One rank's buffers of a call, as its peers find them: its process (ranks of one process use
// the pointers themselves), the addresses, and each one's IPC handle and offset in it when it
// could be exported (not every allocator's memory can: cudaMallocAsync pools, virtual memory).
struct DeviceBufferRecord {
  static constexpr uint32_t kMagic = 0x50455244;  // "DREP"
  uint32_t magic = kMagic;
  uint8_t send_exported = 0;
  uint8_t recv_exported = 0;
  uint8_t reserved[2] = {};
  uint64_t process = 0;  // a token of the process (ranks of one process share it)
  uint64_t send = 0;     // 0: no send buffer (a Broadcast's non-root)
  uint64_t recv = 0;
  uint64_t send_offset = 0;
  uint64_t recv_offset = 0;
  base::cuda::IpcHandle send_handle{};
  base::cuda::IpcHandle recv_handle{};
  uint8_t gpu_known = 0;         // 0: this rank could not name its GPU
  base::cuda::DeviceUuid gpu{};  // the GPU of recv's context
};

// This process's view of `send` (may be null) and `recv`; exports what it can.
DeviceBufferRecord DescribeDeviceBuffers(const void* send, const void* recv);

// A peer's buffers as this rank addresses them.
struct PeerBuffers {
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
};

// Tests: false makes every rank work on its own slice even when all are on one GPU (the path of
// ranks on several GPUs, exercised on a machine with one); returns the previous value.
bool SetOneGpuLeaderForTesting(bool allowed);

// One communicator's mappings of its peers' buffers: a peer in this process is used through its
// pointers (with peer access enabled when they are on another GPU); one in another process
// through a mapping of its allocation, opened once (opening costs milliseconds) and kept for
// later calls, up to 64 allocations (the least recently used is closed past that), all closed
// when the communicator goes. A kept mapping holds the peer's memory: an allocation the peer
// freed is released once it leaves this cache.
class DevicePeerMaps {
 public:
  DevicePeerMaps() = default;
  DevicePeerMaps(const DevicePeerMaps&) = delete;
  DevicePeerMaps& operator=(const DevicePeerMaps&) = delete;
  ~DevicePeerMaps();

  // Why not, when `record`'s buffers cannot be reached from the current context.
  absl::StatusOr<PeerBuffers> Map(const DeviceBufferRecord& record);

 private:
  absl::StatusOr<uint8_t*> Open(const base::cuda::IpcHandle& handle);

  struct Mapping {
    uint8_t* base = nullptr;
    uint64_t last_use = 0;
  };
  std::map<std::string, Mapping> mapped_;  // by context and handle bytes
  uint64_t uses_ = 0;
};

}  // namespace plexus::collectives::internal
