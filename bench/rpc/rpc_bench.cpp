// plexus-bench-rpc: Plexus RPC against gRPC (--compare) and a raw TCP ping-pong floor, on one
// echo.proto. Every measurement runs a server process and a client process (this program, or
// plexus-bench-rpc-grpc for gRPC, with --role) started through plexus::tooling::Launcher; the
// client prints its counts and this process reports medians over --runs runs.
//
//   plexus-bench-rpc [--compare] [--json] [--runs 5] [--seconds 1]
//
// Figures: latency (median, p99) with 1 call in flight for 64 B and 8 B payloads (echoed back),
// both processes on one CPU and on two CPUs (sched_setaffinity), every side blocking in the
// kernel while idle; RPC/s with 32 and 128 calls in flight (32 B); goodput of 8 KiB requests
// (empty replies, 32 in flight); the cost of a rate limit at an infinite rate and of an ACL that
// denies 1% of calls, as RPC/s with the policy over RPC/s without; Plexus over shm as extra lines.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "echo.plexus.hpp"
#include "peer.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/transport/device.hpp"
#include "qos_bench.hpp"
#include "raw_tcp.hpp"

namespace pb = plexus::benchrpc;
namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::benchrpc::Clock;

namespace {

// Options of the Plexus peer beyond peer.hpp's.
struct PlexusArgs {
  std::string transport = "tcp";    // tcp or shm
  std::string progress = "thread";  // the transport's ProgressMode: thread or caller
  std::string policy = "none";      // client chain: none, ratelimit (infinite rate) or acl
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "plexus-bench-rpc: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::shared_ptr<pt::Device> MakeDevice(const PlexusArgs& x) {
  pt::DeviceOptions o;
  o.backend = x.transport == "shm" ? pt::Backend::kShm : pt::Backend::kTcp;
  if (o.backend == pt::Backend::kTcp) o.local_address = "127.0.0.1";
  o.progress = x.progress == "caller" ? pt::ProgressMode::kCaller : pt::ProgressMode::kThread;
  auto d = pt::Device::Create(o);
  if (!d.ok()) Die(absl::StrCat("device ", x.transport, ": ", d.status().ToString()));
  return *d;
}

// ---- Plexus peer ----------------------------------------------------------------------------

class EchoImpl : public pb::EchoService::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const pb::EchoRequest& req, pb::EchoReply* resp) override {
    // The reply views the request's payload: it lives until the reply is sent.
    resp->payload = req.payload.subspan(0, std::min<size_t>(req.reply_bytes, req.payload.size()));
    return absl::OkStatus();
  }
};

int PlexusServer(const PlexusArgs& x) {
  pb::BlockTermSignals();
  auto device = MakeDevice(x);
  pr::ServerOptions so;
  so.max_in_flight_per_connection = 256;
  auto server = pr::Server::Create(device, so);
  if (!server.ok()) Die(server.status().ToString());
  EchoImpl impl;
  if (auto s = (*server)->Register(&impl); !s.ok()) Die(s.ToString());
  if (auto s = (*server)->Start(); !s.ok()) Die(s.ToString());
  pb::PublishAddress((*server)->address());
  pb::WaitForTermSignal();
  std::_Exit(0);
}

std::shared_ptr<pr::Policy> MakePolicy(const std::string& which) {
  if (which == "ratelimit") {
    // The default rate is infinite: it never limits, but every call goes through the bucket.
    auto p = pr::RateLimitPolicy::Create("ratelimit", pr::RateLimitOptions());
    if (!p.ok()) Die(p.status().ToString());
    return *p;
  }
  if (which == "acl") {
    auto p =
        pr::AclPolicy::Create("acl", {&pb::EchoService::Descriptor()},
                              {{"no-deny", "plexus.benchrpc.EchoService/Echo", "tag", {"deny"}}});
    if (!p.ok()) Die(p.status().ToString());
    return *p;
  }
  return nullptr;
}

