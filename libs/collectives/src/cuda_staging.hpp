// Device buffers (builds with PLEXUS_HAVE_CUDA): detection and pinned host staging. Without
// CUDA every pointer is a host pointer and staging is never needed.
#pragma once

#include <cstddef>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/base/cuda.hpp"
#include "plexus/collectives/types.hpp"

namespace plexus::collectives::internal {

// True when `p` is CUDA device memory (cudaPointerGetAttributes); false for host memory and in
// builds without CUDA.
bool IsDevicePointer(const void* p);

// For a call on device buffers: the context `p` belongs to, current until the scope ends, so that
// staging, kernels and the device-to-device path all work on p's GPU whatever the calling thread
// had current. nullopt for host memory (and where the context cannot be entered: the calls then
// stay in the thread's own).
std::optional<base::cuda::ContextScope> EnterDeviceContext(const void* p);

// Pinned host memory (cudaMallocHost), or nullptr when it cannot be had.
void* AllocPinned(size_t bytes);
void FreePinned(void* p);
absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes);
absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes);
// data[i] /= divisor on the device (a kernel in libs/kernels/src/cuda/divide.cu): the last step of
// kAvg for device buffers.
absl::Status DeviceDivide(DataType dtype, void* device, size_t n, int divisor);

// Copies between device memory and pinned host memory queued on two CUDA streams of their own
// (one per direction, so that both copy engines work at once), for staging pipelined with the
// collective's steps. Each copy gets a ticket; Wait(ticket) blocks until that copy (and every
// earlier one in its direction) has landed. Without CUDA every call is Unimplemented.
class CopyStreams {
 public:
  CopyStreams();
  ~CopyStreams();  // waits for every queued copy
  CopyStreams(const CopyStreams&) = delete;
  CopyStreams& operator=(const CopyStreams&) = delete;

  absl::StatusOr<int> ToHost(void* host, const void* device, size_t bytes);
  absl::StatusOr<int> ToDevice(void* device, const void* host, size_t bytes);
  absl::Status Wait(int ticket);
  absl::Status WaitAll();

 private:
  struct State;
  State* state_;
};

}  // namespace plexus::collectives::internal
