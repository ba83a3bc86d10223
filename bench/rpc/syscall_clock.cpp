// libplexus_syscall_clock.so: preloaded (LD_PRELOAD) into a benchmark peer, it splits the peer's
// time into the time inside its socket system calls and the time between them, on the thread that
// made them. With both peers of a ping-pong on one CPU, the time between a thread's calls is the
// user-space work of that side per round trip (a blocking call holds everything the kernel does,
// the other peer's turn included), so the latency over a raw ping-pong splits into user space and
// kernel, per side, without a profiler's distortion.
//
// It wraps the libc entry points of socket I/O (send, sendto, sendmsg, write, writev, recv,
// recvfrom, recvmsg, read, readv): a peer that blocks anywhere else (a futex handing work to
// another thread, an epoll wait) has that time counted as user space, so the split is meant for
// peers that make their calls on one thread, each of them blocking in its receive. Gaps of 1 ms or
// more (set-up, the warm-up's end) are not counted. The time stamps are the CPU's time-stamp
// counter, converted with the monotonic clock over the whole run.
//
// PLEXUS_SYSCALL_CLOCK_OUT names the file written (rewritten in place every 1024 sends and at
// exit): one line "sends=N syscalls=N user_ns=U kernel_ns=K", where U and K are sums over the
// counted calls.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

// Added to with a plain load and store, no locked instruction (which would cost each call tens of
// cycles the peers do not spend): calls made at the same time by two threads may lose a count.
std::atomic<uint64_t> sends{0}, syscalls{0}, user_ticks{0}, kernel_ticks{0};

inline uint64_t Add(std::atomic<uint64_t>& counter, uint64_t d) {
  const uint64_t v = counter.load(std::memory_order_relaxed) + d;
  counter.store(v, std::memory_order_relaxed);
  return v;
}
uint64_t start_ticks = 0;
timespec start_time{};
// initial-exec: no __tls_get_addr call per system call (this library is preloaded, so it is loaded
// with the program and has its static TLS block).
__attribute__((tls_model("initial-exec"))) thread_local uint64_t last_exit = 0;

// The time-stamp counter where there is one (a few ns to read), else the monotonic clock in ns.
inline uint64_t Ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
#endif
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

void Dump() {
  // Opened once (thread-safe static) and rewritten in place with fixed-width numbers, so that a
  // report is one system call. Raw system calls: the wrapped write() must not count its reports.
  static const long fd = [] {
    const char* path = std::getenv("PLEXUS_SYSCALL_CLOCK_OUT");
    if (path == nullptr) return -1L;
    return syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }();
  if (fd < 0) return;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const double seconds = static_cast<double>(now.tv_sec - start_time.tv_sec) +
                         static_cast<double>(now.tv_nsec - start_time.tv_nsec) * 1e-9;
  const uint64_t ticks = Ticks() - start_ticks;
  if (seconds <= 0 || ticks == 0) return;
  const double ns_per_tick = seconds * 1e9 / static_cast<double>(ticks);
  char line[160];
  const int n = std::snprintf(
      line, sizeof line, "sends=%020llu syscalls=%020llu user_ns=%020.0f kernel_ns=%020.0f\n",
      static_cast<unsigned long long>(sends.load(std::memory_order_relaxed)),
      static_cast<unsigned long long>(syscalls.load(std::memory_order_relaxed)),
      static_cast<double>(user_ticks.load(std::memory_order_relaxed)) * ns_per_tick,
      static_cast<double>(kernel_ticks.load(std::memory_order_relaxed)) * ns_per_tick);
  if (n > 0) (void)syscall(SYS_pwrite64, fd, line, static_cast<size_t>(n), 0);
}

// Times one call: the gap since this thread's last call returned is user space, the call itself
// the kernel's (and the other peer's, when it blocks).
template <typename Call>
auto Timed(bool is_send, Call call) {
  const uint64_t t0 = Ticks();
  const auto r = call();
  const uint64_t t1 = Ticks();
  constexpr uint64_t kMaxGapTicks = uint64_t{1} << 21;  // ~1 ms at 2 GHz: longer is no call's work
  if (last_exit != 0 && t0 - last_exit < kMaxGapTicks) {
    Add(user_ticks, t0 - last_exit);
    Add(kernel_ticks, t1 - t0);
  }
  last_exit = t1;
  Add(syscalls, 1);
  if (is_send && Add(sends, 1) % 1024 == 0) {
    const int saved = errno;  // the caller reads the wrapped call's errno
    Dump();
    errno = saved;
  }
  return r;
}

__attribute__((constructor)) void Start() {
  clock_gettime(CLOCK_MONOTONIC, &start_time);
  start_ticks = Ticks();
}

__attribute__((destructor)) void Stop() { Dump(); }

}  // namespace

extern "C" {

ssize_t send(int fd, const void* buf, size_t n, int flags) {
  static auto next = Next<ssize_t (*)(int, const void*, size_t, int)>("send");
  return Timed(true, [&] { return next(fd, buf, n, flags); });
}
ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* to, socklen_t len) {
  static auto next =
      Next<ssize_t (*)(int, const void*, size_t, int, const sockaddr*, socklen_t)>("sendto");
  return Timed(true, [&] { return next(fd, buf, n, flags, to, len); });
}
ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  static auto next = Next<ssize_t (*)(int, const msghdr*, int)>("sendmsg");
  return Timed(true, [&] { return next(fd, msg, flags); });
}
ssize_t write(int fd, const void* buf, size_t n) {
  static auto next = Next<ssize_t (*)(int, const void*, size_t)>("write");
  return Timed(true, [&] { return next(fd, buf, n); });
}
ssize_t writev(int fd, const iovec* iov, int count) {
  static auto next = Next<ssize_t (*)(int, const iovec*, int)>("writev");
  return Timed(true, [&] { return next(fd, iov, count); });
}
ssize_t recv(int fd, void* buf, size_t n, int flags) {
  static auto next = Next<ssize_t (*)(int, void*, size_t, int)>("recv");
  return Timed(false, [&] { return next(fd, buf, n, flags); });
}
ssize_t recvfrom(int fd, void* buf, size_t n, int flags, sockaddr* from, socklen_t* len) {
  static auto next = Next<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)>("recvfrom");
  return Timed(false, [&] { return next(fd, buf, n, flags, from, len); });
}
ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  static auto next = Next<ssize_t (*)(int, msghdr*, int)>("recvmsg");
  return Timed(false, [&] { return next(fd, msg, flags); });
}
ssize_t read(int fd, void* buf, size_t n) {
  static auto next = Next<ssize_t (*)(int, void*, size_t)>("read");
  return Timed(false, [&] { return next(fd, buf, n); });
}
ssize_t readv(int fd, const iovec* iov, int count) {
  static auto next = Next<ssize_t (*)(int, const iovec*, int)>("readv");
  return Timed(false, [&] { return next(fd, iov, count); });
}

}  // extern "C"
