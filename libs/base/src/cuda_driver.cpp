// CUDA builds: the driver API, resolved from libcuda.so.1 with dlopen/dlsym. Types and the
// versioned entry points come from the toolkit's cuda.h (cuMemAlloc is cuMemAlloc_v2 there, and
// that is the symbol looked up); nothing of the toolkit is linked.
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/cuda.hpp"
#include "plexus/base/status.hpp"

namespace plexus::base::cuda {
namespace {

#define PLEXUS_CU_NAME_(fn) #fn
#define PLEXUS_CU_NAME(fn) PLEXUS_CU_NAME_(fn)

// Every driver entry point Plexus calls.
#define PLEXUS_CU_FUNCTIONS(X) \
  X(cuInit)                    \
  X(cuGetErrorName)            \
  X(cuGetErrorString)          \
  X(cuDeviceGetCount)          \
  X(cuDeviceGet)               \
  X(cuDevicePrimaryCtxRetain)  \
  X(cuCtxGetCurrent)           \
  X(cuCtxSetCurrent)           \
  X(cuCtxSynchronize)          \
  X(cuCtxPushCurrent)          \
  X(cuCtxPopCurrent)           \
  X(cuCtxGetDevice)            \
  X(cuDeviceGetUuid)           \
  X(cuCtxEnablePeerAccess)     \
  X(cuDeviceCanAccessPeer)     \
  X(cuPointerGetAttribute)     \
  X(cuMemcpy)                  \
  X(cuMemcpyAsync)             \
  X(cuMemAlloc)                \
  X(cuMemFree)                 \
  X(cuMemAllocHost)            \
  X(cuMemFreeHost)             \
  X(cuMemsetD8)                \
  X(cuMemGetAddressRange)      \
  X(cuIpcGetMemHandle)         \
  X(cuIpcOpenMemHandle)        \
  X(cuIpcCloseMemHandle)       \
  X(cuStreamCreate)            \
  X(cuStreamDestroy)           \
  X(cuStreamSynchronize)       \
  X(cuEventCreate)             \
  X(cuEventRecord)             \
  X(cuEventSynchronize)        \
  X(cuEventDestroy)            \
  X(cuModuleLoadData)          \
  X(cuModuleGetFunction)       \
  X(cuLaunchKernel)

struct Driver {
#define PLEXUS_CU_FIELD(fn) decltype(&fn) fn##_ = nullptr;
  PLEXUS_CU_FUNCTIONS(PLEXUS_CU_FIELD)
#undef PLEXUS_CU_FIELD
  std::string error;  // why the driver cannot be used; empty when it can
  int devices = 0;
};

std::string ErrorText(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName_ != nullptr) d.cuGetErrorName_(r, &name);
  if (d.cuGetErrorString_ != nullptr) d.cuGetErrorString_(r, &text);
  return absl::StrCat(name != nullptr ? name : "CUDA error", " (", static_cast<int>(r),
                      "): ", text != nullptr ? text : "no description");
}

const Driver& Loaded() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    // The driver's soname since CUDA 1.0; installed with the NVIDIA driver, not the toolkit.
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      d->error = absl::StrCat("the NVIDIA driver library libcuda.so.1 cannot be loaded (",
                              why != nullptr ? why : "unknown error",
                              "): no GPU driver is installed on this machine");
      return d;
    }
#define PLEXUS_CU_RESOLVE(fn)                                                           \
  if (d->error.empty()) {                                                               \
    d->fn##_ = reinterpret_cast<decltype(&fn)>(dlsym(handle, PLEXUS_CU_NAME(fn)));      \
    if (d->fn##_ == nullptr) {                                                          \
      d->error = absl::StrCat("libcuda.so.1 lacks ", PLEXUS_CU_NAME(fn),                \
                              ": the NVIDIA driver is older than this build of Plexus " \
                              "(built with CUDA ",                                      \
                              CUDA_VERSION / 1000, ".", CUDA_VERSION % 1000 / 10, ")"); \
    }                                                                                   \
  }
    PLEXUS_CU_FUNCTIONS(PLEXUS_CU_RESOLVE)
