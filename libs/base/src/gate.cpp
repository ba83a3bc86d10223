#include "plexus/base/gate.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace plexus::base {
namespace {

// Gates a thread can be inside at once without falling back to the shared counter.
constexpr int kDepth = 8;

// A thread's announcement of the gates it is inside. Only its thread writes it; closers read it.
struct Record {
  std::atomic<const Gate*> inside[kDepth] = {};
  int depth = 0;     // entries in `inside` (the owner's bookkeeping)
  int overflow = 0;  // entries counted in the gates' overflow counters instead
};

struct Registry {
  std::mutex mu;
  std::vector<Record*> records;
};
// Never destroyed: threads may exit (and unregister) after static destruction began.
Registry& Records() {
  static Registry* r = new Registry;
  return *r;
}

thread_local Record* tls_record = nullptr;
thread_local bool tls_exited = false;

struct Holder {
  Record record;
  Holder() {
    std::lock_guard<std::mutex> lock(Records().mu);
    Records().records.push_back(&record);
  }
  ~Holder() {
    std::lock_guard<std::mutex> lock(Records().mu);
    auto& v = Records().records;
    v.erase(std::remove(v.begin(), v.end(), &record), v.end());
    tls_record = nullptr;
    tls_exited = true;
  }
};

// This thread's record; null while the thread is exiting (its entries then use the counter).
Record* ThisThread() {
  if (tls_record != nullptr || tls_exited) return tls_record;
  thread_local Holder holder;
  tls_record = &holder.record;
  return tls_record;
}

enum Mode : int { kUnset = 0, kMembarrier = 1, kFence = 2 };
std::atomic<int> g_mode{kUnset};
int g_detected = kUnset;  // what the kernel allows, written once under the once_flag

long Membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

int InitMode() {
  static std::once_flag once;
  std::call_once(once, [] {
    const long cmds = Membarrier(MEMBARRIER_CMD_QUERY);
    const bool ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
                    Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    g_detected = ok ? kMembarrier : kFence;
    int expected = kUnset;
    g_mode.compare_exchange_strong(expected, g_detected);
  });
  return g_mode.load();
}

int ModeNow() {
  const int m = g_mode.load(std::memory_order_relaxed);
  return m != kUnset ? m : InitMode();
}

// Every thread of the process executes a full memory barrier before this returns.
void BarrierOnEveryThread() {
  if (Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // A forked child may need its own registration.
  if (Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    return;
  }
  if (Membarrier(MEMBARRIER_CMD_GLOBAL) == 0) return;  // slower, needs no registration
  // Passing threads did not fence, and nothing else makes their entries visible: continuing could
  // change what they are using under them.
  std::fprintf(stderr, "plexus::base::Gate: membarrier failed after it was registered (%s)\n",
               std::strerror(errno));
  std::abort();
}

}  // namespace

bool Gate::PassersFence() { return ModeNow() == kFence; }

void Gate::ForcePassersFenceForTesting(bool fence) {
  ModeNow();  // detects (and registers) first; false goes back to what the kernel allows
  g_mode.store(fence ? kFence : g_detected);
}

bool Gate::TryEnter() {
  Record* r = ThisThread();
  if (r == nullptr || r->depth == kDepth) {
    overflow_.fetch_add(1);
    if (!closed_.load()) {
      if (r != nullptr) ++r->overflow;
      return true;
    }
    if (overflow_.fetch_sub(1) == 1) WakeCloser();
    return false;
  }
  std::atomic<const Gate*>& entry = r->inside[r->depth];
  if (ModeNow() == kFence) {
    entry.store(this, std::memory_order_seq_cst);
  } else {
    // The closer's membarrier orders this store before the load below on this CPU.
    entry.store(this, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  if (closed_.load()) {
    entry.store(nullptr, std::memory_order_release);
    WakeCloser();
    return false;
  }
  ++r->depth;
  return true;
}

void Gate::Enter() {
  if (TryEnter()) return;
  EnterClosed();
}

// Out of line: its lock and wait would give every pass through an open gate a stack frame.
void Gate::EnterClosed() {
  do {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !closed_.load(); });
  } while (!TryEnter());
}

void Gate::Leave() {
  Record* r = tls_record;
  if (r == nullptr || r->overflow > 0) {
    if (r != nullptr) --r->overflow;
    if (overflow_.fetch_sub(1) == 1 && closed_.load()) WakeCloser();
    return;
  }
  --r->depth;
  r->inside[r->depth].store(nullptr, std::memory_order_release);
  // A closer that missed this wake-up finds the entry gone at its next poll (1 ms).
  if (closed_.load(std::memory_order_relaxed)) WakeCloser();
}

void Gate::WakeCloser() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

bool Gate::AnyoneInside() const {
  if (overflow_.load() != 0) return true;
  std::lock_guard<std::mutex> lock(Records().mu);
  for (const Record* r : Records().records) {
    for (const auto& entry : r->inside) {
      if (entry.load(std::memory_order_acquire) == this) return true;
    }
  }
  return false;
}

void Gate::Close() {
  close_mu_.lock();
  closed_.store(true);
  if (ModeNow() == kMembarrier) BarrierOnEveryThread();
  std::unique_lock<std::mutex> lock(mu_);
  // Leave wakes the closer; the poll covers a wake-up it could not see (fence mode).
  while (AnyoneInside()) cv_.wait_for(lock, std::chrono::milliseconds(1));
}

void Gate::Open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(false);
  }
  cv_.notify_all();
  close_mu_.unlock();
}

}  // namespace plexus::base
