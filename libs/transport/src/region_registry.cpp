#include "region_registry.hpp"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "cuda_copy.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::internal {

class RegisteredRegion final : public MemoryRegion {
 public:
  RegisteredRegion(std::shared_ptr<RegionRegistry> registry, void* data, size_t size,
                   MemoryKind kind, RegionHandle handle)
      : MemoryRegion(data, size, kind, handle), registry_(std::move(registry)) {}
  ~RegisteredRegion() override { registry_->Remove(handle().id); }

 private:
  std::shared_ptr<RegionRegistry> registry_;
};

absl::StatusOr<std::unique_ptr<MemoryRegion>> RegionRegistry::Register(void* data, size_t bytes,
                                                                       MemoryKind kind) {
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError("Register: null pointer with a non-zero size");
  }
  if (kind == MemoryKind::kCuda) {
    PLEXUS_RETURN_IF_ERROR(CheckCudaPointer(data));
  }
  static thread_local absl::BitGen gen;
  RegionHandle handle;
  handle.backend = backend_;
  handle.kind = kind;
  handle.address = reinterpret_cast<uintptr_t>(data);
  handle.length = bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Random ids: a stale handle from an earlier registration (or another process) is rejected
    // instead of silently writing into whatever reuses the slot.
    do {
      handle.id = absl::Uniform<uint64_t>(gen);
    } while (handle.id == 0 || regions_.contains(handle.id));
    regions_[handle.id] = Entry{static_cast<uint8_t*>(data), bytes, kind};
  }
  return std::make_unique<RegisteredRegion>(shared_from_this(), data, bytes, kind, handle);
}

absl::StatusOr<WriteTarget> RegionRegistry::Resolve(uint64_t id, uint64_t offset,
                                                    uint64_t length) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("one-sided write to unknown region id ", id, " (not registered here)"));
  }
  const Entry& e = it->second;
  if (offset > e.size || length > e.size - offset) {
    return absl::OutOfRangeError(absl::StrCat("one-sided write of ", length, " bytes at offset ",
                                              offset, " exceeds region of ", e.size, " bytes"));
  }
  return WriteTarget{e.data + offset, e.kind};
}

void RegionRegistry::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(id);
}

absl::Status CheckLocalRange(const MemoryRegion& region, size_t offset, size_t length) {
  if (offset > region.size() || length > region.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("local range [", offset, ", +", length,
                                              ") exceeds region of ", region.size(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::internal
