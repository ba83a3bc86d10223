// plexus-bench-transport: bandwidth and ping-pong latency of the tcp and shm backends between two
// processes, side by side with this machine's own references (raw TCP ping-pong, blocking or
// spinning as the Plexus side waits, raw single-stream TCP bulk transfer, single-thread memcpy),
// measured in the same run, every tcp side under the system's congestion control.
//
//   plexus-bench-transport [--json] [--runs N] [--quick] [--test T] [--backend B] [--bytes N]
//
// Each figure is the median over --runs runs; `ratio` is Plexus / reference. With --json, one
// plexus::tooling figure line per figure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "endpoint.hpp"
#include "order.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/transport/device.hpp"
#include "raw_tcp.hpp"
#include "stats.hpp"

namespace pt = plexus::transport;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Args {
  bool json = false;
  int runs = 5;
  bool quick = false;
  std::string test;                              // "", "bandwidth" or "pingpong"
  std::string backend;                           // "", "tcp" or "shm"
  size_t bytes = 0;                              // 0: every size
  absl::Duration spin = absl::Microseconds(50);  // bandwidth waits: spin, then sleep
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "plexus-bench-transport: %s\n", what.c_str());
  std::_Exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrFormat("%s: %s", what, std::string(s.ToString())));
}

void Pin(int cpu) {
  if (cpu >= 0) plexus::bench::PinToCpu(cpu);
}

// Runs `server` in a forked child pinned to `server_cpu` and `client` here pinned to
// `client_cpu`; the server publishes its address through a pipe. Returns the client's figure.
double RunPair(int client_cpu, int server_cpu, const std::function<void(int address_fd)>& server,
               const std::function<double(const std::string& address)>& client) {
  int fds[2];
  if (pipe(fds) != 0) Die("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Pin(server_cpu);
    server(fds[1]);
    std::_Exit(0);
  }
  close(fds[1]);
  Pin(client_cpu);
  char address[256] = {};
  ssize_t n = read(fds[0], address, sizeof address - 1);
  close(fds[0]);
  if (n <= 0) Die("server failed to start");
  const double figure = client(std::string(address, static_cast<size_t>(n)));
  int status = 0;
  waitpid(pid, &status, 0);
  plexus::bench::PinToCpu(-1);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("server process failed");
  return figure;
}

