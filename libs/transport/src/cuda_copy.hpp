// Host <-> CUDA device copies for backends that stage device memory through host buffers.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace plexus::transport::internal {

absl::Status CopyHostToCuda(void* device_dst, const void* host_src, size_t bytes);
absl::Status CopyCudaToHost(void* host_dst, const void* device_src, size_t bytes);
// OK when `ptr` is CUDA device memory usable from this process.
absl::Status CheckCudaPointer(const void* ptr);

}  // namespace plexus::transport::internal
