// Host side of the CUDA dispatcher, on base::cuda (the driver, loaded at run time): every build
// runs (CPU only) where no GPU or driver exists, and says why the CUDA path cannot.
#include "absl/strings/str_cat.h"
#include "dispatch_internal.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/base/status.hpp"
#include "plexus/config.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::moe {

#if PLEXUS_HAVE_CUDA
namespace internal {
extern const unsigned char kDispatchFatbin[];  // generated from src/cuda/dispatch_kernel.cu
}  // namespace internal
#endif

// The transport's probe: one answer (and one reason) for every library asking about CUDA.
bool CudaDispatchAvailable(std::string* why_not) { return transport::CudaAvailable(why_not); }

namespace {

#if PLEXUS_HAVE_CUDA
absl::Status RunDispatchKernel(const DispatchInput& input, int64_t* host_dense) {
  const size_t cells = static_cast<size_t>(input.num_experts) * input.num_ranks;
  const size_t dense_bytes = cells * input.num_ranks * sizeof(int64_t);
  const size_t i64 = cells * sizeof(int64_t);
  const size_t i32 = cells * sizeof(int);
  using base::cuda::DeviceBuffer;
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer tokens, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer replicas, DeviceBuffer::Allocate(i32));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer capacity, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer local, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer dense, DeviceBuffer::Allocate(dense_bytes));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer holders, DeviceBuffer::Allocate(i32));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer residual, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer share, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer remainder, DeviceBuffer::Allocate(i64));
  PLEXUS_ASSIGN_OR_RETURN(DeviceBuffer order, DeviceBuffer::Allocate(i32));
  PLEXUS_RETURN_IF_ERROR(
      base::cuda::Copy(tokens.data(), input.tokens.data(), i64, "copying the tokens"));
  PLEXUS_RETURN_IF_ERROR(
      base::cuda::Copy(replicas.data(), input.replicas.data(), i32, "copying the replicas"));
  PLEXUS_RETURN_IF_ERROR(base::cuda::Zero(dense.data(), dense_bytes));
  int num_experts = input.num_experts;
  int num_ranks = input.num_ranks;
  // In the kernel's parameter order.
  void* pointers[] = {tokens.data(),    replicas.data(), capacity.data(), local.data(),
                      dense.data(),     holders.data(),  residual.data(), share.data(),
                      remainder.data(), order.data()};
  void* args[12] = {&num_experts, &num_ranks};
  for (int i = 0; i < 10; ++i) args[2 + i] = &pointers[i];
  const unsigned threads = 128;
  const unsigned blocks = static_cast<unsigned>((num_experts + threads - 1) / threads);
  PLEXUS_RETURN_IF_ERROR(base::cuda::Launch({internal::kDispatchFatbin, "plexus::moe dispatcher"},
                                            "plexus_moe_dispatch", blocks, threads, args));
  PLEXUS_RETURN_IF_ERROR(base::Annotate(base::cuda::Synchronize(), "kernel execution"));
  return base::cuda::Copy(host_dense, dense.data(), dense_bytes, "copying the flows back");
}
#endif

}  // namespace

absl::StatusOr<std::vector<int64_t>> ComputeDispatchDenseCuda(const DispatchInput& input) {
  PLEXUS_RETURN_IF_ERROR(internal::ValidateDispatchInput(input));
  std::string why;
  if (!CudaDispatchAvailable(&why)) {
    return absl::UnavailableError(
        absl::StrCat("the CUDA dispatcher cannot run: ", why, "; use ComputeDispatch (CPU)"));
  }
#if PLEXUS_HAVE_CUDA
  const size_t dense_cells =
      static_cast<size_t>(input.num_experts) * input.num_ranks * input.num_ranks;
  if (dense_cells > (size_t{1} << 27)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense flows of ", input.num_experts, " experts x ", input.num_ranks, "^2 ranks exceed ",
        size_t{1} << 27, " entries; use ComputeDispatch (CPU, sparse)"));
  }
  std::vector<int64_t> dense(dense_cells, 0);
  PLEXUS_RETURN_IF_ERROR(base::Annotate(RunDispatchKernel(input, dense.data()), "CUDA dispatcher"));
  return dense;
#else
  return absl::InternalError("unreachable: a build without CUDA never has a device");
#endif
}

}  // namespace plexus::moe