#undef PLEXUS_CU_RESOLVE
    if (!d->error.empty()) return d;
    CUresult r = d->cuInit_(0);
    if (r == CUDA_SUCCESS) r = d->cuDeviceGetCount_(&d->devices);
    if (r != CUDA_SUCCESS) {
      d->error = absl::StrCat("the CUDA driver did not initialise: ", ErrorText(*d, r));
    } else if (d->devices == 0) {
      d->error = "the CUDA driver sees no device";
    }
    return d;
  }();
  return *driver;
}

// The driver, or why it cannot be used.
absl::StatusOr<const Driver*> Get() {
  const Driver& d = Loaded();
  if (!d.error.empty()) return absl::FailedPreconditionError(absl::StrCat("CUDA: ", d.error));
  return &d;
}

absl::Status Check(const Driver& d, CUresult r, const char* call, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", call, " failed: ", ErrorText(d, r)));
}

CUdeviceptr Ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// The primary context of `device` (< 0 or unknown: device 0), retained once per device for the
// life of the process as the runtime does.
absl::StatusOr<CUcontext> PrimaryContext(const Driver& d, int device) {
  if (device < 0 || device >= d.devices) device = 0;
  static std::mutex mu;
  static std::map<int, CUcontext>* primary = new std::map<int, CUcontext>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = primary->find(device);
  if (it != primary->end()) return it->second;
  CUdevice dev = 0;
  CUcontext context = nullptr;
  CUresult r = d.cuDeviceGet_(&dev, device);
  if (r == CUDA_SUCCESS) r = d.cuDevicePrimaryCtxRetain_(&context, dev);
  if (r != CUDA_SUCCESS) {
    return Check(d, r, "cuDevicePrimaryCtxRetain", absl::StrCat("CUDA device ", device).c_str());
  }
  primary->emplace(device, context);
  return context;
}

// Makes a context current on this thread unless one is: the primary context of `device`.
absl::Status EnsureContext(const Driver& d, int device = -1) {
  CUcontext current = nullptr;
  if (d.cuCtxGetCurrent_(&current) == CUDA_SUCCESS && current != nullptr) {
    return absl::OkStatus();
  }
  PLEXUS_ASSIGN_OR_RETURN(CUcontext context, PrimaryContext(d, device));
  return Check(d, d.cuCtxSetCurrent_(context), "cuCtxSetCurrent", "CUDA context");
}

// The context device memory `p` belongs to: the one it was allocated in, or, for memory that
// belongs to none (stream-ordered pools, the virtual memory API), its device's primary context.
absl::StatusOr<CUcontext> OwnerContext(const Driver& d, const void* p) {
  CUcontext owner = nullptr;
  if (d.cuPointerGetAttribute_(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, Ptr(p)) == CUDA_SUCCESS &&
      owner != nullptr) {
    return owner;
  }
  int ordinal = -1;
  if (d.cuPointerGetAttribute_(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Ptr(p)) !=
          CUDA_SUCCESS ||
      ordinal < 0) {
    return absl::InvalidArgumentError("CUDA: the pointer is not device memory of this process");
  }
  return PrimaryContext(d, ordinal);
}

// The context for work on `p`: the current one, else the primary context of p's device.
absl::Status EnsureContextFor(const Driver& d, const void* p) {
  CUcontext current = nullptr;
  if (d.cuCtxGetCurrent_(&current) == CUDA_SUCCESS && current != nullptr) {
    return absl::OkStatus();
  }
  int ordinal = -1;
  if (p != nullptr && d.cuPointerGetAttribute_(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                               Ptr(p)) != CUDA_SUCCESS) {
    ordinal = -1;  // host memory the driver does not know
  }
  return EnsureContext(d, ordinal);
}

}  // namespace

bool Available(std::string* why_not) {
  const Driver& d = Loaded();
  if (d.error.empty()) return true;
  if (why_not != nullptr) *why_not = d.error;
  return false;
}

Memory PointerMemory(const void* p) {
  const Driver& d = Loaded();
  if (!d.error.empty() || p == nullptr) return Memory::kHost;
  unsigned int type = 0;
  if (d.cuPointerGetAttribute_(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Ptr(p)) != CUDA_SUCCESS) {
    return Memory::kHost;
  }
  unsigned int managed = 0;
  if (d.cuPointerGetAttribute_(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, Ptr(p)) == CUDA_SUCCESS &&
      managed != 0) {
    return Memory::kManaged;
  }
  return type == CU_MEMORYTYPE_DEVICE ? Memory::kDevice : Memory::kHost;
}

