// plexus-bench-pull: what it costs one process to copy another's block, the step that bounds an
// out-of-place AllGather between two processes of one host. Two processes, one per CPU, do at the
// same time what each rank of that AllGather does: copy their own block into a private output,
// then the peer's block next to it. The peer's block is read three ways:
//   memcpy     from a shared mapping (what a single copy costs when both processes map the pages),
//   ring       through shared memory, as a ring moves it: each process copies its own block in,
//              then the peer's out (two copies per process, the second of bytes the other CPU
//              has just written; the time between them, waiting for the peer, is not counted),
//   pull-4k    with process_vm_readv from the peer's private 4 KiB pages (what the shm transport
//              and Open MPI's vader do with a user's malloc'd buffer),
//   pull-thp   the same from private pages the peer asked to be transparent huge pages
//              (MADV_HUGEPAGE; whether the kernel granted them is reported).
// Figures: each way's median time to bring the peer's block (the slower process's median; for the
// ring, both of its copies), the own copy's, and each way over memcpy.
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/base/env.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "stats.hpp"

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr int kMaxIters = 4096;
constexpr auto kPeerTimeout = std::chrono::seconds(10);
constexpr size_t kFrameBytes = size_t{512} << 10;  // the shm ring's largest frame payload

// What the two processes share: a barrier, each one's pid and private block, and their results.
struct Control {
  std::atomic<uint64_t> arrived[2];
  pid_t pid[2];
  uintptr_t block[2];  // the private block pulled by the peer
  uint64_t huge_kib[2];
  double own_us[2][kMaxIters];
  double peer_us[2][kMaxIters];
  std::atomic<int> failed;
  std::atomic<int> denied_errno;  // process_vm_readv not permitted here (EPERM, ENOSYS)
};

using plexus::bench::Median;

double Us(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The AnonHugePages of the mapping that holds `p` (/proc/self/smaps), in KiB.
uint64_t HugeKib(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > 8) {
      in = addr >= lo && addr < hi;
    } else if (in && line.rfind("AnonHugePages:", 0) == 0) {
      return std::strtoull(line.c_str() + 14, nullptr, 10);
    }
  }
  return 0;
}

