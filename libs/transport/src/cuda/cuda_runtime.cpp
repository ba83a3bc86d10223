// CUDA runtime glue: probing and staging copies. Compiled when the toolkit is found; every call
// is checked at run time, so a binary built with CUDA runs (without CUDA memory) on a machine
// that has no GPU or no driver.
#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::transport {

bool CudaAvailable(std::string* why_not) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_not) *why_not = absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err));
    return false;
  }
  if (count == 0) {
    if (why_not) *why_not = "no CUDA device present";
    return false;
  }
  return true;
}

namespace internal {
namespace {
absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}
}  // namespace

absl::Status CopyHostToCuda(void* device_dst, const void* host_src, size_t bytes) {
  const cudaError_t err = cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "cudaMemcpy host->device");
}

absl::Status CopyCudaToHost(void* host_dst, const void* device_src, size_t bytes) {
  const cudaError_t err = cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "cudaMemcpy device->host");
}

absl::Status CheckCudaPointer(const void* ptr) {
  cudaPointerAttributes attrs{};
  const cudaError_t err = cudaPointerGetAttributes(&attrs, ptr);
  if (err != cudaSuccess) return CudaError(err, "cudaPointerGetAttributes");
  if (attrs.type != cudaMemoryTypeDevice && attrs.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError("pointer registered as kCuda is not CUDA device memory");
  }
  return absl::OkStatus();
}
}  // namespace internal

}  // namespace plexus::transport
