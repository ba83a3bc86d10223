// A tour of plexus::transport. Run it with two local ranks:
//
//   build/tools/plexus-run -n 2 build/examples/transport-tour
//
// For every backend this machine has, the two ranks connect through the rendezvous store,
// exchange greetings, do a one-sided write with an immediate, and measure a ping-pong and a
// bulk transfer. Rank 0 prints what it saw.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "plexus/transport/device.hpp"
#include "plexus/transport/mesh.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pt = plexus::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  std::string backend;
  std::string greeting;
  bool write_ok = false;
  double pingpong_us = 0;
  double bandwidth_gbs = 0;
};

absl::StatusOr<pt::Completion> Next(pt::CompletionQueue& cq) {
  absl::StatusOr<pt::Completion> c = cq.Wait(absl::Seconds(30), absl::Microseconds(100));
  if (c.ok() && !c->status.ok()) return c->status;
  return c;
}

#define TOUR_TRY(expr)                                 \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

absl::StatusOr<Result> Tour(pt::Rendezvous& rdv, pt::Backend backend) {
  Result result;
  result.backend = std::string(pt::BackendName(backend));
  pt::DeviceOptions options;
  options.backend = backend;
  options.progress = pt::ProgressMode::kCaller;
  if (backend == pt::Backend::kTcp) options.local_address = "127.0.0.1";
  absl::StatusOr<std::shared_ptr<pt::Device>> device = pt::Device::Create(options);
  if (!device.ok()) return device.status();
  auto cq = (*device)->CreateCompletionQueue();
  auto mesh = pt::ConnectFullMesh(rdv, **device, cq.get(), "tour", absl::Seconds(30));
  if (!mesh.ok()) return mesh.status();
  const int peer = 1 - rdv.rank();
  pt::Connection& conn = *(*mesh)[peer];

  // 1. Greetings, both ways.
  const std::string hello = fmt::format("hello from rank {} over {}", rdv.rank(), result.backend);
  char inbox[128] = {};
  TOUR_TRY(conn.PostRecv({inbox, sizeof inbox}, 1));
  TOUR_TRY(conn.PostSend(pt::ConstBuffer{hello.data(), hello.size()}, 2));
  for (int i = 0; i < 2; ++i) {
    auto c = Next(*cq);
    if (!c.ok()) return c.status();
    if (c->opcode == pt::Opcode::kRecv) result.greeting.assign(inbox, c->bytes);
  }

  // 2. One-sided write: rank 1 exposes a region, rank 0 writes into it with an immediate.
  std::vector<uint8_t> region(1 << 20, 0);
  auto mr = (*device)->Register(region.data(), region.size());
  if (!mr.ok()) return mr.status();
  const auto encoded = (*mr)->handle().Encode();
  auto handles = rdv.AllGather("tour/region/" + result.backend,
                               std::string(encoded.begin(), encoded.end()), absl::Seconds(30));
  if (!handles.ok()) return handles.status();
  const std::string& theirs = (*handles)[peer];
  auto remote = pt::RegionHandle::Decode(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(theirs.data()), theirs.size()));
  if (!remote.ok()) return remote.status();
  if (rdv.rank() == 0) {
    for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<uint8_t>(i * 31);
    TOUR_TRY(conn.PostWrite(**mr, 0, region.size(), *remote, 0, 0x7043u, 3));
    auto c = Next(*cq);
    if (!c.ok()) return c.status();
    result.write_ok = c->opcode == pt::Opcode::kWrite;
  } else {
    auto c = Next(*cq);
    if (!c.ok()) return c.status();
    result.write_ok = c->opcode == pt::Opcode::kRemoteWrite && c->immediate == 0x7043u;
    for (size_t i = 0; i < region.size() && result.write_ok; ++i) {
      result.write_ok = region[i] == static_cast<uint8_t>(i * 31);
    }
  }
  TOUR_TRY(rdv.Barrier("tour/written/" + result.backend, absl::Seconds(30)));

  // 3. Ping-pong, 64 bytes each way, 2000 round trips.
  char ping[64] = {};
  std::vector<double> us;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = Clock::now();
    TOUR_TRY(conn.PostRecv({ping, sizeof ping}, 4));
    if (rdv.rank() == 0) TOUR_TRY(conn.PostSend(pt::ConstBuffer{ping, sizeof ping}, 5));
    int need = 2;
    while (need > 0) {
      auto c = Next(*cq);
      if (!c.ok()) return c.status();
      --need;
      if (rdv.rank() == 1 && c->opcode == pt::Opcode::kRecv) {
        TOUR_TRY(conn.PostSend(pt::ConstBuffer{ping, sizeof ping}, 5));
      }
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  result.pingpong_us = us[us.size() / 2];

  // 4. Bulk: rank 0 sends 32 messages of 8 MiB.
  constexpr size_t kBytes = 8 << 20;
  constexpr int kCount = 32;
  std::vector<uint8_t> bulk(kBytes, 1);
  const auto t0 = Clock::now();
  for (int i = 0; i < kCount; ++i) {
    if (rdv.rank() == 0) {
      TOUR_TRY(conn.PostSend(pt::ConstBuffer{bulk.data(), kBytes}, 6));
    } else {
      TOUR_TRY(conn.PostRecv({bulk.data(), kBytes}, 6));
    }
    auto c = Next(*cq);
    if (!c.ok()) return c.status();
  }
  TOUR_TRY(rdv.Barrier("tour/bulk/" + result.backend, absl::Seconds(30)));
  result.bandwidth_gbs =
      kBytes * kCount / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  return result;
}

}  // namespace