void Publish(int fd, const std::string& address) {
  if (write(fd, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    Die("publish");
  }
  close(fd);
}

// ---- Raw TCP references -------------------------------------------------------------------

int RawListen(int* port) {
  auto fd = plexus::bench::TcpListenLoopback(port);
  Check(fd.status(), "raw listen");
  return *fd;
}

int RawConnect(const std::string& address) {
  auto fd = plexus::bench::TcpConnectLoopback(std::stoi(address));
  Check(fd.status(), "raw connect");
  return *fd;
}

int RawAccept(int listen_fd) {
  auto fd = plexus::bench::TcpAccept(listen_fd);
  Check(fd.status(), "raw accept");
  return *fd;
}

void ReadAll(int fd, void* p, size_t n, absl::Duration spin = absl::ZeroDuration()) {
  Check(plexus::bench::ReadFull(fd, p, n, spin), "raw read");
}
void WriteAll(int fd, const void* p, size_t n) {
  Check(plexus::bench::WriteFull(fd, p, n), "raw write");
}

// Every side's payload is checked: bulk transfers carry byte j = j mod 251 (a prime, so no
// power-of-two period hides a misplaced block) and the receiver checks its buffers after the
// clock stopped; ping-pong messages carry their iteration number, checked both ways.
void FillPattern(std::vector<uint8_t>& buf) {
  for (size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<uint8_t>(j % 251);
}

void CheckPattern(const std::vector<uint8_t>& buf, const char* side) {
  size_t wrong = 0;
  for (size_t j = 0; j < buf.size(); ++j) wrong += buf[j] != static_cast<uint8_t>(j % 251);
  if (wrong > 0)
    Die(absl::StrFormat("%s: %zu of %zu bytes received differ", side, wrong, buf.size()));
}

void PutIteration(char* msg, int i) { std::memcpy(msg, &i, sizeof i); }

void CheckIteration(const char* msg, int i, const char* side) {
  int got = 0;
  std::memcpy(&got, msg, sizeof got);
  if (got != i) Die(absl::StrFormat("%s: message %d carries %d", side, i, got));
}

struct Latency {
  double median_us = 0;
  double p99_us = 0;
};

Latency Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

// `spin`: each read polls that long before it blocks (the reference for a Plexus wait that spins).
Latency RawPingPong(int iters, int client_cpu, int server_cpu,
                    absl::Duration spin = absl::ZeroDuration()) {
  Latency out;
  RunPair(
      client_cpu, server_cpu,
      [&](int pub) {
        int port = 0;
        int lfd = RawListen(&port);
        Publish(pub, std::to_string(port));
        int fd = RawAccept(lfd);
        char req[64], resp[8] = {};
        for (int i = 0; i < iters; ++i) {
          ReadAll(fd, req, sizeof req, spin);
          CheckIteration(req, i, "raw tcp ping-pong server");
          PutIteration(resp, i);
          WriteAll(fd, resp, sizeof resp);
        }
        close(fd);
        close(lfd);
      },
      [&](const std::string& address) {
        int fd = RawConnect(address);
        char req[64] = {}, resp[8];
        std::vector<double> us;
        for (int i = 0; i < iters; ++i) {
          PutIteration(req, i);
          auto t0 = Clock::now();
          WriteAll(fd, req, sizeof req);
          ReadAll(fd, resp, sizeof resp, spin);
          us.push_back(Seconds(Clock::now() - t0) * 1e6);
          CheckIteration(resp, i, "raw tcp ping-pong client");
        }
        close(fd);
        us.erase(us.begin(), us.begin() + iters / 10);  // warm-up
        out = Summarize(us);
        return 0.0;
      });
  return out;
}

double RawBandwidth(size_t bytes, size_t total) {
  const size_t count = std::max<size_t>(1, total / bytes);
  return RunPair(
      -1, -1,
      [&](int pub) {
        std::vector<uint8_t> buf(bytes);
        int port = 0;
        int lfd = RawListen(&port);
        Publish(pub, std::to_string(port));
        int fd = accept(lfd, nullptr, nullptr);
        for (size_t i = 0; i < count; ++i) ReadAll(fd, buf.data(), bytes);
        char ack = 1;
        WriteAll(fd, &ack, 1);
        close(fd);
        close(lfd);
        CheckPattern(buf, "raw tcp bulk receiver");
      },
      [&](const std::string& address) {
        int fd = RawConnect(address);
        std::vector<uint8_t> buf(bytes);
        FillPattern(buf);
        auto t0 = Clock::now();
        for (size_t i = 0; i < count; ++i) WriteAll(fd, buf.data(), bytes);
        char ack;
        ReadAll(fd, &ack, 1);
        const double s = Seconds(Clock::now() - t0);
        close(fd);
        return static_cast<double>(bytes * count) / s / 1e9;
      });
}

double MemcpyBandwidth(size_t bytes, size_t total) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  const size_t count = std::max<size_t>(2, total / bytes);
  std::memcpy(b.data(), a.data(), bytes);
  auto t0 = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(b.data(), a.data(), bytes);
    a[i % bytes] = b[(i * 7) % bytes];
  }
  return static_cast<double>(bytes * count) / Seconds(Clock::now() - t0) / 1e9;
}

// ---- Plexus ---------------------------------------------------------------------------------

using plexus::bench::Endpoint;

Endpoint Serve(pt::Backend backend, int pub) {
  Endpoint e;
  auto dev = pt::Device::Create(plexus::bench::LoopbackDeviceOptions(backend));
  Check(dev.status(), "device");
  e.device = *dev;
  e.cq = e.device->CreateCompletionQueue();
  auto l = e.device->Listen("");
  Check(l.status(), "listen");
  e.listener = *std::move(l);
  Publish(pub, e.listener->address());
  auto c = e.listener->Accept(e.cq.get(), absl::Seconds(30));
  Check(c.status(), "accept");
  e.conn = *std::move(c);
  return e;
}

Endpoint Dial(pt::Backend backend, const std::string& address) {
  Endpoint e;
  auto dev = pt::Device::Create(plexus::bench::LoopbackDeviceOptions(backend));
  Check(dev.status(), "device");
  e.device = *dev;
  e.cq = e.device->CreateCompletionQueue();
  auto c = e.device->Connect(address, e.cq.get());
  Check(c.status(), "connect");
  e.conn = *std::move(c);
  return e;
}

pt::Completion Await(Endpoint& e, absl::Duration spin) {
  auto c = e.cq->Wait(absl::Seconds(60), spin);
  Check(c.status(), "wait");
  Check(c->status, "completion");
  return *c;
}

