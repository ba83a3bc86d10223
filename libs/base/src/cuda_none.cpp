// Builds without the CUDA toolkit: no kernels can be embedded, so CUDA is never available and
// every pointer is host memory.
#include "plexus/base/cuda.hpp"

namespace plexus::base::cuda {
namespace {
constexpr char kWhy[] =
    "Plexus was built without CUDA (no toolkit found, or PLEXUS_WITH_CUDA=OFF); rebuild with the "
    "toolkit in /usr/local/cuda to use GPU memory";

absl::Status NoCuda() { return absl::FailedPreconditionError(kWhy); }
}  // namespace

bool Available(std::string* why_not) {
  if (why_not != nullptr) *why_not = kWhy;
  return false;
}
Memory PointerMemory(const void*) { return Memory::kHost; }
bool DeviceAddressable(const void*) { return false; }
absl::Status Copy(void*, const void*, size_t, const char*) { return NoCuda(); }
absl::StatusOr<void*> AllocPinned(size_t) { return NoCuda(); }
void FreePinned(void*) {}
absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t) { return NoCuda(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
DeviceBuffer::~DeviceBuffer() = default;
absl::Status Zero(void*, size_t) { return NoCuda(); }
absl::Status Synchronize() { return NoCuda(); }
Event::Event(Event&&) noexcept {}
Event& Event::operator=(Event&&) noexcept { return *this; }
Event::~Event() = default;
absl::Status Event::Synchronize() const { return NoCuda(); }
absl::StatusOr<Stream> Stream::Create() { return NoCuda(); }
Stream::Stream(Stream&&) noexcept {}
Stream& Stream::operator=(Stream&&) noexcept { return *this; }
Stream::~Stream() = default;
absl::Status Stream::CopyAsync(void*, const void*, size_t, const char*) { return NoCuda(); }
absl::StatusOr<Event> Stream::Record() { return NoCuda(); }
absl::Status Stream::Synchronize() { return NoCuda(); }
absl::StatusOr<IpcHandle> ExportIpc(const void*, size_t*) { return NoCuda(); }
absl::StatusOr<void*> OpenIpc(const IpcHandle&) { return NoCuda(); }
absl::Status CloseIpc(void*) { return NoCuda(); }
absl::StatusOr<ContextScope> ContextScope::Enter(const void*) { return NoCuda(); }
ContextScope::ContextScope(ContextScope&&) noexcept {}
ContextScope::~ContextScope() = default;
absl::Status EnablePeerAccess(const void*) { return NoCuda(); }
uintptr_t ContextId(const void*) { return 0; }
uintptr_t CurrentContextId() { return 0; }
absl::StatusOr<DeviceUuid> CurrentDeviceUuid() { return NoCuda(); }
absl::Status Launch(const Image&, const char*, unsigned, unsigned, void**) { return NoCuda(); }
}  // namespace plexus::base::cuda