bool DeviceAddressable(const void* p) {
  const Driver& d = Loaded();
  if (!d.error.empty() || p == nullptr) return false;
  unsigned int type = 0;
  return d.cuPointerGetAttribute_(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Ptr(p)) == CUDA_SUCCESS;
}

absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return absl::OkStatus();
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context =
      EnsureContextFor(**d, PointerMemory(src) != Memory::kHost ? src : dst);
  if (!context.ok()) return context;
  return Check(**d, (*d)->cuMemcpy_(Ptr(dst), Ptr(src), bytes), "cuMemcpy", what);
}

absl::StatusOr<void*> AllocPinned(size_t bytes) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContext(**d);
  if (!context.ok()) return context;
  void* p = nullptr;
  const absl::Status s = Check(**d, (*d)->cuMemAllocHost_(&p, bytes == 0 ? 1 : bytes),
                               "cuMemAllocHost", "pinned host memory");
  if (!s.ok()) return s;
  return p;
}

void FreePinned(void* p) {
  if (p != nullptr && Loaded().error.empty()) Loaded().cuMemFreeHost_(p);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContext(**d);
  if (!context.ok()) return context;
  CUdeviceptr p = 0;
  const absl::Status s =
      Check(**d, (*d)->cuMemAlloc_(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc",
            absl::StrCat("allocating ", bytes, " bytes of device memory").c_str());
  if (!s.ok()) return s;
  DeviceBuffer buffer;
  buffer.data_ = reinterpret_cast<void*>(p);
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  if (EnsureContextFor(Loaded(), data_).ok()) Loaded().cuMemFree_(Ptr(data_));
}

absl::Status Zero(void* device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContextFor(**d, device);
  if (!context.ok()) return context;
  return Check(**d, (*d)->cuMemsetD8_(Ptr(device), 0, bytes), "cuMemsetD8",
               "zeroing device memory");
}

absl::Status Synchronize() {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContext(**d);
  if (!context.ok()) return context;
  return Check(**d, (*d)->cuCtxSynchronize_(), "cuCtxSynchronize", "waiting for the device");
}

absl::StatusOr<IpcHandle> ExportIpc(const void* device, size_t* offset) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  PLEXUS_RETURN_IF_ERROR(EnsureContextFor(**d, device));
  CUdeviceptr base = 0;
  size_t size = 0;
  if ((*d)->cuMemGetAddressRange_(&base, &size, Ptr(device)) != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        "CUDA IPC: the pointer is not in a device allocation of this process");
  }
  static_assert(sizeof(CUipcMemHandle) == sizeof(IpcHandle));
  CUipcMemHandle h;
  PLEXUS_RETURN_IF_ERROR(Check(**d, (*d)->cuIpcGetMemHandle_(&h, base), "cuIpcGetMemHandle",
                               "exporting a device buffer to the other processes of this host"));
  IpcHandle out;
  std::memcpy(out.bytes, &h, sizeof(out.bytes));
  if (offset != nullptr) *offset = static_cast<size_t>(Ptr(device) - base);
  return out;
}

absl::StatusOr<void*> OpenIpc(const IpcHandle& handle) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  PLEXUS_RETURN_IF_ERROR(EnsureContext(**d));
  CUipcMemHandle h;
  std::memcpy(&h, handle.bytes, sizeof(h));
  CUdeviceptr mapped = 0;
  PLEXUS_RETURN_IF_ERROR(
      Check(**d, (*d)->cuIpcOpenMemHandle_(&mapped, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            "cuIpcOpenMemHandle", "mapping another process's device buffer"));
  return reinterpret_cast<void*>(mapped);
}

absl::Status CloseIpc(void* mapped) {
  PLEXUS_ASSIGN_OR_RETURN(ContextScope scope, ContextScope::Enter(mapped));
  const Driver& d = Loaded();
  return Check(d, d.cuIpcCloseMemHandle_(Ptr(mapped)), "cuIpcCloseMemHandle",
               "unmapping another process's device buffer");
}

