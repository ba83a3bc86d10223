// The Plexus and raw TCP peers of plexus-bench-rpc (see plexus_peer.hpp).
#include "plexus_peer.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "echo.plexus.hpp"
#include "plexus/base/quantile.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policies.hpp"
#include "plexus/rpc/server.hpp"
#include "plexus/transport/device.hpp"
#include "raw_tcp.hpp"

namespace pb = plexus::benchrpc;
namespace pr = plexus::rpc;
namespace pt = plexus::transport;
using plexus::benchrpc::Clock;
using plexus::benchrpc::Die;
using plexus::benchrpc::PlexusArgs;

void plexus::benchrpc::Die(const std::string& what) {
  std::fprintf(stderr, "plexus-bench-rpc: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

namespace {

std::shared_ptr<pt::Device> MakeDevice(const PlexusArgs& x) {
  pt::DeviceOptions o;
  o.backend = x.transport == "shm" ? pt::Backend::kShm : pt::Backend::kTcp;
  if (o.backend == pt::Backend::kTcp) o.local_address = "127.0.0.1";
  // Like with like: gRPC and the raw TCP floor run under the system's congestion control, so
  // Plexus does too (its loopback default is reno).
  o.tcp.loopback_congestion_control = "";
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
    resp->request_ok = pb::PayloadMatches(req.payload.data(), req.payload.size());
    return absl::OkStatus();
  }
};

std::shared_ptr<pr::Policy> MakePolicy(const std::string& which) {
  if (which == "ratelimit") {
    // A rate no client reaches: it never limits, but every call is counted and refilled as under
    // a real limit (an infinite rate would skip the refill's arithmetic).
    pr::RateLimitOptions o;
    o.rate = 1e12;
    o.burst = 1000;
    auto p = pr::RateLimitPolicy::Create("ratelimit", o);
    if (!p.ok()) Die(p.status().ToString());
    return *p;
  }
  if (which == "noop") {
    // The control: an engine whose OnRequest passes every call, i.e. what any engine costs (its
    // gate and one virtual call) before it does anything.
    struct Noop : pr::Policy {
      uint32_t hooks() const override { return pr::kHookRequest; }
      std::string name() const override { return "noop"; }
    };
    return std::make_shared<Noop>();
  }
  if (which == "tagcheck" || which == "tagcheck_in_place") {
    // What the ACL's cost is made of: the check the ACL's rule makes (the request's tag is not
    // "deny"), hand-written, on the private copy a content policy gets (tagcheck: it names the
    // field, as the ACL does) or on the application's memory (tagcheck_in_place: it declares no
    // content, so the bytes it checks may not be the bytes sent; a measurement, not a policy to
    // use). The ACL against tagcheck is the cost of its rule matching; tagcheck against
    // tagcheck_in_place is the cost of the private copy.
    struct TagCheck : pr::Policy {
      // The field is found once, as the ACL resolves its rules when it is created: a name search
      // per call would be charged to the copy.
      explicit TagCheck(bool copy) : copy(copy) {
        const pr::MessageDesc* desc = echo->request();
        for (size_t i = 0; i < desc->field_count; ++i) {
          if (std::string_view(desc->fields[i].name) == "tag") tag = &desc->fields[i];
        }
        if (tag == nullptr) Die("echo.proto's EchoRequest has no field 'tag'");
      }
      uint32_t hooks() const override { return pr::kHookRequest; }
      std::string name() const override { return copy ? "tagcheck" : "tagcheck_in_place"; }
      bool inspects_content() const override { return copy; }
      bool ContentFields(const pr::MethodDesc& method,
                         absl::FunctionRef<void(pr::FieldPath)> read) const override {
        if (&method == echo) read(pr::FieldPath(&tag, 1));
        return true;
      }
      absl::Status OnRequest(const pr::CallInfo& call) override {
        const auto* req = static_cast<const pb::EchoRequest*>(call.request);
        if (req->tag == "deny") return absl::PermissionDeniedError("tag \"deny\"");
        return absl::OkStatus();
      }
      const bool copy;
      const pr::MethodDesc* const echo = &pb::EchoService::Descriptor().methods[0];
      const pr::FieldDesc* tag = nullptr;
    };
    return std::make_shared<TagCheck>(which == "tagcheck");
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

}  // namespace

double pb::ChainNsPerCall(const std::string& policy, int threads, double seconds) {
  pr::EngineChain chain;
  if (auto p = MakePolicy(policy)) {
    if (auto st = chain.Attach(p); !st.ok()) Die(st.ToString());
  }
  const pr::ServiceDesc& service = pb::EchoService::Descriptor();
  std::atomic<bool> go{false}, stop{false};
  std::vector<double> ns(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string payload = pb::RequestPayload(32);
      pb::EchoRequest req;
      req.payload = pr::Bytes(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
      req.reply_bytes = 32;
      req.tag = "ok";
      pr::CallInfo info;
      info.service = &service;
      info.method = &service.methods[0];
      info.server_side = true;
      while (!go.load()) std::this_thread::yield();
      uint64_t calls = 0;
      const auto t0 = Clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 64; ++k, ++calls) {
          const pr::EngineChain::Snapshot snap = chain.snapshot();
          info.request = &req;
          for (const auto& slot : *snap) {
            if (!slot->OnRequest(info).ok()) Die("the chain refused an ok call");
          }
          info.request = nullptr;
          for (const auto& slot : *snap) slot->OnComplete(info, absl::OkStatus());
        }
      }
      ns[static_cast<size_t>(t)] =
          std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
          static_cast<double>(calls);
    });
  }
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double v : ns) sum += v;
  return sum / threads;
}

