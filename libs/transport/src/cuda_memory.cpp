// CUDA memory regions: probing and the copies of backends that stage device memory through host
// buffers, on base::cuda (the driver, loaded at run time), so that every build runs where no GPU
// or driver exists and says why CUDA memory cannot be used there.
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::transport {

bool CudaAvailable(std::string* why_not) { return base::cuda::Available(why_not); }

namespace internal {

absl::Status CopyHostToCuda(void* device_dst, const void* host_src, size_t bytes) {
  return base::cuda::Copy(device_dst, host_src, bytes, "copying host memory to a CUDA region");
}

absl::Status CopyCudaToHost(void* host_dst, const void* device_src, size_t bytes) {
  return base::cuda::Copy(host_dst, device_src, bytes, "copying a CUDA region to host memory");
}

absl::Status CheckCudaPointer(const void* ptr) {
  std::string why;
  if (!base::cuda::Available(&why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory registered as kCuda, but CUDA cannot be used here: ", why));
  }
  if (base::cuda::PointerMemory(ptr) == base::cuda::Memory::kHost) {
    return absl::InvalidArgumentError("pointer registered as kCuda is not CUDA device memory");
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace plexus::transport
