// Builds without CUDA: no pointer is device memory.
#include "absl/strings/str_cat.h"
#include "cuda_staging.hpp"

namespace plexus::collectives::internal {

bool IsDevicePointer(const void*) { return false; }
void* AllocPinned(size_t) { return nullptr; }
void FreePinned(void*) {}
absl::Status CopyDeviceToHost(void*, const void*, size_t) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}
absl::Status CopyHostToDevice(void*, const void*, size_t) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}
absl::Status DeviceDivide(DataType, void*, size_t, int) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}

struct CopyStreams::State {};
CopyStreams::CopyStreams() : state_(nullptr) {}
CopyStreams::~CopyStreams() = default;
absl::StatusOr<int> CopyStreams::ToHost(void*, const void*, size_t) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}
absl::StatusOr<int> CopyStreams::ToDevice(void*, const void*, size_t) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}
absl::Status CopyStreams::Wait(int) {
  return absl::UnimplementedError("this build of plexus has no CUDA support");
}
absl::Status CopyStreams::WaitAll() { return absl::OkStatus(); }

}  // namespace plexus::collectives::internal
