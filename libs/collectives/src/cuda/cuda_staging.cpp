// CUDA builds: device-pointer detection and pinned staging with the runtime API.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "cuda_staging.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::collectives::internal {

// Launches the division kernel (reduce_kernels.cu).
cudaError_t LaunchDivide(int dtype, void* data, size_t n, int divisor);

namespace {
absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
}  // namespace

bool IsDevicePointer(const void* p) {
  if (p == nullptr) return false;
  // No device, no device pointers: skip the runtime's query on every call (latency path).
  static const bool any_device = transport::CudaAvailable();
  if (!any_device) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on old runtimes: clear the sticky error
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

void* AllocPinned(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) return nullptr;
  return p;
}

void FreePinned(void* p) {
  if (p != nullptr) cudaFreeHost(p);
}

absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t e = cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "staging a device buffer to host");
}

absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t e = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "copying a result to the device");
}

absl::Status DeviceDivide(DataType dtype, void* device, size_t n, int divisor) {
  if (n == 0) return absl::OkStatus();
  cudaError_t e = LaunchDivide(static_cast<int>(dtype), device, n, divisor);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "average kernel");
}

}  // namespace plexus::collectives::internal