int PlexusClient(const pb::PeerArgs& a, const PlexusArgs& x) {
  auto device = MakeDevice(x);
  const int slots = a.mode == "latency" ? 1 : a.inflight;
  pr::ChannelOptions co;
  co.max_in_flight = static_cast<size_t>(std::max(slots, 1));
  auto ch = pr::Channel::Connect(device, a.address, {&pb::EchoService::Descriptor()}, co);
  if (!ch.ok()) Die(ch.status().ToString());
  if (x.policy != "none" && a.mode != "rate") Die("--policy needs --mode rate");
  pb::EchoService::Stub stub(*ch);
  const std::vector<uint8_t> payload(a.size, 'x');
  std::vector<pb::EchoRequest> reqs(static_cast<size_t>(slots));
  for (auto& r : reqs) {
    r.payload = pr::Bytes(payload.data(), payload.size());
    r.reply_bytes = a.reply;
    r.tag = "ok";
  }
  pb::ClientResult result;
  if (a.mode == "latency") {
    pb::Phases phases(a.seconds);
    uint64_t i = 0;
    while (true) {
      reqs[0].tag = pb::Denied(i++, a.deny_percent) ? "deny" : "ok";
      const auto t0 = Clock::now();
      auto r = stub.EchoSync(reqs[0]);
      const auto t1 = Clock::now();
      if (phases.Over(t1)) break;
      if (!phases.Measuring(t1)) continue;
      if (r.ok()) {
        ++result.ok;
        result.bytes += a.size;
        result.latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      } else {
        ++result.failed;
      }
    }
    result.seconds = phases.seconds();
    pb::PrintResult(std::move(result));
    return 0;
  }
  // Rate: every slot starts its next call from the previous one's callback (the channel's
  // thread) until the measured window closed. With a policy, the measured time alternates
  // between 100 ms windows without and with it (Attach/Detach on the live channel), so that the
  // two rates see the same machine: `rate` is with the policy, `base_rate` without.
  pb::Phases phases(a.seconds);
  std::atomic<uint64_t> ok[2] = {0, 0};
  std::atomic<uint64_t> failed{0}, issued{0};
  std::atomic<int> window{0};  // 1 while the policy is attached
  std::mutex mu;
  std::condition_variable cv;
  int outstanding = slots;
  // --policy upgrade: every call's start and end, and how often each call id completed.
  const bool upgrading = x.policy == "upgrade";
  std::mutex calls_mu;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  std::vector<uint8_t> completions;
  if (upgrading) {
    if (auto st = (*ch)->engines().Attach(MakePolicy("ratelimit")); !st.ok()) Die(st.ToString());
    if (auto st = (*ch)->engines().Attach(std::make_shared<pr::MetricsPolicy>(), "ratelimit");
        !st.ok()) {
      Die(st.ToString());
    }
  }
  std::function<void(int)> issue = [&](int slot) {
    pb::EchoRequest& req = reqs[static_cast<size_t>(slot)];
    const uint64_t id = issued.fetch_add(1);
    req.tag = pb::Denied(id, a.deny_percent) ? "deny" : "ok";
    const auto started = Clock::now();
    if (upgrading) {
      std::lock_guard<std::mutex> lock(calls_mu);
      if (completions.size() <= id) completions.resize(id + 1, 0);
    }
    stub.Echo(req, {}, [&, slot, id, started](absl::StatusOr<pr::Reply<pb::EchoReply>> r) {
      const auto now = Clock::now();
      if (upgrading) {
        std::lock_guard<std::mutex> lock(calls_mu);
        ++completions[id];
        if (phases.Measuring(started)) spans.emplace_back(started, now);
      }
      if (phases.Measuring(now)) {
        if (r.ok()) {
          ok[window.load(std::memory_order_relaxed)].fetch_add(1, std::memory_order_relaxed);
        } else {
          failed.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!phases.Over(now)) {
        issue(slot);
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (--outstanding == 0) cv.notify_all();
    });
  };
  for (int s = 0; s < slots; ++s) issue(s);
  double window_seconds[2] = {0, 0};
  if (auto policy = MakePolicy(x.policy)) {
    std::this_thread::sleep_until(phases.begin());
    Clock::time_point t = phases.begin();
    int w = 0;
    while (t < phases.end()) {
      const Clock::time_point next = std::min(t + std::chrono::milliseconds(100), phases.end());
      if (w == 1) {
        if (auto st = (*ch)->engines().Attach(policy); !st.ok()) Die(st.ToString());
      } else if ((*ch)->engines().Find(policy->name()) != nullptr) {
        if (auto st = (*ch)->engines().Detach(policy->name()); !st.ok()) {
          Die(st.status().ToString());
        }
      }
      window.store(w);
      std::this_thread::sleep_until(next);
      window_seconds[w] += std::chrono::duration<double>(next - t).count();
      t = next;
      w ^= 1;
    }
  }
  // Live upgrade every 100 ms of the measured time: the rate limiter and the metrics engine, in
  // turn, each replaced by a new version that adopts the old one's state.
  std::vector<std::pair<Clock::time_point, Clock::time_point>> swaps;
  double max_pause_us = 0;
  if (upgrading) {
    std::this_thread::sleep_until(phases.begin());
    for (int i = 0; Clock::now() + std::chrono::milliseconds(100) < phases.end(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto t0 = Clock::now();
      std::shared_ptr<pr::Policy> next =
          i % 2 ? std::shared_ptr<pr::Policy>(std::make_shared<pr::MetricsPolicy>())
                : MakePolicy("ratelimit");
      auto rep = (*ch)->engines().Upgrade(next->name(), next);
      if (!rep.ok()) Die(rep.status().ToString());
      swaps.emplace_back(t0, Clock::now());
      max_pause_us = std::max(max_pause_us, absl::ToDoubleMicroseconds(rep->pause));
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(a.seconds * 2 + 30),
                     [&] { return outstanding == 0; })) {
      Die("the rate run did not drain its calls within its time");
    }
  }
  result.failed = failed.load();
  if (x.policy != "none" && !upgrading) {
    result.ok = ok[1].load();
    result.seconds = window_seconds[1];
    result.base_rate = static_cast<double>(ok[0].load()) / std::max(window_seconds[0], 1e-9);
  } else {
    result.ok = ok[0].load();
    result.seconds = phases.seconds();
  }
  result.bytes = result.ok * a.size;
  if (upgrading) {
    // Lost: issued but never completed; duplicated: completed twice. The metrics engine, upgraded
    // with the rest, must have counted every completed call (its counters carried over).
    std::lock_guard<std::mutex> lock(calls_mu);
    uint64_t lost = 0, duplicated = 0, completed = 0;
    for (uint8_t c : completions) {
      lost += c == 0;
      duplicated += c > 1;
      completed += c;
    }
    auto m = std::dynamic_pointer_cast<pr::MetricsPolicy>((*ch)->engines().Find("metrics"));
    const uint64_t counted = m->Get()["plexus.benchrpc.EchoService/Echo"].calls;
    std::vector<double> all, during;
    for (const auto& [b, e] : spans) {
      const double us = std::chrono::duration<double, std::micro>(e - b).count();
      all.push_back(us);
      for (const auto& [sb, se] : swaps) {
        if (b <= se && e >= sb) {
          during.push_back(us);
          break;
        }
      }
    }
    auto p99 = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, v.size() * 99 / 100)];
    };
    const double max_during = during.empty() ? 0 : *std::max_element(during.begin(), during.end());
    std::printf(
        "upgrade swaps=%zu max_pause_us=%.3f lost=%llu duplicated=%llu uncounted=%lld "
        "p99_us=%.3f p99_during_us=%.3f max_during_us=%.3f\n",
        swaps.size(), max_pause_us, static_cast<unsigned long long>(lost),
        static_cast<unsigned long long>(duplicated),
        static_cast<long long>(completed) - static_cast<long long>(counted), p99(all), p99(during),
        max_during);
    std::fflush(stdout);
  }
  pb::PrintResult(std::move(result));
  (*ch)->Close();
  return 0;
}

