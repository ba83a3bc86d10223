#include "staging.hpp"

#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_staging.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives::internal {

namespace {
constexpr size_t kMinBuffer = size_t{64} << 10;
}  // namespace

PinnedPool::PinnedPool() : PinnedPool(AllocPinned, FreePinned) {}

PinnedPool::PinnedPool(AllocFn alloc, FreeFn free)
    : alloc_(std::move(alloc)), free_(std::move(free)) {}

PinnedPool::~PinnedPool() {
  for (auto& [capacity, p] : cached_) free_(p);
}

absl::StatusOr<PinnedPool::Buffer> PinnedPool::Acquire(size_t bytes) {
  const size_t capacity = std::bit_ceil(std::max(bytes, kMinBuffer));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cached_.lower_bound(capacity);
    if (it != cached_.end()) {
      Buffer b{it->second, it->first};
      cached_bytes_ -= it->first;
      cached_.erase(it);
      return b;
    }
    ++allocations_;
  }
  void* p = alloc_(capacity);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", capacity, " bytes of pinned host memory to stage a ", bytes,
        "-byte device buffer (cudaMallocHost failed; host memory locked or exhausted)"));
  }
  return Buffer{p, capacity};
}

void PinnedPool::Release(Buffer buffer, size_t max_cached_bytes) {
  if (buffer.data == nullptr) return;
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (buffer.capacity > max_cached_bytes) {
      evicted.push_back(buffer.data);
    } else {
      while (!cached_.empty() && cached_bytes_ + buffer.capacity > max_cached_bytes) {
        cached_bytes_ -= cached_.begin()->first;
        evicted.push_back(cached_.begin()->second);
        cached_.erase(cached_.begin());
      }
      cached_.emplace(buffer.capacity, buffer.data);
      cached_bytes_ += buffer.capacity;
    }
  }
  for (void* p : evicted) free_(p);  // outside the lock: cudaFreeHost synchronises the device
}

size_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

size_t PinnedPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

Staging::~Staging() {
  for (Entry& e : staged_) pool_->Release(e.host, max_cached_);
}

absl::StatusOr<uint8_t*> Staging::In(const void* user, size_t bytes, bool copy_in) {
  if (user == nullptr || !IsDevicePointer(user)) {
    return static_cast<uint8_t*>(const_cast<void*>(user));
  }
  PLEXUS_ASSIGN_OR_RETURN(PinnedPool::Buffer host, pool_->Acquire(bytes));
  staged_.push_back({const_cast<void*>(user), host, bytes});
  if (copy_in) PLEXUS_RETURN_IF_ERROR(CopyDeviceToHost(host.data, user, bytes));
  return static_cast<uint8_t*>(host.data);
}

absl::StatusOr<uint8_t*> Staging::Output(void* user, size_t bytes, bool copy_in) {
  PLEXUS_ASSIGN_OR_RETURN(uint8_t * host, In(user, bytes, copy_in));
  if (host != user) outputs_.push_back(staged_.back());
  return host;
}

absl::Status Staging::CopyOut() {
  for (const Entry& e : outputs_) {
    PLEXUS_RETURN_IF_ERROR(CopyHostToDevice(e.user, e.host.data, e.bytes));
  }
  return absl::OkStatus();
}

}  // namespace plexus::collectives::internal
