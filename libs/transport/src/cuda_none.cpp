// Built when Plexus is configured without CUDA (PLEXUS_WITH_CUDA=OFF or no toolkit found).
#include <string>

#include "cuda_copy.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::transport {

bool CudaAvailable(std::string* why_not) {
  if (why_not) *why_not = "Plexus was built without CUDA (PLEXUS_WITH_CUDA=OFF or no toolkit)";
  return false;
}

namespace internal {
namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "CUDA memory requested but Plexus was built without CUDA (reconfigure with "
      "-DPLEXUS_WITH_CUDA=ON and the toolkit in /usr/local/cuda)");
}
}  // namespace
absl::Status CopyHostToCuda(void*, const void*, size_t) { return NoCuda(); }
absl::Status CopyCudaToHost(void*, const void*, size_t) { return NoCuda(); }
absl::Status CheckCudaPointer(const void*) { return NoCuda(); }
}  // namespace internal

}  // namespace plexus::transport