int main() {
  absl::StatusOr<pt::Rendezvous> rdv = pt::Rendezvous::FromEnv(absl::Seconds(60));
  if (!rdv.ok()) {
    fmt::print(stderr, "transport_tour: {}\n", std::string(rdv.status().ToString()));
    fmt::print(stderr, "run it as: build/tools/plexus-run -n 2 build/examples/transport-tour\n");
    return 1;
  }
  if (rdv->world_size() != 2) {
    fmt::print(stderr, "transport_tour needs exactly 2 ranks (got {})\n", rdv->world_size());
    return 1;
  }
  if (rdv->rank() == 0) {
    fmt::print("plexus transport tour: 2 ranks ({})\n", rdv->source());
  }
  std::vector<Result> results;
  bool failed = false;
  for (pt::Backend backend : {pt::Backend::kShm, pt::Backend::kTcp, pt::Backend::kVerbs}) {
    std::string why;
    if (!pt::Device::Available(backend, &why)) {
      if (rdv->rank() == 0) {
        fmt::print("  {:<6} skipped: {}\n", pt::BackendName(backend), why);
      }
      continue;
    }
    absl::StatusOr<Result> r = Tour(*rdv, backend);
    if (!r.ok()) {
      fmt::print(stderr, "  {:<6} FAILED: {}\n", pt::BackendName(backend),
                 std::string(r.status().ToString()));
      failed = true;
      break;
    }
    results.push_back(*r);
  }
  if (rdv->rank() == 0) {
    fmt::print("\n  {:<6} {:<34} {:<14} {:>14} {:>12}\n", "path", "greeting received",
               "1 MiB write", "ping-pong p50", "bulk");
    for (const Result& r : results) {
      fmt::print("  {:<6} {:<34} {:<14} {:>11.1f} us {:>7.2f} GB/s\n", r.backend, r.greeting,
                 r.write_ok ? "placed+imm" : "WRONG", r.pingpong_us, r.bandwidth_gbs);
    }
    fmt::print("\n(ping-pong: caller-driven progress, spinning up to 100 us; unpinned)\n");
  }
  for (const Result& r : results) failed |= !r.write_ok;
  return failed ? 1 : 0;
}
