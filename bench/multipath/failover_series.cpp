#include "failover_series.hpp"

#include <linux/mptcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "plexus/base/file.hpp"
#include "plexus/base/status.hpp"
#include "sockets.hpp"

#ifndef SOL_MPTCP
#define SOL_MPTCP 284
#endif

namespace plexus::mpbench {

namespace nb = plexus::netbed;

absl::Duration LongestGap(const std::vector<Delivery>& deliveries, absl::Time t0, absl::Time t1) {
  absl::Duration gap = absl::ZeroDuration();
  absl::Time last = t0;
  for (const Delivery& d : deliveries) {
    if (d.at < t0) continue;
    if (d.at > t1) break;
    gap = std::max(gap, d.at - last);
    last = d.at;
  }
  return std::max(gap, t1 - last);
}

std::vector<Delivery> MessageDeliveries(const std::vector<Delivery>& deliveries,
                                        uint64_t message_bytes) {
  std::vector<Delivery> messages;
  uint64_t total = 0;
  for (const Delivery& d : deliveries) {
    const uint64_t before = total / message_bytes;
    total += d.bytes;
    for (uint64_t m = before; m < total / message_bytes; ++m) {
      messages.push_back({d.at, message_bytes});
    }
  }
  return messages;
}

double GoodputMbit(const std::vector<Delivery>& deliveries, absl::Time t0, absl::Time t1) {
  uint64_t bytes = 0;
  for (const Delivery& d : deliveries) {
    if (d.at >= t0 && d.at <= t1) bytes += d.bytes;
  }
  const double seconds = absl::ToDoubleSeconds(t1 - t0);
  return seconds <= 0 ? 0 : static_cast<double>(bytes) * 8 / seconds / 1e6;
}

namespace {

// The stream is the 64-bit counters 0, 1, 2, ... in memory order: byte o of the stream is byte
// o % 8 of counter o / 8.
uint8_t StreamByte(uint64_t offset) {
  const uint64_t word = offset / 8;
  uint8_t bytes[8];
  std::memcpy(bytes, &word, 8);
  return bytes[offset % 8];
}

// Bytes of `data` (stream offset `offset`) that differ from the stream.
uint64_t CountCorrupt(const char* data, size_t n, uint64_t offset) {
  uint64_t bad = 0;
  size_t i = 0;
  for (; i < n && (offset + i) % 8 != 0; ++i)
    bad += static_cast<uint8_t>(data[i]) != StreamByte(offset + i);
  for (; i + 8 <= n; i += 8) {
    uint64_t got = 0;
    const uint64_t want = (offset + i) / 8;
    std::memcpy(&got, data + i, 8);
    if (got != want) {
      for (size_t j = 0; j < 8; ++j) {
        bad += static_cast<uint8_t>(data[i + j]) != StreamByte(offset + i + j);
      }
    }
  }
  for (; i < n; ++i) bad += static_cast<uint8_t>(data[i]) != StreamByte(offset + i);
  return bad;
}

// Established subflows besides the initial one (MPTCP_INFO), -1 when unknown.
int MptcpSubflows(int fd) {
  mptcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, SOL_MPTCP, MPTCP_INFO, &info, &len) != 0) return -1;
  return info.mptcpi_subflows;
}

bool Retry(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

struct Fds {
  int listener = -1, client = -1, server = -1;
  ~Fds() {
    for (int fd : {client, server, listener}) {
      if (fd >= 0) close(fd);
    }
  }
};

}  // namespace

