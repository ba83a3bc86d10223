// A spin-wait hint that lets the sibling hyper-thread (or the other vCPU's host core) run.
#pragma once

namespace plexus::transport::internal {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace plexus::transport::internal
