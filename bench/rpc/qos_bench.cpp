// The global QoS figure of plexus-bench-rpc (see qos_bench.hpp).
#include "qos_bench.hpp"
#include "plexus/base/quantile.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "echo.plexus.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/qos.hpp"
#include "plexus/rpc/server.hpp"
#include "plexus/transport/device.hpp"
#include "plexus_peer.hpp"

namespace plexus::benchrpc {
namespace {

namespace pr = plexus::rpc;
namespace pt = plexus::transport;

[[noreturn]] void Fail(const std::string& what) { Die(absl::StrCat("qos: ", what)); }

// A handler whose service time grows with the request: it reads the payload `passes` times.
class WorkingEcho : public EchoService::Service {
 public:
  explicit WorkingEcho(uint32_t passes) : passes_(passes) {}
  absl::Status Echo(pr::ServerContext&, const EchoRequest& req, EchoReply* resp) override {
    uint64_t sum = 0;
    for (uint32_t p = 0; p < passes_; ++p) {
      for (uint8_t b : req.payload) sum = sum * 31 + b;
    }
    sink_.fetch_add(sum, std::memory_order_relaxed);
    resp->payload = req.payload.subspan(0, std::min<size_t>(req.reply_bytes, req.payload.size()));
    return absl::OkStatus();
  }

 private:
  uint32_t passes_;
  std::atomic<uint64_t> sink_{0};
};

double Quantile(std::vector<double> v, double q) {
  return v.empty() ? NAN : plexus::base::Quantile(std::move(v), q);
}

// A tcp 127.0.0.1 device and a started server on it serving `impl`.
struct Bed {
  std::shared_ptr<pt::Device> device;
  std::unique_ptr<pr::Server> server;
  Bed(WorkingEcho* impl) {
    auto d = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
    if (!d.ok()) Fail(d.status().ToString());
    device = *d;
    auto s = pr::Server::Create(device, {.address = "127.0.0.1:0"});
    if (!s.ok()) Fail(s.status().ToString());
    server = std::move(*s);
    // Its work is on the CPU, never blocked: it runs where the QoS queue hands it over.
    if (auto st = server->Register(impl, {"Echo"}); !st.ok()) Fail(st.ToString());
    if (auto st = server->Start(); !st.ok()) Fail(st.ToString());
  }
  std::shared_ptr<pr::Channel> Connect(size_t window = 0) {
    auto c = pr::Channel::Connect(device, server->address(), {&EchoService::Descriptor()},
                                  {.max_in_flight = window});
    if (!c.ok()) Fail(c.status().ToString());
    return *c;
  }
};

std::shared_ptr<pr::QosPolicy> SmallFirst() {
  pr::QosOptions qo;
  qo.small_bytes = 1024;
  qo.schedule.max_concurrent = 1;
  auto qos = pr::QosPolicy::Create("qos", qo);
  if (!qos.ok()) Fail(qos.status().ToString());
  return *qos;
}

// What both mixes share: the counters of the bulk load, and the measured window with a small
// caller making one call at a time.
struct Mix {
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<uint64_t> failed{0}, bulk_done{0};

