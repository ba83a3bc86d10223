#include "peer.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"

namespace plexus::benchrpc {

void AddPeerOptions(CLI::App* app, PeerArgs* a) {
  app->add_option("--role", a->role, "run one side of a measurement (used by the orchestrator)")
      ->group("");
  tooling::AddNumber(app, "--cpu", &a->cpu, "pin to this CPU (-1: not pinned)", -1, 4095)
      ->group("");
  app->add_option("--address", a->address, "the server's address")->group("");
  app->add_option("--mode", a->mode, "latency or rate")
      ->check(CLI::IsMember({"latency", "rate"}))
      ->group("");
  tooling::AddNumber(app, "--size", &a->size, "request payload bytes", 0u, 1u << 24)->group("");
  tooling::AddNumber(app, "--reply", &a->reply, "reply payload bytes", 0u, 1u << 24)->group("");
  tooling::AddNumber(app, "--inflight", &a->inflight, "calls in flight", 1, 4096)->group("");
  tooling::AddNumber(app, "--seconds", &a->seconds, "measured seconds per run", 0.05, 600.0);
  tooling::AddNumber(app, "--deny-percent", &a->deny_percent, "share of denied requests", 0.0,
                     100.0)
      ->group("");
  tooling::AddNumber(app, "--spin-us", &a->spin_us,
                     "raw TCP peers: poll before blocking, microseconds", 0.0, 1e6)
      ->group("");
}

void BlockTermSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WaitForTermSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
}

void PublishAddress(std::string_view address) {
  std::printf("address %.*s\n", static_cast<int>(address.size()), address.data());
  std::fflush(stdout);
}

bool Denied(uint64_t i, double percent) {
  if (percent <= 0) return false;
  const uint64_t every = static_cast<uint64_t>(100.0 / percent);
  return every <= 1 || i % every == 0;
}

std::string RequestPayload(uint32_t size) {
  std::string p(size, '\0');
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<char>(j % 251);
  return p;
}

bool PayloadMatches(const void* data, size_t size) {
  // Compared with memcmp against the pattern (byte j is j % 251), so that the check costs every
  // server a few dozen instructions, not one division per byte: the servers' own work is what the
  // latency figures compare.
  constexpr size_t kWhole = 4096, kEdge = 64;
  static const std::string pattern = RequestPayload(kWhole + 251);
  const auto* b = static_cast<const uint8_t*>(data);
  auto range_ok = [&](size_t lo, size_t hi) {
    return std::memcmp(b + lo, pattern.data() + lo % 251, hi - lo) == 0;
  };
  return size <= kWhole ? range_ok(0, size) : range_ok(0, kEdge) && range_ok(size - kEdge, size);
}

bool ReplyMatches(const void* data, size_t size, uint32_t request_bytes, uint32_t reply_bytes) {
  const size_t n = std::min(request_bytes, reply_bytes);
  return size >= n && PayloadMatches(data, n);
}

void PrintResult(ClientResult r) {
  double median = 0, p99 = 0;
  if (!r.latency_us.empty()) {
    std::sort(r.latency_us.begin(), r.latency_us.end());
    median = r.latency_us[r.latency_us.size() / 2];
    p99 = r.latency_us[std::min(r.latency_us.size() - 1, r.latency_us.size() * 99 / 100)];
  }
  const double s = std::max(r.seconds, 1e-9);
  std::string line = absl::StrFormat(
      "result ok=%d failed=%d wrong=%d seconds=%.6f rate=%.3f goodput=%.6f median_us=%.3f "
      "p99_us=%.3f",
      r.ok, r.failed, r.wrong, r.seconds, static_cast<double>(r.ok) / s,
      static_cast<double>(r.bytes) / s / 1e9, median, p99);
  if (r.base_rate >= 0) line += absl::StrFormat(" base_rate=%.3f", r.base_rate);
  if (std::isfinite(r.pair_cost)) line += absl::StrFormat(" pair_cost=%.6f", r.pair_cost);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Phases::Phases(double seconds) {
  const auto now = Clock::now();
  begin_ =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds / 5));
  end_ =
      begin_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double Phases::seconds() const { return std::chrono::duration<double>(end_ - begin_).count(); }

}  // namespace plexus::benchrpc