Latency PlexusPingPong(pt::Backend backend, int iters, int client_cpu, int server_cpu,
                       absl::Duration spin) {
  Latency out;
  RunPair(
      client_cpu, server_cpu,
      [&](int pub) {
        Endpoint e = Serve(backend, pub);
        char req[64], resp[8] = {};
        Check(e.conn->PostRecv({req, sizeof req}, 0), "recv");
        for (int i = 0; i < iters; ++i) {
          for (;;) {  // the request (send completions of earlier responses may come first)
            if (Await(e, spin).opcode == pt::Opcode::kRecv) break;
          }
          CheckIteration(req, i, "plexus ping-pong server");
          // The client received the previous response before it sent this request: the transport
          // is done reading `resp`.
          PutIteration(resp, i);
          Check(e.conn->PostRecv({req, sizeof req}, 0), "recv");
          Check(e.conn->PostSend(pt::ConstBuffer{resp, sizeof resp}, 1), "send");
        }
        while (e.cq->Wait(absl::Milliseconds(200)).ok()) {  // the last send completions
        }
      },
      [&](const std::string& address) {
        Endpoint e = Dial(backend, address);
        char req[64] = {}, resp[8];
        std::vector<double> us;
        for (int i = 0; i < iters; ++i) {
          PutIteration(req, i);
          auto t0 = Clock::now();
          Check(e.conn->PostRecv({resp, sizeof resp}, 0), "recv");
          Check(e.conn->PostSend(pt::ConstBuffer{req, sizeof req}, 1), "send");
          Await(e, spin);
          Await(e, spin);
          us.push_back(Seconds(Clock::now() - t0) * 1e6);
          CheckIteration(resp, i, "plexus ping-pong client");
        }
        us.erase(us.begin(), us.begin() + iters / 10);
        out = Summarize(us);
        return 0.0;
      });
  return out;
}

double PlexusBandwidth(pt::Backend backend, size_t bytes, size_t total, absl::Duration spin) {
  const size_t count = std::max<size_t>(1, total / bytes);
  constexpr size_t kWindow = 4;
  return RunPair(
      -1, -1,
      [&](int pub) {
        // Buffers are allocated and touched before the client is let in and starts its clock.
        std::vector<std::vector<uint8_t>> bufs(kWindow, std::vector<uint8_t>(bytes));
        Endpoint e = Serve(backend, pub);
        size_t posted = 0, done = 0;
        for (; posted < std::min(count, kWindow); ++posted) {
          Check(e.conn->PostRecv({bufs[posted % kWindow].data(), bytes}, posted), "recv");
        }
        while (done < count) {
          Await(e, spin);
          ++done;
          if (posted < count) {
            Check(e.conn->PostRecv({bufs[posted % kWindow].data(), bytes}, posted), "recv");
            ++posted;
          }
        }
        char ack = 1;
        Check(e.conn->PostSend(pt::ConstBuffer{&ack, 1}, 0), "ack");
        Await(e, spin);
        for (size_t b = 0; b < std::min(count, kWindow); ++b) {
          CheckPattern(bufs[b], "plexus bulk receiver");
        }
      },
      [&](const std::string& address) {
        Endpoint e = Dial(backend, address);
        std::vector<uint8_t> buf(bytes);
        FillPattern(buf);
        char ack = 0;
        Check(e.conn->PostRecv({&ack, 1}, 99), "recv");
        auto t0 = Clock::now();
        size_t posted = 0, sent = 0;
        for (; posted < std::min(count, kWindow); ++posted) {
          Check(e.conn->PostSend(pt::ConstBuffer{buf.data(), bytes}, posted), "send");
        }
        bool acked = false;
        while (!acked) {
          pt::Completion c = Await(e, spin);
          if (c.opcode == pt::Opcode::kRecv) {
            acked = true;
          } else if (++sent, posted < count) {
            Check(e.conn->PostSend(pt::ConstBuffer{buf.data(), bytes}, posted), "send");
            ++posted;
          }
        }
        return static_cast<double>(bytes * count) / Seconds(Clock::now() - t0) / 1e9;
      });
}

using plexus::bench::Median;

// A figure's target, in its own unit (the reference of the same run times the claimed ratio):
// met when the value is at least it, or at most it for a time. An upper bound is written as
// "<= x", so that a line says which way its target points.
struct Goal {
  double target;
  bool at_most = false;
};