absl::StatusOr<ContextScope> ContextScope::Enter(const void* device) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  PLEXUS_ASSIGN_OR_RETURN(CUcontext owner, OwnerContext(**d, device));
  ContextScope scope;
  CUcontext current = nullptr;
  if ((*d)->cuCtxGetCurrent_(&current) == CUDA_SUCCESS && current == owner) return scope;
  PLEXUS_RETURN_IF_ERROR(Check(**d, (*d)->cuCtxPushCurrent_(owner), "cuCtxPushCurrent",
                               "making the buffer's CUDA context current"));
  scope.pushed_ = true;
  return scope;
}

uintptr_t ContextId(const void* device) {
  const Driver& d = Loaded();
  if (!d.error.empty() || device == nullptr) return 0;
  absl::StatusOr<CUcontext> owner = OwnerContext(d, device);
  return owner.ok() ? reinterpret_cast<uintptr_t>(*owner) : 0;
}

uintptr_t CurrentContextId() {
  const Driver& d = Loaded();
  CUcontext current = nullptr;
  if (!d.error.empty() || d.cuCtxGetCurrent_(&current) != CUDA_SUCCESS) return 0;
  return reinterpret_cast<uintptr_t>(current);
}

absl::StatusOr<DeviceUuid> CurrentDeviceUuid() {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  CUdevice device = 0;
  if ((*d)->cuCtxGetDevice_(&device) != CUDA_SUCCESS) {
    return absl::FailedPreconditionError("CUDA: no current context to name the device of");
  }
  CUuuid uuid;
  PLEXUS_RETURN_IF_ERROR(
      Check(**d, (*d)->cuDeviceGetUuid_(&uuid, device), "cuDeviceGetUuid", "naming a GPU"));
  static_assert(sizeof(uuid.bytes) == sizeof(DeviceUuid::bytes));
  DeviceUuid out;
  std::memcpy(out.bytes, uuid.bytes, sizeof(out.bytes));
  return out;
}

ContextScope::ContextScope(ContextScope&& other) noexcept
    : pushed_(std::exchange(other.pushed_, false)) {}

ContextScope::~ContextScope() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  Loaded().cuCtxPopCurrent_(&popped);
}

absl::Status EnablePeerAccess(const void* peer) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const Driver& driver = **d;
  CUcontext current = nullptr;
  if (driver.cuCtxGetCurrent_(&current) != CUDA_SUCCESS || current == nullptr) {
    return absl::FailedPreconditionError("CUDA: no current context to enable peer access from");
  }
  PLEXUS_ASSIGN_OR_RETURN(CUcontext owner, OwnerContext(driver, peer));
  if (owner == current) return absl::OkStatus();
  CUdevice mine = 0;
  int theirs = -1, can = 0;
  PLEXUS_RETURN_IF_ERROR(
      Check(driver, driver.cuCtxGetDevice_(&mine), "cuCtxGetDevice", "peer access"));
  PLEXUS_RETURN_IF_ERROR(
      Check(driver,
            driver.cuPointerGetAttribute_(&theirs, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Ptr(peer)),
            "cuPointerGetAttribute", "peer access"));
  CUdevice other = 0;
  PLEXUS_RETURN_IF_ERROR(
      Check(driver, driver.cuDeviceGet_(&other, theirs), "cuDeviceGet", "peer access"));
  if (other == mine) {
    return absl::FailedPreconditionError(
        "CUDA: the peer buffer is in another context of the same GPU, which kernels of this one "
        "cannot address");
  }
  PLEXUS_RETURN_IF_ERROR(Check(driver, driver.cuDeviceCanAccessPeer_(&can, mine, other),
                               "cuDeviceCanAccessPeer", "peer access"));
  if (can == 0) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA: GPU ", static_cast<int>(mine),
                                                      " cannot access GPU ", theirs, "'s memory"));
  }
  const CUresult r = driver.cuCtxEnablePeerAccess_(owner, 0);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return absl::OkStatus();
  return Check(driver, r, "cuCtxEnablePeerAccess", "peer access between two GPUs");
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) Loaded().cuEventDestroy_(static_cast<CUevent>(event_));
}

