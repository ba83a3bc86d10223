// Built when Plexus has no CUDA toolkit: the CUDA dispatcher reports why it cannot run.
#include "plexus/moe/dispatch.hpp"

namespace plexus::moe {

bool CudaDispatchAvailable(std::string* why_not) {
  if (why_not) *why_not = "Plexus was built without CUDA (no nvcc/toolkit found at configure time)";
  return false;
}

absl::StatusOr<std::vector<int64_t>> ComputeDispatchDenseCuda(const DispatchInput&) {
  return absl::UnavailableError(
      "the CUDA dispatcher is not compiled in: Plexus was built without CUDA; use "
      "ComputeDispatch (CPU)");
}

}  // namespace plexus::moe
