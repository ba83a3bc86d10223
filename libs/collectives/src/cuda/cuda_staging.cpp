// CUDA builds: device-pointer detection and pinned staging with the runtime API.
#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_staging.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::kernels {
// Launches the division kernel (libs/kernels/src/cuda/divide.cu).
cudaError_t LaunchDivide(int dtype, void* data, size_t n, int divisor);
}  // namespace plexus::kernels

namespace plexus::collectives::internal {

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
  cudaError_t e = kernels::LaunchDivide(static_cast<int>(dtype), device, n, divisor);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "average kernel");
}

struct CopyStreams::State {
  cudaStream_t to_host = nullptr;
  cudaStream_t to_device = nullptr;
  cudaError_t created = cudaSuccess;
  std::vector<cudaEvent_t> events;  // by ticket
};

// Blocking streams (cudaStreamDefault): like the synchronous cudaMemcpy they replace, their
// copies wait for work queued earlier on the legacy default stream, e.g. the kernel that wrote the
// user's buffer.
CopyStreams::CopyStreams() : state_(new State) {
  state_->created = cudaStreamCreateWithFlags(&state_->to_host, cudaStreamDefault);
  if (state_->created == cudaSuccess) {
    state_->created = cudaStreamCreateWithFlags(&state_->to_device, cudaStreamDefault);
  }
}

CopyStreams::~CopyStreams() {
  WaitAll().IgnoreError();
  for (cudaEvent_t e : state_->events) cudaEventDestroy(e);
  if (state_->to_host != nullptr) cudaStreamDestroy(state_->to_host);
  if (state_->to_device != nullptr) cudaStreamDestroy(state_->to_device);
  delete state_;
}

namespace {
absl::StatusOr<int> Enqueue(std::vector<cudaEvent_t>& events, cudaStream_t stream,
                            cudaError_t created, void* dst, const void* src, size_t bytes,
                            cudaMemcpyKind kind, const char* what) {
  if (created != cudaSuccess) return CudaError(created, "creating the staging copy streams");
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  if (e != cudaSuccess) return CudaError(e, what);
  cudaEvent_t done = nullptr;
  e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, stream);
  if (e != cudaSuccess) {
    if (done != nullptr) cudaEventDestroy(done);
    return CudaError(e, what);
  }
  events.push_back(done);
  return static_cast<int>(events.size() - 1);
}
}  // namespace

absl::StatusOr<int> CopyStreams::ToHost(void* host, const void* device, size_t bytes) {
  return Enqueue(state_->events, state_->to_host, state_->created, host, device, bytes,
                 cudaMemcpyDeviceToHost, "staging a device buffer to host (async)");
}

absl::StatusOr<int> CopyStreams::ToDevice(void* device, const void* host, size_t bytes) {
  return Enqueue(state_->events, state_->to_device, state_->created, device, host, bytes,
                 cudaMemcpyHostToDevice, "copying a result to the device (async)");
}

absl::Status CopyStreams::Wait(int ticket) {
  if (ticket < 0 || static_cast<size_t>(ticket) >= state_->events.size()) {
    return absl::InternalError(absl::StrCat("staging copy ticket ", ticket, " does not exist"));
  }
  const cudaError_t e = cudaEventSynchronize(state_->events[ticket]);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "waiting for a staging copy");
}

absl::Status CopyStreams::WaitAll() {
  if (state_->created != cudaSuccess) return absl::OkStatus();
  cudaError_t e = cudaStreamSynchronize(state_->to_host);
  if (e == cudaSuccess) e = cudaStreamSynchronize(state_->to_device);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "waiting for the staging copies");
}

}  // namespace plexus::collectives::internal
