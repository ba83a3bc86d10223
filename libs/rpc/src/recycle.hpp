// A bounded free list of per-call objects (the client's call states, the server's calls), handed
// out as shared_ptrs whose deleter gives the object back instead of freeing it. A recycled object
// keeps the capacity of its buffers (the encoded message's gather lists, the frame head, the
// response metadata), so that a call in the steady state allocates only the shared_ptr's control
// block instead of a dozen buffers.
//
// T provides Recycle(): it drops everything the last call held (callbacks, replies, chains) and
// makes the object look new, keeping only capacity. At most `keep` idle objects are kept; more
// are freed, so the list never grows past the largest number of calls that ended together.
// The list belongs to its owner (a server, a channel); an object handed out that comes back after
// the list is gone is freed. (Deleters must not own the list: a recycled object's
// enable_shared_from_this keeps its last control block, and with it the deleter, alive, so a
// deleter holding the list would make the list hold itself.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace plexus::rpc::internal {

template <typename T>
class Recycler : public std::enable_shared_from_this<Recycler<T>> {
 public:
  explicit Recycler(size_t keep) : keep_(keep) {}

  // A new or recycled T, looking new.
  std::shared_ptr<T> Take() {
    std::unique_ptr<T> t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        t = std::move(free_.back());
        free_.pop_back();
        ++reused_;
      }
    }
    if (t == nullptr) t = std::make_unique<T>();
    return std::shared_ptr<T>(t.release(), GiveBack{this->weak_from_this()});
  }

  // For tests: idle objects kept, and how many Take() calls got a recycled one.
  size_t idle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  uint64_t reused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reused_;
  }

 private:
  struct GiveBack {
    std::weak_ptr<Recycler> owner;
    void operator()(T* t) const {
      if (std::shared_ptr<Recycler> list = owner.lock()) {
        list->Give(std::unique_ptr<T>(t));
      } else {
        delete t;
      }
    }
  };

  void Give(std::unique_ptr<T> t) {
    // Outside the lock: dropping what the call held may end other calls (a retried call's
    // attempt holds its outer call's state), which come back here.
    t->Recycle();
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < keep_) free_.push_back(std::move(t));
  }  // Over the bound: `t` is freed here (Recycle left it holding nothing of a call).

  const size_t keep_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<T>> free_;
  uint64_t reused_ = 0;
};

}  // namespace plexus::rpc::internal