// ---- Raw TCP peer: a blocking ping-pong of `size` bytes each way, the floor -------------------

int RawServer() {
  pb::BlockTermSignals();
  int port = 0;
  auto lfd = plexus::bench::TcpListenLoopback(&port);
  if (!lfd.ok()) Die(lfd.status().ToString());
  pb::PublishAddress(std::to_string(port));
  std::thread([fd = *lfd] {
    auto c = plexus::bench::TcpAccept(fd);
    if (!c.ok()) Die(c.status().ToString());
    uint32_t sizes[2];
    std::vector<char> buf;
    // Each request: its size and the reply's, then the bytes.
    while (plexus::bench::ReadFull(*c, sizes, sizeof sizes).ok()) {
      buf.resize(std::max(sizes[0], sizes[1]));
      if (!plexus::bench::ReadFull(*c, buf.data(), sizes[0]).ok()) break;
      if (!plexus::bench::WriteFull(*c, buf.data(), sizes[1]).ok()) break;
    }
    close(*c);
  }).detach();
  pb::WaitForTermSignal();
  std::_Exit(0);
}

int RawClient(const pb::PeerArgs& a) {
  int port = 0;
  if (!absl::SimpleAtoi(a.address, &port)) Die("raw client: bad --address " + a.address);
  auto fd = plexus::bench::TcpConnectLoopback(port);
  if (!fd.ok()) Die(fd.status().ToString());
  std::vector<char> req(sizeof(uint32_t) * 2 + a.size, 'x'), resp(a.reply);
  const uint32_t sizes[2] = {a.size, a.reply};
  std::memcpy(req.data(), sizes, sizeof sizes);
  pb::ClientResult result;
  pb::Phases phases(a.seconds);
  while (true) {
    const auto t0 = Clock::now();
    if (auto s = plexus::bench::WriteFull(*fd, req.data(), req.size()); !s.ok()) Die(s.ToString());
    if (auto s = plexus::bench::ReadFull(*fd, resp.data(), resp.size()); !s.ok()) {
      Die(s.ToString());
    }
    const auto t1 = Clock::now();
    if (phases.Over(t1)) break;
    if (!phases.Measuring(t1)) continue;
    ++result.ok;
    result.bytes += a.size;
    result.latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  result.seconds = phases.seconds();
  close(*fd);
  pb::PrintResult(std::move(result));
  return 0;
}

// ---- Orchestrator ---------------------------------------------------------------------------

struct Sample {
  double rate = 0, base_rate = 0, goodput = 0, median_us = 0, p99_us = 0;
  uint64_t ok = 0, failed = 0;
  std::map<std::string, double> upgrade;  // --policy upgrade: the "upgrade" line's fields
};

// Runs one peer process; `on_line` sees its stdout lines. Wait() in a thread.
class Peer {
 public:
  Peer(std::vector<std::string> argv, absl::Duration timeout) {
    plexus::tooling::LaunchOptions o;
    o.ranks = 1;
    o.argv = std::move(argv);
    o.plexus_env = false;
    o.output = plexus::tooling::OutputMode::kCallback;
    o.timeout = timeout;
    o.grace = absl::Seconds(2);
    o.on_line = [this](plexus::tooling::Launcher&, int, plexus::tooling::Stream stream,
                       std::string_view line) {
      if (stream == plexus::tooling::Stream::kStderr) {
        std::fprintf(stderr, "  [%s] %.*s\n", name_.c_str(), static_cast<int>(line.size()),
                     line.data());
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
      cv_.notify_all();
    };
    name_ = o.argv[0].substr(o.argv[0].rfind('/') + 1) + " " + o.argv[2];
    launcher_ = std::make_unique<plexus::tooling::Launcher>(std::move(o));
    if (auto s = launcher_->Start(); !s.ok()) Die(s.ToString());
    waiter_ = std::thread([this] {
      plexus::tooling::LaunchResult r = launcher_->Wait();
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      result_ = r.ranks.empty() ? "did not start" : r.ranks[0].Describe();
      exit_ok_ = !r.ranks.empty() && (r.ranks[0].ok() || r.ranks[0].stopped_by_launcher);
      cv_.notify_all();
    });
  }
  ~Peer() {
    launcher_->Signal(0, SIGTERM);
    waiter_.join();
  }
  // The first stdout line starting with `prefix` (without it); dies when the process ended first
  // or `timeout` passed.
  std::string Line(const std::string& prefix, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    while (true) {
      for (const std::string& l : lines_) {
        if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
      }
      if (ended_) Die(absl::StrCat(name_, " ", result_, " without printing '", prefix, "'"));
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        Die(absl::StrCat(name_, " printed no '", prefix, "' line within ",
                         absl::FormatDuration(timeout)));
      }
    }
  }

 private:
  std::string name_;
  std::unique_ptr<plexus::tooling::Launcher> launcher_;
  std::thread waiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  bool ended_ = false;
  bool exit_ok_ = false;
  std::string result_;
};

struct Layout {
  std::string name;
  int server_cpu, client_cpu;
};

struct Orchestrator {
  std::string self, grpc_peer;
  pb::PeerArgs base;

  // system: "plexus-tcp", "plexus-tcp-thread", "plexus-shm", "grpc", "raw-tcp".
  Sample Run(const std::string& system, const Layout& layout, const std::string& mode,
             uint32_t size, uint32_t reply, int inflight, const std::string& policy = "none",
             double deny_percent = 0) {
    std::vector<std::string> common;
    std::string program = self;
    std::string server_role = "server", client_role = "client";
    if (system == "grpc") {
      program = grpc_peer;
    } else if (system == "raw-tcp") {
      server_role = "raw-server";
      client_role = "raw-client";
    } else {
      // The transport moves bytes in the threads that poll for completions (ProgressMode::kCaller:
      // rpc handles each completion run-to-completion on the thread that read it);
      // "plexus-tcp-thread" is the same with a device thread moving the bytes (kThread: one
      // thread hop more per side). shm's rate runs keep kThread, faster there (docs/rpc.md).
      const bool thread_mode =
          system == "plexus-tcp-thread" || (system == "plexus-shm" && mode == "rate");
      common = {"--transport", system == "plexus-shm" ? "shm" : "tcp", "--progress",
                thread_mode ? "thread" : "caller"};
    }
    std::vector<std::string> sargv = {program, "--role", server_role, "--cpu",
                                      std::to_string(layout.server_cpu)};
    sargv.insert(sargv.end(), common.begin(), common.end());
    const absl::Duration limit = absl::Seconds(base.seconds * 3 + 60);
    Peer server(sargv, limit);
    const std::string address = server.Line("address ", absl::Seconds(30));
    std::vector<std::string> cargv = {program,
                                      "--role",
                                      client_role,
                                      "--cpu",
                                      std::to_string(layout.client_cpu),
                                      "--address",
                                      address,
                                      "--mode",
                                      mode,
                                      "--size",
                                      std::to_string(size),
                                      "--reply",
                                      std::to_string(reply),
                                      "--inflight",
                                      std::to_string(inflight),
                                      "--seconds",
                                      absl::StrCat(base.seconds),
                                      "--deny-percent",
                                      absl::StrCat(deny_percent)};
    cargv.insert(cargv.end(), common.begin(), common.end());
    if (policy != "none") {
      cargv.push_back("--policy");
      cargv.push_back(policy);
    }
    Peer client(cargv, limit);
    const std::string line = client.Line("result ", limit);
    Sample s;
    for (absl::string_view kv : absl::StrSplit(line, ' ')) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      double v = 0;
      if (!absl::SimpleAtod(p.second, &v)) continue;
      if (p.first == "rate") s.rate = v;
      if (p.first == "base_rate") s.base_rate = v;
      if (p.first == "goodput") s.goodput = v;
      if (p.first == "median_us") s.median_us = v;
      if (p.first == "p99_us") s.p99_us = v;
      if (p.first == "ok") s.ok = static_cast<uint64_t>(v);
      if (p.first == "failed") s.failed = static_cast<uint64_t>(v);
    }
    if (policy == "upgrade") {
      for (absl::string_view kv : absl::StrSplit(client.Line("upgrade ", limit), ' ')) {
        std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        double v = 0;
        if (absl::SimpleAtod(p.second, &v)) s.upgrade[p.first] = v;
      }
    }
    return s;
  }
};

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  plexus::tooling::FigureWriter* out;
  int runs;
  void Add(const std::string& figure, double value, const std::string& unit, nlohmann::json extra,
           nlohmann::json target = nullptr, std::optional<bool> met = {}) {
    plexus::tooling::Figure f;
    f.figure = figure;
    f.value = value;
    f.unit = unit;
    f.target = std::move(target);
    f.met = met;
    f.extra = std::move(extra);
    f.extra["runs"] = runs;
    out->Add(f);
  }
};