absl::StatusOr<MptcpResult> MptcpStream(nb::Bed& bed, double seconds,
                                        const std::function<void()>& event, double event_at,
                                        absl::Duration drain) {
  Fds fds;
  int port = 0;
  PLEXUS_RETURN_IF_ERROR(nb::InNetns(bed.ns('b'), [&]() -> absl::Status {
    PLEXUS_ASSIGN_OR_RETURN(fds.listener, ListenOn(nb::Bed::Address('b', 1), IPPROTO_MPTCP, &port));
    return absl::OkStatus();
  }));
  PLEXUS_RETURN_IF_ERROR(nb::InNetns(bed.ns('a'), [&]() -> absl::Status {
    PLEXUS_ASSIGN_OR_RETURN(fds.client, ConnectFrom(nb::Bed::Address('a', 1),
                                                    nb::Bed::Address('b', 1), port, IPPROTO_MPTCP));
    return absl::OkStatus();
  }));
  // The listener stays open while the stream runs: the subflows join through it.
  fds.server = accept(fds.listener, nullptr, nullptr);
  if (fds.server < 0) {
    return absl::UnavailableError(absl::StrCat("MPTCP accept on ", nb::Bed::Address('b', 1), ":",
                                               port, ": ", std::strerror(errno)));
  }
  // Short socket timeouts so both threads notice the end of the window even on a stalled
  // connection.
  const timeval tv{0, 100000};
  setsockopt(fds.client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fds.server, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

  MptcpResult result;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> drain_deadline_ns{INT64_MAX};
  std::string send_error, recv_error;
  std::thread sender([&] {
    constexpr size_t kWords = (size_t{1} << 20) / 8;
    std::vector<uint64_t> words(kWords);
    uint64_t sent = 0;
    while (!stop.load()) {
      const uint64_t first = sent / 8;
      for (size_t i = 0; i < kWords; ++i) words[i] = first + i;
      const size_t skip = sent % 8;
      const ssize_t n = send(fds.client, reinterpret_cast<const char*>(words.data()) + skip,
                             kWords * 8 - skip, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<uint64_t>(n);
      } else if (n < 0 && !Retry(errno)) {
        send_error = absl::StrCat("MPTCP send: ", std::strerror(errno));
        break;
      }
    }
    result.sent = sent;
    shutdown(fds.client, SHUT_WR);  // the receiver drains to EOF
  });
  std::thread receiver([&] {
    std::vector<char> buf(size_t{1} << 20);
    uint64_t got = 0;
    for (;;) {
      const ssize_t n = recv(fds.server, buf.data(), buf.size(), 0);
      if (n > 0) {
        result.deliveries.push_back({absl::Now(), static_cast<uint64_t>(n)});
        result.corrupt_bytes += CountCorrupt(buf.data(), static_cast<size_t>(n), got);
        got += static_cast<uint64_t>(n);
      } else if (n == 0) {
        result.drained = true;
        break;
      } else if (!Retry(errno)) {
        recv_error = absl::StrCat("MPTCP recv: ", std::strerror(errno));
        break;
      } else if (absl::ToUnixNanos(absl::Now()) > drain_deadline_ns.load()) {
        break;
      }
    }
    result.received = got;
  });
  absl::SleepFor(absl::Milliseconds(700));  // slow start, subflows joining
  result.window_start = absl::Now();
  if (event) {
    absl::SleepFor(absl::Seconds(event_at));
    result.subflows_before_event = MptcpSubflows(fds.client);
    event();
    absl::SleepFor(absl::Seconds(seconds - event_at));
  } else {
    absl::SleepFor(absl::Seconds(seconds));
  }
  result.window_end = absl::Now();
  result.subflows_at_end = MptcpSubflows(fds.client);
  drain_deadline_ns = absl::ToUnixNanos(absl::Now() + drain);
  stop = true;
  sender.join();
  receiver.join();
  result.error = send_error.empty() ? recv_error : send_error;
  result.longest_gap = LongestGap(result.deliveries, result.window_start, result.window_end);
  result.mbit = GoodputMbit(result.deliveries, result.window_start, result.window_end);
  return result;
}

absl::StatusOr<std::vector<uint64_t>> ReadRxBytes(const std::string& ns, const std::string& prefix,
                                                  size_t paths) {
  const std::string file = "/proc/thread-self/net/dev";  // the reading thread's namespace
  std::string text;
  PLEXUS_RETURN_IF_ERROR(nb::InNetns(ns, [&]() -> absl::Status {
    PLEXUS_ASSIGN_OR_RETURN(text, base::ReadFile(file));
    return absl::OkStatus();
  }));
  std::vector<uint64_t> rx(paths, 0);
  std::vector<bool> seen(paths, false);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
    if (!absl::ConsumePrefix(&name, prefix)) continue;
    size_t k = 0;
    if (!absl::SimpleAtoi(name, &k) || k < 1 || k > paths) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
    if (fields.empty() || !absl::SimpleAtoi(fields[0], &rx[k - 1])) {
      return absl::DataLossError(
          absl::StrCat(file, " in namespace ", ns, ": unreadable line '", std::string(line), "'"));
    }
    seen[k - 1] = true;
  }
  for (size_t k = 1; k <= paths; ++k) {
    if (!seen[k - 1]) {
      return absl::NotFoundError(
          absl::StrCat("no interface ", prefix, k, " in ", file, " of namespace ", ns));
    }
  }
  return rx;
}

absl::StatusOr<std::unique_ptr<WireSampler>> WireSampler::Start(const nb::Bed& bed,
                                                                absl::Duration interval) {
  std::unique_ptr<WireSampler> s(new WireSampler());
  s->ns_ = bed.ns('b');
  s->paths_ = bed.paths();
  PLEXUS_ASSIGN_OR_RETURN(std::vector<uint64_t> first, ReadRxBytes(s->ns_, "mpb", s->paths_));
  s->samples_.push_back({absl::Now(), std::move(first)});
  WireSampler* self = s.get();
  s->thread_ = std::thread([self, interval] {
    absl::Time next = absl::Now() + interval;
    while (!self->stop_.load()) {
      absl::SleepFor(next - absl::Now());
      next += interval;
      auto rx = ReadRxBytes(self->ns_, "mpb", self->paths_);
      const absl::Time at = absl::Now();
      absl::MutexLock lock(&self->mu_);
      if (!rx.ok()) {
        if (self->error_.ok()) self->error_ = rx.status();
        continue;
      }
      self->samples_.push_back({at, std::move(*rx)});
    }
  });
  return s;
}

WireSampler::~WireSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::vector<WireSampler::Sample>> WireSampler::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  PLEXUS_RETURN_IF_ERROR(error_);
  return std::move(samples_);
}

std::vector<TimelinePoint> Timeline(const std::vector<WireSampler::Sample>& samples,
                                    const std::vector<Delivery>& deliveries, absl::Time start,
                                    absl::Time end) {
  std::vector<TimelinePoint> points;
  size_t d = 0;
  for (size_t i = 1; i < samples.size(); ++i) {
    const WireSampler::Sample& a = samples[i - 1];
    const WireSampler::Sample& b = samples[i];
    uint64_t goodput = 0;
    for (; d < deliveries.size() && deliveries[d].at <= b.at; ++d) {
      if (deliveries[d].at > a.at) goodput += deliveries[d].bytes;
    }
    if (a.at < start || b.at > end) continue;
    const double dt = absl::ToDoubleSeconds(b.at - a.at);
    if (dt <= 0) continue;
    TimelinePoint p;
    p.t_s = absl::ToDoubleSeconds(b.at - start);
    for (size_t k = 0; k < b.rx_bytes.size(); ++k) {
      p.path_mbit.push_back(static_cast<double>(b.rx_bytes[k] - a.rx_bytes[k]) * 8 / dt / 1e6);
    }
    p.goodput_mbit = static_cast<double>(goodput) * 8 / dt / 1e6;
    points.push_back(std::move(p));
  }
  return points;
}

}  // namespace plexus::mpbench