// The targets the project claims (docs/architecture.md, "Transport benchmarks").
std::optional<Goal> BandwidthGoal(bool shm, size_t bytes, double reference) {
  if (shm && bytes >= (size_t{1} << 20)) return Goal{0.5 * reference};
  if (!shm && bytes >= (size_t{16} << 20)) return Goal{0.9 * reference};
  return std::nullopt;
}

// One figure: bench/figure/value/unit of plexus::tooling's figure lines, plus the fields this
// bench always printed (backend, test, bytes, metric, ratio, reference, mode, runs).
void Emit(plexus::tooling::FigureWriter& out, const Args& args, const std::string& backend,
          const std::string& test, size_t bytes, const std::string& metric, double value,
          const std::string& unit, double ratio, const std::string& reference,
          const std::string& mode, std::optional<Goal> goal = std::nullopt) {
  out.Add({backend + " " + test + " " + metric,
           value,
           unit,
           !goal           ? nlohmann::json(nullptr)
           : goal->at_most ? nlohmann::json(absl::StrFormat("<= %.4g", goal->target))
                           : nlohmann::json(goal->target),
           goal ? std::optional<bool>(goal->at_most ? value <= goal->target : value >= goal->target)
                : std::nullopt,
           {{"backend", backend},
            {"test", test},
            {"bytes", bytes},
            {"metric", metric},
            {"ratio", ratio},
            {"reference", reference},
            {"mode", mode},
            {"runs", args.runs}}});
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  plexus::tooling::Tool tool("plexus-bench-transport",
                             "Bandwidth and ping-pong latency of the tcp and shm backends between "
                             "two processes, next to raw TCP and memcpy measured in the same run.");
  CLI::App& app = tool.app();
  plexus::tooling::AddJsonFlag(&app, &args.json);
  plexus::tooling::AddNumber(&app, "--runs", &args.runs, "runs per figure (median)", 1, 1000);
  app.add_flag("--quick", args.quick, "smaller transfers, one run");
  app.add_option("--test", args.test, "bandwidth or pingpong (default both)")
      ->check(CLI::IsMember({"bandwidth", "pingpong"}));
  app.add_option("--backend", args.backend, "tcp or shm (default both)")
      ->check(CLI::IsMember({"tcp", "shm"}));
  plexus::tooling::AddNumber(&app, "--bytes", &args.bytes,
                             "bandwidth of this message size only (default 64K, 1M, 16M and 64M)",
                             size_t{0}, size_t{1} << 30);
  int64_t spin_us = 50;
  plexus::tooling::AddNumber(&app, "--spin-us", &spin_us,
                             "bandwidth waits: spin this long before sleeping", int64_t{0},
                             int64_t{1000000});
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (args.quick && app.count("--runs") == 0) args.runs = 1;
  args.spin = absl::Microseconds(spin_us);
  plexus::tooling::FigureWriter out("transport", args.json);
  const size_t total = args.quick ? (64 << 20) : (512 << 20);
  const int iters = args.quick ? 2000 : 10000;
  const std::vector<size_t> sizes =
      args.bytes != 0 ? std::vector<size_t>{args.bytes}
                      : std::vector<size_t>{64 << 10, 1 << 20, 16 << 20, 64 << 20};
  if (!args.json) {
    std::printf("plexus-bench-transport: medians of %d runs; bandwidth in GB/s, latency in us\n",
                args.runs);
  }

  const bool want_tcp = args.backend.empty() || args.backend == "tcp";
  const bool want_shm = args.backend.empty() || args.backend == "shm";

  // Bandwidth, unpinned: both processes may use both cores, as raw TCP does. Plexus and its
  // reference alternate run by run, so that a disturbance hits both.
  for (size_t bytes : sizes) {
    if (!args.test.empty() && args.test != "bandwidth") break;
    std::vector<double> raw, memcpy_ref, tcp, shm;
    const size_t amount = std::max(total, 16 * bytes);
    for (int r = 0; r < args.runs; ++r) {
      // Who goes first alternates run by run (BalancedOrder of two).
      for (size_t k : plexus::bench::BalancedOrder(2, static_cast<size_t>(r))) {
        if (want_tcp && k == 0) raw.push_back(RawBandwidth(bytes, amount));
        if (want_tcp && k == 1) {
          tcp.push_back(PlexusBandwidth(pt::Backend::kTcp, bytes, amount, args.spin));
        }
      }
      for (size_t k : plexus::bench::BalancedOrder(2, static_cast<size_t>(r))) {
        if (want_shm && k == 0) memcpy_ref.push_back(MemcpyBandwidth(bytes, amount));
        if (want_shm && k == 1) {
          shm.push_back(PlexusBandwidth(pt::Backend::kShm, bytes, amount, args.spin));
        }
      }
    }
    if (want_tcp) {
      const double raw_m = Median(raw);
      Emit(out, args, "raw-tcp", "bandwidth", bytes, "GB/s", raw_m, "GB/s", 1.0, "itself",
           "unpinned");
      Emit(out, args, "tcp", "bandwidth", bytes, "GB/s", Median(tcp), "GB/s", Median(tcp) / raw_m,
           "raw-tcp single stream", "unpinned", BandwidthGoal(false, bytes, raw_m));
    }
    if (want_shm) {
      const double mem_m = Median(memcpy_ref);
      Emit(out, args, "memcpy", "bandwidth", bytes, "GB/s", mem_m, "GB/s", 1.0, "itself",
           "1 thread");
      Emit(out, args, "shm", "bandwidth", bytes, "GB/s", Median(shm), "GB/s", Median(shm) / mem_m,
           "memcpy 1 thread", "unpinned", BandwidthGoal(true, bytes, mem_m));
    }
  }
  if (!args.test.empty() && args.test != "pingpong") {
    out.PrintTable();
    return 0;
  }

  // Ping-pong, 64 B request / 8 B response. Each Plexus figure is compared with raw TCP run the
  // same way: same pinning, blocking waits (no spinning) for tcp.
  struct Layout {
    const char* name;
    int client_cpu, server_cpu;
  };
  const Layout layouts[] = {{"same-cpu,blocking", 0, 0}, {"split-cpu,blocking", 0, 1}};
  for (const Layout& layout : layouts) {
    if (!want_tcp) break;
    std::vector<double> raw_med, raw_p99, tcp_med, tcp_p99;
    for (int r = 0; r < args.runs; ++r) {
      Latency raw, tcp;
      for (size_t k : plexus::bench::BalancedOrder(2, static_cast<size_t>(r))) {
        if (k == 0) raw = RawPingPong(iters, layout.client_cpu, layout.server_cpu);
        if (k == 1) {
          tcp = PlexusPingPong(pt::Backend::kTcp, iters, layout.client_cpu, layout.server_cpu,
                               absl::ZeroDuration());
        }
      }
      raw_med.push_back(raw.median_us);
      raw_p99.push_back(raw.p99_us);
      tcp_med.push_back(tcp.median_us);
      tcp_p99.push_back(tcp.p99_us);
    }
    const double rm = Median(raw_med), rp = Median(raw_p99);
    Emit(out, args, "raw-tcp", "pingpong", 64, "median_us", rm, "us", 1.0, "itself", layout.name);
    Emit(out, args, "raw-tcp", "pingpong", 64, "p99_us", rp, "us", 1.0, "itself", layout.name);
    Emit(out, args, "tcp", "pingpong", 64, "median_us", Median(tcp_med), "us", Median(tcp_med) / rm,
         "raw-tcp ping-pong", layout.name, Goal{1.15 * rm, true});
    Emit(out, args, "tcp", "pingpong", 64, "p99_us", Median(tcp_p99), "us", Median(tcp_p99) / rp,
         "raw-tcp ping-pong", layout.name);
  }
  // shm: processes on separate CPUs, spinning up to 200 us before sleeping (a round trip fits).
  if (want_shm) {
    std::vector<double> med, p99, raw_med;
    for (int r = 0; r < args.runs; ++r) {
      Latency shm = PlexusPingPong(pt::Backend::kShm, iters, 0, 1, absl::Microseconds(200));
      med.push_back(shm.median_us);
      p99.push_back(shm.p99_us);
      // Its reference spins as long before blocking.
      raw_med.push_back(RawPingPong(iters, 0, 1, absl::Microseconds(200)).median_us);
    }
    const double rm = Median(raw_med);
    Emit(out, args, "shm", "pingpong", 64, "median_us", Median(med), "us", Median(med) / rm,
         "raw-tcp ping-pong split-cpu spinning 200us", "split-cpu,spin-200us", Goal{5.0, true});
    Emit(out, args, "shm", "pingpong", 64, "p99_us", Median(p99), "us", Median(p99) / rm,
         "raw-tcp ping-pong split-cpu spinning 200us", "split-cpu,spin-200us");
  }
  out.PrintTable();
  return 0;
}