// Global QoS: small calls' latency with a bulk background on one server, without and with the
// "qos" engine (qos_bench.cpp; in this process, the two modes alternate within each run).
void QosFigures(Figures& fig, int runs, double seconds) {
  std::vector<double> med[2], p99[2], bulk[2], calls[2], ratio;
  double failed = 0;
  pb::QosMixOptions mix{.seconds = std::max(1.0, seconds)};
  for (int r = 0; r < runs; ++r) {
    pb::QosMixSample s[2];
    for (int m : {0, 1}) {
      mix.qos = m == 1;
      s[m] = pb::RunQosMix(mix);
      med[m].push_back(s[m].small_median_us);
      p99[m].push_back(s[m].small_p99_us);
      bulk[m].push_back(s[m].bulk_rate);
      calls[m].push_back(s[m].small_calls);
      failed += static_cast<double>(s[m].failed);
    }
    ratio.push_back(s[1].small_p99_us / s[0].small_p99_us);
  }
  for (int m : {0, 1}) {
    nlohmann::json extra = {{"system", "plexus-tcp"},
                            {"policy", m ? "qos" : "none"},
                            {"small_bytes", mix.small_bytes},
                            {"bulk_bytes", mix.bulk_bytes},
                            {"bulk_inflight", mix.bulk_inflight},
                            {"small_calls", Median(calls[m])},
                            {"failed_calls", failed}};
    fig.Add("qos_small_latency_median", Median(med[m]), "us", extra);
    fig.Add("qos_small_latency_p99", Median(p99[m]), "us", extra);
    fig.Add("qos_bulk_rate", Median(bulk[m]), "RPC/s", extra);
  }
  fig.Add("qos_small_p99_with_over_without", Median(ratio), "ratio",
          {{"system", "plexus-tcp"}, {"bulk_inflight", mix.bulk_inflight}});
}