absl::Status Event::Synchronize() const {
  if (event_ == nullptr) return absl::FailedPreconditionError("CUDA: waiting for an empty event");
  const Driver& d = Loaded();
  return Check(d, d.cuEventSynchronize_(static_cast<CUevent>(event_)), "cuEventSynchronize",
               "waiting for a CUDA event");
}

absl::StatusOr<Stream> Stream::Create() {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContext(**d);
  if (!context.ok()) return context;
  CUstream s = nullptr;
  const absl::Status created =
      Check(**d, (*d)->cuStreamCreate_(&s, CU_STREAM_DEFAULT), "cuStreamCreate", "a CUDA stream");
  if (!created.ok()) return created;
  Stream stream;
  stream.stream_ = s;
  return stream;
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ == nullptr) return;
  const Driver& d = Loaded();
  d.cuStreamSynchronize_(static_cast<CUstream>(stream_));
  d.cuStreamDestroy_(static_cast<CUstream>(stream_));
}

absl::Status Stream::CopyAsync(void* dst, const void* src, size_t bytes, const char* what) {
  if (stream_ == nullptr) return absl::FailedPreconditionError("CUDA: copy on an empty stream");
  const Driver& d = Loaded();
  return Check(d, d.cuMemcpyAsync_(Ptr(dst), Ptr(src), bytes, static_cast<CUstream>(stream_)),
               "cuMemcpyAsync", what);
}

absl::StatusOr<Event> Stream::Record() {
  if (stream_ == nullptr) return absl::FailedPreconditionError("CUDA: record on an empty stream");
  const Driver& d = Loaded();
  CUevent e = nullptr;
  absl::Status s =
      Check(d, d.cuEventCreate_(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate", "a CUDA event");
  if (!s.ok()) return s;
  Event event;
  event.event_ = e;
  s = Check(d, d.cuEventRecord_(e, static_cast<CUstream>(stream_)), "cuEventRecord",
            "a CUDA event");
  if (!s.ok()) return s;
  return event;
}

absl::Status Stream::Synchronize() {
  if (stream_ == nullptr) return absl::OkStatus();
  const Driver& d = Loaded();
  return Check(d, d.cuStreamSynchronize_(static_cast<CUstream>(stream_)), "cuStreamSynchronize",
               "waiting for a CUDA stream");
}

absl::Status Launch(const Image& image, const char* kernel, unsigned grid, unsigned block,
                    void** args) {
  const absl::StatusOr<const Driver*> d = Get();
  if (!d.ok()) return d.status();
  const absl::Status context = EnsureContext(**d);
  if (!context.ok()) return context;
  CUcontext current = nullptr;
  (*d)->cuCtxGetCurrent_(&current);
  // A module belongs to a context: one per (context, image, kernel), loaded on first launch and
  // kept for the life of the process, like the runtime's registered kernels.
  static std::mutex mu;
  static auto* functions =
      new std::map<std::tuple<CUcontext, const unsigned char*, std::string>, CUfunction>;
  static auto* modules = new std::map<std::pair<CUcontext, const unsigned char*>, CUmodule>;
  CUfunction function = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(current, image.data, std::string(kernel));
    auto it = functions->find(key);
    if (it != functions->end()) {
      function = it->second;
    } else {
      CUmodule& module = (*modules)[{current, image.data}];
      if (module == nullptr) {
        const absl::Status loaded =
            Check(**d, (*d)->cuModuleLoadData_(&module, image.data), "cuModuleLoadData",
                  absl::StrCat("loading the kernels of ", image.name,
                               " (does the image hold code for this GPU's architecture?)")
                      .c_str());
        if (!loaded.ok()) {
          modules->erase({current, image.data});
          return loaded;
        }
      }
      const absl::Status found =
          Check(**d, (*d)->cuModuleGetFunction_(&function, module, kernel), "cuModuleGetFunction",
                absl::StrCat("kernel ", kernel, " of ", image.name).c_str());
      if (!found.ok()) return found;
      functions->emplace(key, function);
    }
  }
  return Check(**d,
               (*d)->cuLaunchKernel_(function, grid, 1, 1, block, 1, 1, 0, nullptr, args, nullptr),
               "cuLaunchKernel", absl::StrCat("launching ", kernel).c_str());
}

}  // namespace plexus::base::cuda