  // With the bulk load running: a warm-up, then `o.seconds` measured while a small caller calls
  // on `small_ch`, then stop; `drain` waits for the bulk load to end.
  QosMixSample Measure(const QosMixOptions& o, const std::shared_ptr<pr::Channel>& small_ch,
                       const std::function<void()>& drain) {
    std::vector<double> lat;
    std::thread small([&] {
      std::vector<uint8_t> payload(o.small_bytes, 1);
      EchoRequest req;
      req.payload = pr::Bytes(payload.data(), payload.size());
      req.reply_bytes = o.small_bytes;
      EchoService::Stub stub(small_ch);
      pr::CallOptions opts;
      opts.timeout = absl::Seconds(30);
      while (!stop.load()) {
        const bool counted = measuring.load();
        const absl::Time t0 = absl::Now();
        auto r = stub.EchoSync(req, opts);
        const absl::Duration d = absl::Now() - t0;
        if (!r.ok()) {
          ++failed;
          continue;
        }
        if (counted && measuring.load()) lat.push_back(absl::ToDoubleMicroseconds(d));
      }
    });
    absl::SleepFor(absl::Milliseconds(200));  // warm-up: the bulk load builds its backlog
    measuring = true;
    const absl::Time t0 = absl::Now();
    absl::SleepFor(absl::Seconds(o.seconds));
    measuring = false;
    const double spent = absl::ToDoubleSeconds(absl::Now() - t0);
    stop = true;
    small.join();
    drain();
    QosMixSample s;
    s.small_median_us = Quantile(lat, 0.5);
    s.small_p99_us = Quantile(lat, 0.99);
    s.small_calls = static_cast<double>(lat.size());
    s.bulk_rate = static_cast<double>(bulk_done.load()) / spent;
    s.failed = failed.load();
    return s;
  }
};

}  // namespace

QosMixSample RunQosMix(const QosMixOptions& o) {
  WorkingEcho impl(o.work_passes);
  Bed bed(&impl);
  std::shared_ptr<pr::QosPolicy> qos = SmallFirst();
  if (o.qos && !bed.server->engines().Attach(qos).ok()) Fail("attach qos");
  auto bulk_ch = bed.Connect();
  auto small_ch = bed.Connect();

  Mix mix;
  // Bulk: `bulk_inflight` calls kept in flight, each re-issued from its completion.
  std::vector<uint8_t> bulk_payload(o.bulk_bytes, 7);
  EchoRequest bulk_req;
  bulk_req.payload = pr::Bytes(bulk_payload.data(), bulk_payload.size());
  EchoService::Stub bulk_stub(bulk_ch);
  std::atomic<int> bulk_outstanding{0};
  pr::CallOptions opts;
  opts.timeout = absl::Seconds(30);
  std::function<void()> issue = [&] {
    ++bulk_outstanding;
    bulk_stub.Echo(bulk_req, opts, [&](absl::StatusOr<pr::Reply<EchoReply>> r) {
      if (!r.ok()) ++mix.failed;
      if (mix.measuring.load()) ++mix.bulk_done;
      --bulk_outstanding;
      if (!mix.stop.load()) issue();
    });
  };
  for (int i = 0; i < o.bulk_inflight; ++i) issue();

  QosMixSample s = mix.Measure(o, small_ch, [&] {
    while (bulk_outstanding.load() > 0) absl::SleepFor(absl::Milliseconds(1));
  });
  bulk_ch->Close();
  small_ch->Close();
  bed.server->Shutdown();
  return s;
}

QosMixSample RunClientQosMix(const QosMixOptions& o) {
  WorkingEcho impl(o.work_passes);
  Bed bed(&impl);
  auto ch = bed.Connect(o.window);
  if (o.qos && !ch->engines().Attach(SmallFirst()).ok()) Fail("attach qos");
  Mix mix;
  std::vector<uint8_t> bulk_payload(o.bulk_bytes, 7);
  std::vector<std::thread> bulk;
  for (int i = 0; i < o.bulk_inflight; ++i) {
    bulk.emplace_back([&] {
      EchoRequest req;
      req.payload = pr::Bytes(bulk_payload.data(), bulk_payload.size());
      EchoService::Stub stub(ch);
      pr::CallOptions opts;
      opts.timeout = absl::Seconds(30);
      while (!mix.stop.load()) {
        auto r = stub.EchoSync(req, opts);
        if (!r.ok()) ++mix.failed;
        if (mix.measuring.load()) ++mix.bulk_done;
      }
    });
  }
  QosMixSample s = mix.Measure(o, ch, [&] {
    for (auto& t : bulk) t.join();
  });
  ch->Close();
  bed.server->Shutdown();
  return s;
}

}  // namespace plexus::benchrpc
