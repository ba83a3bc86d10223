// Device buffers (builds with PLEXUS_HAVE_CUDA): detection and pinned host staging. Without
// CUDA every pointer is a host pointer and staging is never needed.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "plexus/collectives/types.hpp"

namespace plexus::collectives::internal {

// True when `p` is CUDA device memory (cudaPointerGetAttributes); false for host memory and in
// builds without CUDA.
bool IsDevicePointer(const void* p);

// Pinned host memory (cudaMallocHost), or nullptr when it cannot be had.
void* AllocPinned(size_t bytes);
void FreePinned(void* p);
absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes);
absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes);
// data[i] /= divisor on the device (a kernel in cuda/reduce_kernels.cu): the last step of kAvg
// for device buffers.
absl::Status DeviceDivide(DataType dtype, void* device, size_t n, int divisor);

}  // namespace plexus::collectives::internal