// One process's part: `iters` rounds of (barrier, own copy, peer copy).
void Rank(int r, const std::string& way, size_t bytes, int iters, Control* c, char* shared) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(r % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
  sched_setaffinity(0, sizeof set, &set);
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY);  // no effect without Yama
  // The private block: 4 KiB pages, or aligned and asking for huge pages.
  const size_t span = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;
  void* map = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    c->failed = 1;
    return;
  }
  char* own =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(map) + kHuge - 1) & ~(kHuge - 1));
  madvise(own, bytes, way == "pull-thp" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(own, 1 + r, bytes);
  std::vector<char> out(2 * bytes, 0);
  c->pid[r] = getpid();
  c->block[r] = reinterpret_cast<uintptr_t>(way == "memcpy" ? shared + r * bytes : own);
  c->huge_kib[r] = HugeKib(own);
  uint64_t phase = 0;
  // Spins (both processes have a CPU each), yields on a one-CPU host, and gives up when the
  // other process has not arrived within kPeerTimeout (it died, or never started).
  const bool one_cpu = sysconf(_SC_NPROCESSORS_ONLN) < 2;
  auto barrier = [&] {
    ++phase;
    c->arrived[r].store(phase);
    const auto deadline = std::chrono::steady_clock::now() + kPeerTimeout;
    for (uint64_t spins = 0; c->arrived[1 - r].load() < phase && c->failed.load() == 0; ++spins) {
      if (one_cpu) sched_yield();
      if (spins % 4096 == 0 && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "plexus-bench-pull: process %d: the other process did not arrive\n",
                     r);
        c->failed = 1;
      }
    }
  };
  barrier();  // both have published their block
  const char* src = reinterpret_cast<const char*>(c->block[r]);
  for (int i = 0; i < iters && c->failed.load() == 0; ++i) {
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(out.data() + r * bytes, src, bytes);
    const auto t1 = std::chrono::steady_clock::now();
    char* dst = out.data() + (1 - r) * bytes;
    double waited = 0;
    if (way == "memcpy") {
      std::memcpy(dst, reinterpret_cast<const char*>(c->block[1 - r]), bytes);
    } else if (way == "ring") {
      // Through shared memory, as a ring moves it: this process writes its block there, then
      // reads the peer's, freshly written by the other CPU (the wait between is not counted).
      // In frames of at most 512 KiB, as the shm transport's ring (one memcpy of 1 MiB or more
      // into memory the other CPU has read runs several times slower here).
      auto framed = [&](char* to, const char* from) {
        for (size_t at = 0; at < bytes; at += kFrameBytes) {
          std::memcpy(to + at, from + at, std::min(kFrameBytes, bytes - at));
        }
      };
      framed(shared + r * bytes, src);
      const auto w0 = std::chrono::steady_clock::now();
      barrier();
      waited = Us(w0, std::chrono::steady_clock::now());
      framed(dst, shared + (1 - r) * bytes);
    } else {
      size_t done = 0;
      while (done < bytes) {
        iovec local{dst + done, bytes - done};
        iovec remote{reinterpret_cast<void*>(c->block[1 - r] + done), bytes - done};
        const ssize_t got = process_vm_readv(c->pid[1 - r], &local, 1, &remote, 1, 0);
        if (got <= 0) {
          const int err = got < 0 ? errno : 0;
          if (err == EPERM || err == ENOSYS || err == EACCES) {
            c->denied_errno = err;  // the parent reports the way as skipped
          } else {
            std::perror("plexus-bench-pull: process_vm_readv");
          }
          c->failed = 1;
          break;
        }
        done += static_cast<size_t>(got);
      }
    }
    const auto t2 = std::chrono::steady_clock::now();
    c->own_us[r][i] = Us(t0, t1);
    c->peer_us[r][i] = Us(t1, t2) - waited;
  }
  // Neither process unmaps its block (or exits) while the other may still be reading it.
  barrier();
  // Every way must have copied the peer's block (filled with 2 - r by the peer).
  const char* got = out.data() + (1 - r) * bytes;
  if (c->failed.load() == 0 &&
      std::any_of(got, got + bytes, [&](char b) { return b != static_cast<char>(2 - r); })) {
    std::fprintf(stderr, "plexus-bench-pull: %s: process %d copied a wrong block\n", way.c_str(),
                 r);
    c->failed = 1;
  }
  munmap(map, span);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int runs = 5, iters = 200;
  std::string bytes_text = "2M";
  plexus::tooling::Tool tool(
      "plexus-bench-pull",
      "Two processes, one per CPU, each copying its own block and then the other's, at once (a "
      "rank of a two-process AllGather): the other's block read with memcpy from a shared "
      "mapping, through shared memory as a ring moves it (two copies), and with "
      "process_vm_readv from 4 KiB pages and from transparent huge pages.");
  CLI::App& app = tool.app();
  plexus::tooling::AddJsonFlag(&app, &json);
  plexus::tooling::AddNumber(&app, "--runs", &runs, "runs per figure (median)", 1, 1000);
  plexus::tooling::AddNumber(&app, "--iters", &iters, "copies per run", 1, kMaxIters);
  app.add_option("--bytes", bytes_text, "the block's size, e.g. 2M (default 2M)");
  if (auto code = tool.Parse(argc, argv)) return *code;
  auto parsed = plexus::base::ParseBytes(bytes_text, "--bytes");
  if (!parsed.ok()) return tool.Usage(std::string(parsed.status().message()));
  const size_t bytes = *parsed;
  if (bytes == 0) return tool.Usage("--bytes must be at least 1");

  void* mem = mmap(nullptr, sizeof(Control) + 2 * bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return tool.Fail(absl::InternalError("mmap of the shared control failed"));
  auto* control = static_cast<Control*>(mem);
  char* shared = static_cast<char*>(mem) + sizeof(Control);
  std::memset(shared, 0, 2 * bytes);
  for (int r = 0; r < 2; ++r) std::memset(shared + r * bytes, 1 + r, bytes);

  plexus::tooling::FigureWriter out("pull", json);
  out.SetCommon({{"runs", runs}, {"iters", iters}, {"bytes", bytes}, {"processes", 2}});
  std::vector<double> memcpy_peer;
  for (const std::string way : {"memcpy", "ring", "pull-4k", "pull-thp"}) {
    std::fprintf(stderr, "plexus-bench-pull: %s\n", way.c_str());
    std::vector<double> peer, own, huge;
    for (int run = 0; run < runs; ++run) {
      new (control) Control{};
      const pid_t child = fork();
      if (child < 0) return tool.Fail(absl::InternalError("fork failed"));
      if (child == 0) {
        Rank(1, way, bytes, iters, control, shared);
        _exit(0);
      }
      Rank(0, way, bytes, iters, control, shared);
      int status = 0;
      waitpid(child, &status, 0);
      if (const int err = control->denied_errno.load(); err != 0) {
        std::fprintf(stderr,
                     "plexus-bench-pull: %s: skipped: process_vm_readv is not permitted "
                     "here (%s)\n",
                     way.c_str(), std::strerror(err));
        peer.clear();
        break;
      }
      if (control->failed.load() != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return tool.Fail(absl::InternalError(absl::StrCat(way, ": a copy failed (see above)")));
      }
      double peer_med = 0, own_med = 0;
      for (int r = 0; r < 2; ++r) {
        peer_med =
            std::max(peer_med,
                     Median(std::vector<double>(control->peer_us[r], control->peer_us[r] + iters)));
        own_med = std::max(
            own_med, Median(std::vector<double>(control->own_us[r], control->own_us[r] + iters)));
      }
      peer.push_back(peer_med);
      own.push_back(own_med);
      huge.push_back(static_cast<double>(std::min(control->huge_kib[0], control->huge_kib[1])));
    }
    if (peer.empty()) continue;  // skipped
    const nlohmann::json extra = {{"way", way}, {"huge_pages_kib", Median(huge)}};
    out.Add({.figure = "peer_copy_us", .value = Median(peer), .unit = "us", .extra = extra});
    out.Add({.figure = "own_copy_us", .value = Median(own), .unit = "us", .extra = extra});
    out.Add({.figure = "peer_copy_gbps",
             .value = static_cast<double>(bytes) / Median(peer) / 1e3,
             .unit = "GB/s",
             .extra = extra});
    if (way == "memcpy") {
      memcpy_peer = peer;
    } else {
      out.Add({.figure = "peer_copy_over_memcpy",
               .value = Median(peer) / Median(memcpy_peer),
               .unit = "ratio",
               .extra = extra});
    }
  }
  if (!json) out.PrintTable();
  return 0;
}
