// Device buffers: detection and pinned staging on base::cuda (the driver, loaded at run time).
// Where CUDA cannot be used no pointer is device memory, so none of this is reached.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_staging.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/transport/memory.hpp"

namespace plexus::collectives::internal {

bool IsDevicePointer(const void* p) {
  if (p == nullptr) return false;
  // No device, no device pointers: skip the driver's query on every call (latency path).
  static const bool any_device = transport::CudaAvailable();
  if (!any_device) return false;
  return base::cuda::PointerMemory(p) == base::cuda::Memory::kDevice;
}

std::optional<base::cuda::ContextScope> EnterDeviceContext(const void* p) {
  if (!IsDevicePointer(p)) return std::nullopt;
  absl::StatusOr<base::cuda::ContextScope> scope = base::cuda::ContextScope::Enter(p);
  if (!scope.ok()) return std::nullopt;
  return std::optional<base::cuda::ContextScope>(std::move(*scope));
}

void* AllocPinned(size_t bytes) {
  absl::StatusOr<void*> p = base::cuda::AllocPinned(bytes);
  return p.ok() ? *p : nullptr;
}

void FreePinned(void* p) { base::cuda::FreePinned(p); }

absl::Status CopyDeviceToHost(void* host, const void* device, size_t bytes) {
  return base::cuda::Copy(host, device, bytes, "staging a device buffer to host");
}

absl::Status CopyHostToDevice(void* device, const void* host, size_t bytes) {
  return base::cuda::Copy(device, host, bytes, "copying a result to the device");
}

absl::Status DeviceDivide(DataType dtype, void* device, size_t n, int divisor) {
  if (n == 0) return absl::OkStatus();
  absl::Status s = kernels::DivideOnDevice(dtype, device, n, divisor);
  if (s.ok()) s = base::cuda::Synchronize();
  return base::Annotate(s, "average kernel");
}

struct CopyStreams::State {
  absl::Status created;
  base::cuda::Stream to_host;
  base::cuda::Stream to_device;
  std::vector<base::cuda::Event> events;  // by ticket
};

// Blocking streams: like the synchronous copies they replace, their copies wait for work queued
// earlier on the legacy default stream, e.g. the kernel that wrote the user's buffer.
CopyStreams::CopyStreams() : state_(new State) {
  absl::StatusOr<base::cuda::Stream> to_host = base::cuda::Stream::Create();
  absl::StatusOr<base::cuda::Stream> to_device =
      to_host.ok() ? base::cuda::Stream::Create() : to_host.status();
  if (!to_device.ok()) {
    state_->created = base::Annotate(to_device.status(), "creating the staging copy streams");
    return;
  }
  state_->to_host = *std::move(to_host);
  state_->to_device = *std::move(to_device);
}

CopyStreams::~CopyStreams() {
  WaitAll().IgnoreError();
  delete state_;
}

namespace {
absl::StatusOr<int> Enqueue(std::vector<base::cuda::Event>& events, const absl::Status& created,
                            base::cuda::Stream& stream, void* dst, const void* src, size_t bytes,
                            const char* what) {
  PLEXUS_RETURN_IF_ERROR(created);
  PLEXUS_RETURN_IF_ERROR(stream.CopyAsync(dst, src, bytes, what));
  PLEXUS_ASSIGN_OR_RETURN(base::cuda::Event done, stream.Record());
  events.push_back(std::move(done));
  return static_cast<int>(events.size() - 1);
}
}  // namespace

absl::StatusOr<int> CopyStreams::ToHost(void* host, const void* device, size_t bytes) {
  return Enqueue(state_->events, state_->created, state_->to_host, host, device, bytes,
                 "staging a device buffer to host (async)");
}

absl::StatusOr<int> CopyStreams::ToDevice(void* device, const void* host, size_t bytes) {
  return Enqueue(state_->events, state_->created, state_->to_device, device, host, bytes,
                 "copying a result to the device (async)");
}

absl::Status CopyStreams::Wait(int ticket) {
  if (ticket < 0 || static_cast<size_t>(ticket) >= state_->events.size()) {
    return absl::InternalError(absl::StrCat("staging copy ticket ", ticket, " does not exist"));
  }
  return base::Annotate(state_->events[ticket].Synchronize(), "waiting for a staging copy");
}

absl::Status CopyStreams::WaitAll() {
  if (!state_->created.ok()) return absl::OkStatus();
  absl::Status s = state_->to_host.Synchronize();
  if (s.ok()) s = state_->to_device.Synchronize();
  return base::Annotate(s, "waiting for the staging copies");
}

}  // namespace plexus::collectives::internal