int pb::PlexusServer(const PlexusArgs& x) {
  pb::BlockTermSignals();
  auto device = MakeDevice(x);
  pr::ServerOptions so;
  so.max_in_flight_per_connection = 256;
  auto server = pr::Server::Create(device, so);
  if (!server.ok()) Die(server.status().ToString());
  EchoImpl impl;
  // The echo never blocks: it runs to completion on the dispatcher thread (the path measured).
  if (auto s = (*server)->Register(&impl, {"Echo"}); !s.ok()) Die(s.ToString());
  if (auto s = (*server)->Start(); !s.ok()) Die(s.ToString());
  pb::PublishAddress((*server)->address());
  pb::WaitForTermSignal();
  std::_Exit(0);
}

int pb::PlexusClient(const pb::PeerArgs& a, const PlexusArgs& x) {
  auto device = MakeDevice(x);
  const int slots = a.mode == "latency" ? 1 : a.inflight;
  pr::ChannelOptions co;
  co.max_in_flight = static_cast<size_t>(std::max(slots, 1));
  auto ch = pr::Channel::Connect(device, a.address, {&pb::EchoService::Descriptor()}, co);
  if (!ch.ok()) Die(ch.status().ToString());
  if (x.policy != "none" && a.mode != "rate") Die("--policy needs --mode rate");
  pb::EchoService::Stub stub(*ch);
  const std::string payload = pb::RequestPayload(a.size);
  std::vector<pb::EchoRequest> reqs(static_cast<size_t>(slots));
  for (auto& r : reqs) {
    r.payload = pr::Bytes(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
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
        result.wrong +=
            !(*r)->request_ok ||
            !pb::ReplyMatches((*r)->payload.data(), (*r)->payload.size(), a.size, a.reply);
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
  // between 20 ms windows without and with it (Attach/Detach on the live channel), so that the
  // two rates see the same machine: `rate` is with the policy, `base_rate` without.
  pb::Phases phases(a.seconds);
  std::atomic<uint64_t> ok[2] = {0, 0};
  std::atomic<uint64_t> failed{0}, issued{0}, wrong{0};
  std::atomic<int> window{0};  // 1 while the policy is attached
  // Ok calls per 20 ms window, in order (even: without the policy, odd: with it), for the cost's
  // median over adjacent pairs; `window_index` is -1 outside them.
  std::vector<std::atomic<uint64_t>> ok_in(static_cast<size_t>(a.seconds / 0.02) + 4);
  std::vector<double> window_length;
  std::atomic<int> window_index{-1};
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
          if (const int i = window_index.load(std::memory_order_relaxed); i >= 0) {
            ok_in[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
          }
          if (!(*r)->request_ok ||
              !pb::ReplyMatches((*r)->payload.data(), (*r)->payload.size(), a.size, a.reply)) {
            wrong.fetch_add(1, std::memory_order_relaxed);
          }
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
      const Clock::time_point next = std::min(t + std::chrono::milliseconds(20), phases.end());
      if (w == 1) {
        if (auto st = (*ch)->engines().Attach(policy); !st.ok()) Die(st.ToString());
      } else if ((*ch)->engines().Find(policy->name()) != nullptr) {
        if (auto st = (*ch)->engines().Detach(policy->name()); !st.ok()) {
          Die(st.status().ToString());
        }
      }
      window.store(w);
      const bool indexed = window_length.size() < ok_in.size();
      window_index.store(indexed ? static_cast<int>(window_length.size()) : -1);
      std::this_thread::sleep_until(next);
      window_seconds[w] += std::chrono::duration<double>(next - t).count();
      if (indexed) window_length.push_back(std::chrono::duration<double>(next - t).count());
      t = next;
      w ^= 1;
    }
    window_index.store(-1);
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
  result.wrong = wrong.load();
  if (x.policy != "none" && !upgrading) {
    result.ok = ok[1].load();
    result.seconds = window_seconds[1];
    result.base_rate = static_cast<double>(ok[0].load()) / std::max(window_seconds[0], 1e-9);
    // Each pair of adjacent windows (without, then with the policy) gives one estimate of the
    // cost; their median is robust to a stall of the machine that falls in one window only.
    std::vector<double> pair_costs;
    for (size_t k = 0; k + 1 < window_length.size(); k += 2) {
      const double off = static_cast<double>(ok_in[k].load()) / window_length[k];
      const double on = static_cast<double>(ok_in[k + 1].load()) / window_length[k + 1];
      if (off > 0) pair_costs.push_back(1 - on / off);
    }
    if (!pair_costs.empty()) {
      result.pair_cost =
          plexus::base::Quantile(pair_costs, 0.5, plexus::base::QuantileRule::kInterpolated);
    }
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

int pb::RawServer(const pb::PeerArgs& a) {
  const absl::Duration spin = absl::Microseconds(a.spin_us);
  pb::BlockTermSignals();
  int port = 0;
  auto lfd = plexus::bench::TcpListenLoopback(&port);
  if (!lfd.ok()) Die(lfd.status().ToString());
  pb::PublishAddress(std::to_string(port));
  std::thread([fd = *lfd, spin] {
    auto c = plexus::bench::TcpAccept(fd);
    if (!c.ok()) Die(c.status().ToString());
    // Each request: its size and the reply's, then the bytes. Read as whole as they came (one
    // recv() per request, as a server of its own framing would), not field by field: the floor
    // must not pay a system call the protocols it measures do not.
    std::vector<char> in(1 << 16), out;
    size_t have = 0;
    auto fill = [&](size_t need) {
      if (need > in.size()) in.resize(need);
      while (have < need) {
        const ssize_t r =
            plexus::bench::RecvAfterSpin(*c, in.data() + have, in.size() - have, spin);
        if (r > 0) {
          have += static_cast<size_t>(r);
        } else if (r == 0 || errno != EINTR) {
          return false;
        }
      }
      return true;
    };
    while (fill(sizeof(uint32_t) * 2)) {
      uint32_t sizes[2];
      std::memcpy(sizes, in.data(), sizeof sizes);
      const size_t request = sizeof sizes + sizes[0];
      if (!fill(request)) break;
      out.resize(std::max<size_t>(sizes[1], 1));
      std::memcpy(out.data(), in.data() + sizeof sizes, std::min(sizes[0], sizes[1]));
      // The check every server makes (Plexus's and gRPC's say so in request_ok): a request that
      // is not the pattern gets a reply that is not either, which its client counts as wrong.
      if (!pb::PayloadMatches(in.data() + sizeof sizes, sizes[0])) out[0] ^= 0x5a;
      if (!plexus::bench::WriteFull(*c, out.data(), sizes[1]).ok()) break;
      std::memmove(in.data(), in.data() + request, have - request);
      have -= request;
    }
    close(*c);
  }).detach();
  pb::WaitForTermSignal();
  std::_Exit(0);
}

int pb::RawClient(const pb::PeerArgs& a) {
  int port = 0;
  if (!absl::SimpleAtoi(a.address, &port)) Die("raw client: bad --address " + a.address);
  auto fd = plexus::bench::TcpConnectLoopback(port);
  if (!fd.ok()) Die(fd.status().ToString());
  std::vector<char> req(sizeof(uint32_t) * 2 + a.size), resp(a.reply);
  const uint32_t sizes[2] = {a.size, a.reply};
  std::memcpy(req.data(), sizes, sizeof sizes);
  const std::string payload = pb::RequestPayload(a.size);
  std::memcpy(req.data() + sizeof sizes, payload.data(), payload.size());
  const absl::Duration spin = absl::Microseconds(a.spin_us);
  pb::ClientResult result;
  pb::Phases phases(a.seconds);
  while (true) {
    const auto t0 = Clock::now();
    if (auto s = plexus::bench::WriteFull(*fd, req.data(), req.size()); !s.ok()) Die(s.ToString());
    if (auto s = plexus::bench::ReadFull(*fd, resp.data(), resp.size(), spin); !s.ok()) {
      Die(s.ToString());
    }
    const auto t1 = Clock::now();
    if (phases.Over(t1)) break;
    if (!phases.Measuring(t1)) continue;
    ++result.ok;
    result.bytes += a.size;
    result.latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    result.wrong += !pb::ReplyMatches(resp.data(), resp.size(), a.size, a.reply);
  }
  result.seconds = phases.seconds();
  close(*fd);
  pb::PrintResult(std::move(result));
  return 0;
}