int Orchestrate(bool compare, bool json, int runs, const pb::PeerArgs& base,
                const std::string& only) {
  Orchestrator o;
  o.self = plexus::tooling::SelfPath("plexus-bench-rpc");
  o.base = base;
  std::string grpc_missing = PLEXUS_BENCH_GRPC_MISSING;
  if (compare && grpc_missing.empty()) {
    o.grpc_peer = o.self.substr(0, o.self.rfind('/') + 1) + "plexus-bench-rpc-grpc";
    if (access(o.grpc_peer.c_str(), X_OK) != 0) grpc_missing = o.grpc_peer + " is not built";
  }
  const bool grpc = compare && grpc_missing.empty();
  if (compare && !grpc) {
    std::fprintf(stderr, "plexus-bench-rpc: --compare: gRPC skipped: %s\n", grpc_missing.c_str());
  }
  plexus::tooling::FigureWriter out("rpc", json);
  Figures fig{&out, runs};
  if (!json) {
    std::printf(
        "plexus-bench-rpc: medians of %d runs of %.2f s; server and client in separate "
        "processes on 127.0.0.1, each blocking in the kernel while idle (Plexus waits spin up to "
        "20 us "
        "first while that pays, the library default)\n",
        runs, base.seconds);
  }
  if (only == "qos") {
    QosFigures(fig, runs, base.seconds);
    if (!json) out.PrintTable();
    return 0;
  }
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<Layout> layouts = {{"same-cpu,blocking", 0, 0}};
  if (cpus >= 2) layouts.push_back({"split-cpu,blocking", 0, 1});
  const Layout unpinned{"unpinned,blocking", -1, -1};

  // --only: one group (qos, latency, rate, goodput); empty: all of them.
  auto wanted = [&](const char* group) { return only.empty() || only == group; };
  // Latency, 1 in flight. Systems alternate within each run, so a disturbance hits all of them.
  for (const Layout& layout : wanted("latency") ? layouts : std::vector<Layout>{}) {
    for (uint32_t size : {64u, 8u}) {
      std::map<std::string, std::vector<double>> med, p99;
      std::vector<std::string> systems = {"raw-tcp", "plexus-tcp"};
      if (grpc) systems.push_back("grpc");
      if (layout.name.rfind("split", 0) == 0 && size == 64) systems.push_back("plexus-shm");
      for (int r = 0; r < runs; ++r) {
        for (const std::string& sys : systems) {
          Sample s = o.Run(sys, layout, "latency", size, size, 1);
          med[sys].push_back(s.median_us);
          p99[sys].push_back(s.p99_us);
        }
      }
      for (const std::string& sys : systems) {
        nlohmann::json extra = {{"system", sys}, {"layout", layout.name}, {"size", size}};
        fig.Add("latency_median", Median(med[sys]), "us", extra);
        fig.Add("latency_p99", Median(p99[sys]), "us", extra);
      }
      const double plexus = Median(med["plexus-tcp"]);
      const double vs_raw = plexus / Median(med["raw-tcp"]);
      nlohmann::json extra = {{"system", "plexus-tcp"}, {"layout", layout.name}, {"size", size}};
      fig.Add("latency_median_vs_raw_tcp", vs_raw, "ratio", extra, "<= 1.3", vs_raw <= 1.3);
      if (grpc) {
        const double vs = plexus / Median(med["grpc"]);
        fig.Add("latency_median_vs_grpc", vs, "ratio", extra, "<= 0.5", vs <= 0.5);
      }
    }
  }

  // RPC/s with 32 and 128 in flight, 32 B each way; unpinned (both processes on every CPU).
  for (int inflight : wanted("rate") ? std::vector<int>{32, 128} : std::vector<int>{}) {
    std::map<std::string, std::vector<double>> rate;
    std::vector<std::string> systems = {"plexus-tcp"};
    if (grpc) systems.push_back("grpc");
    if (inflight == 32) {
      systems.push_back("plexus-shm");
      systems.push_back("plexus-tcp-thread");
    }
    for (int r = 0; r < runs; ++r) {
      for (const std::string& sys : systems) {
        rate[sys].push_back(o.Run(sys, unpinned, "rate", 32, 32, inflight).rate);
      }
    }
    for (const std::string& sys : systems) {
      fig.Add("rpc_rate", Median(rate[sys]), "RPC/s",
              {{"system", sys}, {"layout", unpinned.name}, {"size", 32}, {"inflight", inflight}});
    }
    if (grpc) {
      const double vs = Median(rate["plexus-tcp"]) / Median(rate["grpc"]);
      fig.Add("rpc_rate_vs_grpc", vs, "ratio",
              {{"system", "plexus-tcp"}, {"size", 32}, {"inflight", inflight}}, ">= 3", vs >= 3);
    }
  }

  // Goodput: 8 KiB requests, empty replies, 32 in flight.
  if (wanted("goodput")) {
    std::map<std::string, std::vector<double>> gp;
    std::vector<std::string> systems = {"plexus-tcp"};
    if (grpc) systems.push_back("grpc");
    for (int r = 0; r < runs; ++r) {
      for (const std::string& sys : systems) {
        gp[sys].push_back(o.Run(sys, unpinned, "rate", 8192, 0, 32).goodput);
      }
    }
    for (const std::string& sys : systems) {
      fig.Add("goodput", Median(gp[sys]), "GB/s",
              {{"system", sys}, {"layout", unpinned.name}, {"size", 8192}, {"inflight", 32}});
    }
    if (grpc) {
      const double vs = Median(gp["plexus-tcp"]) / Median(gp["grpc"]);
      fig.Add("goodput_vs_grpc", vs, "ratio",
              {{"system", "plexus-tcp"}, {"size", 8192}, {"inflight", 32}}, ">= 4", vs >= 4);
    }
  }

  // Policy cost: RPC/s (ok calls) with the policy on the client's chain over RPC/s without, in
  // alternating 100 ms windows of one client run (so both see the same machine), 32 in flight,
  // 32 B; 1% of requests carry the tag the ACL denies (only ok calls count, so the ACL's 1% is
  // part of its cost).
  for (const std::string p : wanted("policy") ? std::vector<std::string>{"ratelimit", "acl"}
                                              : std::vector<std::string>{}) {
    std::vector<double> with, without, ratio;
    for (int r = 0; r < runs; ++r) {
      Sample s = o.Run("plexus-tcp", unpinned, "rate", 32, 32, 32, p, 1.0);
      with.push_back(s.rate);
      without.push_back(s.base_rate);
      ratio.push_back(s.base_rate > 0 ? s.rate / s.base_rate : NAN);
    }
    nlohmann::json extra = {
        {"system", "plexus-tcp"}, {"policy", p}, {"inflight", 32}, {"size", 32}};
    fig.Add("policy_rpc_rate", Median(with), "RPC/s", extra);
    nlohmann::json base = extra;
    base["policy"] = absl::StrCat("none (", p, " run)");
    fig.Add("policy_rpc_rate", Median(without), "RPC/s", base);
    const double cost = 1 - Median(ratio);
    fig.Add("policy_cost", cost, "fraction", extra, "<= 0.05", cost <= 0.05);
  }
  // Live upgrade every 100 ms during a rate run (32 in flight, 32 B): the longest time an upgrade
  // held calls at the gate, p99 latency of the calls in flight during a swap against all calls,
  // and calls lost, duplicated or missing from the upgraded metrics engine (target: 0).
  if (wanted("upgrade")) {
    std::map<std::string, std::vector<double>> u;
    for (int r = 0; r < runs; ++r) {
      Sample s = o.Run("plexus-tcp", unpinned, "rate", 32, 32, 32, "upgrade");
      for (const auto& [k, v] : s.upgrade) u[k].push_back(v);
    }
    nlohmann::json extra = {{"system", "plexus-tcp"},
                            {"inflight", 32},
                            {"size", 32},
                            {"every_ms", 100},
                            {"swaps", Median(u["swaps"])}};
    fig.Add("upgrade_max_pause", Median(u["max_pause_us"]), "us", extra);
    fig.Add("upgrade_p99_during_swaps", Median(u["p99_during_us"]), "us", extra);
    fig.Add("upgrade_max_latency_during_swaps", Median(u["max_during_us"]), "us", extra);
    fig.Add("upgrade_p99_all", Median(u["p99_us"]), "us", extra);
    double bad = 0;
    for (const char* k : {"lost", "duplicated", "uncounted"}) {
      for (double v : u[k]) bad += std::abs(v);
    }
    fig.Add("upgrade_calls_lost_duplicated_uncounted", bad, "calls", extra, "== 0", bad == 0);
  }
  if (wanted("qos")) QosFigures(fig, runs, base.seconds);
  if (!json) out.PrintTable();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool(
      "plexus-bench-rpc",
      "Plexus RPC latency, RPC/s, goodput and policy cost, against gRPC's async completion-queue "
      "server and client (--compare) and a raw TCP ping-pong, on one echo.proto. Server and "
      "client run in separate processes on 127.0.0.1; figures are medians of --runs runs.");
  bool compare = false, json = false;
  int runs = 5;
  std::string only;
  pb::PeerArgs peer;
  PlexusArgs x;
  tool.app().add_flag("--compare", compare, "also run gRPC (plexus-bench-rpc-grpc)");
  plexus::tooling::AddJsonFlag(&tool.app(), &json);
  plexus::tooling::AddNumber(&tool.app(), "--runs", &runs, "runs per figure (the median is kept)",
                             1, 100);
  pb::AddPeerOptions(&tool.app(), &peer);
  tool.app()
      .add_option("--transport", x.transport, "peer: tcp or shm")
      ->check(CLI::IsMember({"tcp", "shm"}))
      ->group("");
  tool.app()
      .add_option("--progress", x.progress, "peer: the transport's progress (thread or caller)")
      ->check(CLI::IsMember({"thread", "caller"}))
      ->group("");
  tool.app()
      .add_option("--policy", x.policy,
                  "peer: none, ratelimit or acl on the client's chain, or upgrade (rate limit and "
                  "metrics upgraded every 100 ms)")
      ->check(CLI::IsMember({"none", "ratelimit", "acl", "upgrade"}))
      ->group("");
  tool.app()
      .add_option("--only", only,
                  "run one group of figures: latency, rate (RPC/s), goodput, policy (policy "
                  "costs), upgrade (live upgrade) or qos (the global QoS figures)")
      ->check(CLI::IsMember({"latency", "rate", "goodput", "policy", "upgrade", "qos"}));
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (peer.cpu >= 0) plexus::bench::PinToCpu(peer.cpu);
  if (peer.role.empty()) return Orchestrate(compare, json, runs, peer, only);
  if (peer.role == "server") return PlexusServer(x);
  if (peer.role == "client") return PlexusClient(peer, x);
  if (peer.role == "raw-server") return RawServer();
  if (peer.role == "raw-client") return RawClient(peer);
  return tool.Usage("--role must be server, client, raw-server or raw-client");
}
