// Host side of the CUDA dispatcher: probes for a GPU at run time, so a CUDA build still runs
// (CPU only) where no GPU or driver exists.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "dispatch_internal.hpp"
#include "plexus/base/status.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::moe {
namespace internal {
std::string RunDispatchKernel(int num_experts, int num_ranks, const int64_t* host_tokens,
                              const int* host_replicas, int64_t* host_dense);
}  // namespace internal

// The transport's probe: one answer (and one reason) for every library asking about CUDA.
bool CudaDispatchAvailable(std::string* why_not) { return transport::CudaAvailable(why_not); }

absl::StatusOr<std::vector<int64_t>> ComputeDispatchDenseCuda(const DispatchInput& input) {
  PLEXUS_RETURN_IF_ERROR(internal::ValidateDispatchInput(input));
  std::string why;
  if (!CudaDispatchAvailable(&why)) {
    return absl::UnavailableError(
        absl::StrCat("the CUDA dispatcher cannot run: ", why, "; use ComputeDispatch (CPU)"));
  }
  const size_t dense_cells =
      static_cast<size_t>(input.num_experts) * input.num_ranks * input.num_ranks;
  if (dense_cells > (size_t{1} << 27)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense flows of ", input.num_experts, " experts x ", input.num_ranks, "^2 ranks exceed ",
        size_t{1} << 27, " entries; use ComputeDispatch (CPU, sparse)"));
  }
  std::vector<int64_t> dense(dense_cells, 0);
  const std::string error = internal::RunDispatchKernel(
      input.num_experts, input.num_ranks, input.tokens.data(), input.replicas.data(), dense.data());
  if (!error.empty()) return absl::InternalError(absl::StrCat("CUDA dispatcher: ", error));
  return dense;
}

}  // namespace plexus::moe
