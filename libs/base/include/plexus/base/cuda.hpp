// CUDA for every Plexus library, through the driver (libcuda.so.1) loaded on first use instead
// of linked: a program built with CUDA starts and runs on machines without a GPU, a driver or
// the toolkit (every call then fails with the reason, and Available() says it), and an installed
// Plexus needs no CUDA toolkit on its users' machines. Kernels are compiled by nvcc into images
// embedded in the libraries (cmake/PlexusCuda.cmake) and loaded into the calling thread's
// context when first launched.
//
// Context: each call works in the calling thread's current context (the one a CUDA runtime
// program, e.g. PyTorch, made current with cudaSetDevice); on a thread without one it makes the
// primary context current, of the device that owns the pointer it was given, else of device 0 —
// the context the CUDA runtime would use, so pointers and streams are shared with it.
// Every call may block until the work it queued on the legacy default stream is done where the
// matching CUDA runtime call would (Copy, Synchronize); Stream calls return once queued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::base::cuda {

// Whether the driver loads and has at least one device; otherwise `why_not` says why (built
// without CUDA, no libcuda.so.1, no device, an initialisation error).
bool Available(std::string* why_not = nullptr);

enum class Memory { kHost, kDevice, kManaged };

// What `p` points to; memory the driver does not know (plain host memory), and every pointer
// when CUDA is not available, is kHost.
Memory PointerMemory(const void* p);

// Whether a kernel may dereference `p`: device or managed memory, or page-locked host memory the
// driver knows (AllocPinned, registered memory) under unified addressing. Plain host memory, and
// every pointer when CUDA is not available: false.
bool DeviceAddressable(const void* p);

// Copies `bytes` between any two of host, pinned host and device memory (unified addressing),
// ordered after the work queued earlier on the legacy default stream. `what` names the copy in
// the error.
absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what);

// Page-locked host memory (fast, asynchronous copies); FreePinned(nullptr) does nothing.
absl::StatusOr<void*> AllocPinned(size_t bytes);
void FreePinned(void* p);

// Device memory of the current context, freed on destruction.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Sets `bytes` of device memory to zero.
absl::Status Zero(void* device, size_t bytes);

// Waits for everything queued in the current context.
absl::Status Synchronize();

// A point in a stream's work; Synchronize() blocks until the work before it is done.
class Event {
 public:
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event();
  absl::Status Synchronize() const;

 private:
  friend class Stream;
  void* event_ = nullptr;  // CUevent
};

// A stream of the current context. It is blocking (CU_STREAM_DEFAULT): its work also waits for
// work queued earlier on the legacy default stream, e.g. the kernel that wrote a user's buffer.
class Stream {
 public:
  static absl::StatusOr<Stream> Create();
  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();  // waits for its work

  // Queues a copy (see Copy) and returns at once.
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, const char* what);
  // An event after everything queued so far.
  absl::StatusOr<Event> Record();
  absl::Status Synchronize();

 private:
  void* stream_ = nullptr;  // CUstream
};

// CUDA IPC: a process of this host maps device memory another process allocated.
struct IpcHandle {
  unsigned char bytes[64];  // CUipcMemHandle, opaque
};
// The IPC handle of the allocation that holds `device`, and `device`'s offset in it (a handle
// names a whole cuMemAlloc/cudaMalloc allocation). InvalidArgument for memory that is not a
// device allocation of this process (e.g. a pointer into another process's mapping).
absl::StatusOr<IpcHandle> ExportIpc(const void* device, size_t* offset);
// Maps another process's allocation into the current context (with lazy peer access, so that
// the allocation may live on another device of this host). Opening a handle again returns the
// same mapping (the driver counts the opens); opening one of this process's own handles fails,
// as does one whose device this process cannot see or reach. The allocation's memory stays
// held until every importer closed it.
absl::StatusOr<void*> OpenIpc(const IpcHandle& handle);
// Unmaps what OpenIpc returned (in the context that opened it, whatever is current).
absl::Status CloseIpc(void* mapped);

// Makes the context that owns device memory `device` (for memory of no context, stream-ordered
// pools and the virtual memory API, its GPU's primary context) current on this thread until
// destroyed, then the one before again: every call in between works on that memory's device,
// whatever the thread had current (a worker thread that never chose a device, say).
class ContextScope {
 public:
  static absl::StatusOr<ContextScope> Enter(const void* device);
  ContextScope(ContextScope&& other) noexcept;
  ContextScope& operator=(ContextScope&&) = delete;
  ~ContextScope();

 private:
  ContextScope() = default;
  bool pushed_ = false;
};

// Identifies the context device memory `device` belongs to (memory of no context: its GPU's
// primary context), and the current one; 0 when unknown or none. Equal ids, same context.
uintptr_t ContextId(const void* device);
uintptr_t CurrentContextId();

// The UUID of the current context's GPU (the same in every process of the host, whatever the
// device numbering: CUDA_VISIBLE_DEVICES renumbers); FailedPrecondition with no current context.
struct DeviceUuid {
  unsigned char bytes[16];
};
absl::StatusOr<DeviceUuid> CurrentDeviceUuid();

// Lets kernels of the current context read and write `peer`, device memory of another context
// of this process (another GPU's primary context: cuCtxEnablePeerAccess, kept once enabled). OK
// when `peer` belongs to the current context; FailedPrecondition when the two GPUs cannot reach
// each other.
absl::Status EnablePeerAccess(const void* peer);

// A kernel image (fatbin) embedded by plexus_embed_cuda_kernels(): `name` for messages.
struct Image {
  const unsigned char* data;
  const char* name;
};

// Launches the extern "C" kernel `kernel` of `image` on the legacy default stream with a 1-D
// grid; `args` points at each argument, as for cuLaunchKernel. Returns once queued.
absl::Status Launch(const Image& image, const char* kernel, unsigned grid, unsigned block,
                    void** args);

}  // namespace plexus::base::cuda
