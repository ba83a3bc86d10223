// Device buffers moved device to device between the ranks of a one-host communicator (every peer
// over shm or inproc): each rank publishes its call's buffers (the pointers, and their CUDA IPC
// handles for the other processes), maps its peers' (kept in a process-wide cache), and the
// collective runs as kernels and device copies that read peers' memory directly, separated by
// barriers over the mailboxes (device_peers.cpp; the calls are CommunicatorImpl's).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "plexus/base/cuda.hpp"

namespace plexus::collectives::internal {

// One rank's buffers of a call, as its peers find them: its process (ranks of one process use
// the pointers themselves), the addresses, and each one's IPC handle and offset in it.
struct DeviceBufferRecord {
  static constexpr uint32_t kMagic = 0x50455244;  // "DREP"
  uint32_t magic = kMagic;
  uint32_t reserved = 0;
  uint64_t process = 0;  // a token of the process (ranks of one process share it)
  uint64_t send = 0;     // 0: no send buffer (a Broadcast's non-root)
  uint64_t recv = 0;
  uint64_t send_offset = 0;
  uint64_t recv_offset = 0;
  base::cuda::IpcHandle send_handle{};
  base::cuda::IpcHandle recv_handle{};
};

// Fills `record` with this process's view of `send` (may be null) and `recv`.
absl::Status DescribeDeviceBuffers(const void* send, const void* recv, DeviceBufferRecord* record);

// A peer's buffers as this process addresses them: its own pointers when it runs in this process,
// else mappings of its IPC handles (opened once per allocation and process, and kept: opening
// costs milliseconds, and a handle may be open only once per process). Up to 64 allocations stay
// mapped; the oldest is unmapped past that.
struct PeerBuffers {
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
};
absl::StatusOr<PeerBuffers> MapDeviceBuffers(const DeviceBufferRecord& record);

}  // namespace plexus::collectives::internal
