// Per-channel source addresses on a real bed (tools/netbed: two network namespaces joined by
// veth pairs; a socket bound to path k's address leaves through path k's veth). Two ranks, one
// per namespace, run a tcp allreduce over two channels, each channel bound to its own path's
// address (CommunicatorOptions::channel_local_addresses); the bytes each veth sent show every
// channel used its own path, and a third path none. Then both channels on one address: the
// other path stays idle. The counters are the kernel's per-interface ones (those of
// /sys/class/net/<if>/statistics), read from /proc/thread-self/net/dev inside the namespace
// (sysfs shows the namespace it was mounted in). Needs root; skips (exit 77) with the reason
// otherwise.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "netbed.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/store.hpp"
#include "support/skip.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
namespace nb = plexus::netbed;

namespace {

constexpr int kPaths = 3;

std::unique_ptr<nb::Bed> MakeBed() {
  static int serial = 0;
  const std::string why = nb::WhyNoBed();
  if (!why.empty()) plexus::testing::SkipTest(why);
  auto bed = nb::Bed::Create(PLEXUS_NETBED_SCRIPT, absl::StrCat("pcq", getpid(), "x", serial++),
                             std::vector<int>(kPaths, 2000));
  if (!bed.ok()) plexus::testing::SkipTest(bed.status().ToString());
  return std::move(*bed);
}

// tx bytes per interface of the calling thread's network namespace.
std::map<std::string, uint64_t> TxBytes() {
  std::map<std::string, uint64_t> out;
  std::ifstream in("/proc/thread-self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    std::istringstream fields(line.substr(colon + 1));
    uint64_t v[9] = {};
    for (uint64_t& x : v) fields >> x;
    out[name] = v[8];  // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes
  }
  return out;
}

// Runs a 2-rank tcp allreduce of `floats` over 2 channels, rank 0 in side a, rank 1 in side b,
// channel c of side s bound to addresses[s][c]; returns the tx bytes each side's veths sent
// during the call (index k-1: path k), or fails the test.
std::vector<std::vector<uint64_t>> RunOnBed(nb::Bed& bed,
                                            const std::vector<std::vector<std::string>>& addresses,
                                            size_t floats) {
  // A store in a directory: a tcp store on loopback cannot be reached from the namespaces.
  char dir[] = "/tmp/plexus-netns-store-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::shared_ptr<pt::Store> store;
  {
    auto opened = pt::FileStore::Open(dir);
    REQUIRE(opened.ok());
    store = *std::move(opened);
  }
  std::vector<std::string> results(2);
  std::vector<std::vector<uint64_t>> sent(2, std::vector<uint64_t>(kPaths, 0));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const char side = r == 0 ? 'a' : 'b';
      absl::Status status = nb::InNetns(bed.ns(side), [&]() -> absl::Status {
        auto rdv = pt::Rendezvous::Create(r, 2, store);
        if (!rdv.ok()) return rdv.status();
        pc::CommunicatorOptions o;
        o.device.backend = pt::Backend::kTcp;
        o.transport_policy = pc::TransportPolicy::kUniform;
        o.channels = 2;
        o.channel_local_addresses = addresses[r];
        o.timeout = absl::Seconds(30);
        o.connect_timeout = absl::Seconds(10);
        auto comm = pc::Communicator::Create(*rdv, o);
        if (!comm.ok()) return comm.status();
        std::vector<float> v(floats, static_cast<float>(r + 1));
        const auto before = TxBytes();
        absl::Status s = (*comm)->AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32,
                                            pc::ReduceOp::kSum);
        if (!s.ok()) return s;
        // After the barrier the peer has received everything this rank sent: no byte of the
        // allreduce still waits in a socket buffer, uncounted.
        PLEXUS_RETURN_IF_ERROR((*comm)->Barrier());
        const auto after = TxBytes();
        if (v.front() != 3.0f || v.back() != 3.0f) return absl::DataLossError("wrong sum");
        for (int k = 1; k <= kPaths; ++k) {
          const std::string dev = absl::StrCat(r == 0 ? "mpa" : "mpb", k);
          sent[r][k - 1] = after.at(dev) - before.at(dev);
        }
        return absl::OkStatus();
      });
      results[r] = status.ok() ? "" : status.ToString();
    });
  }
  for (auto& t : threads) t.join();
  store.reset();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < 2; ++r) INFO("rank " << r << ": " << results[r]);
  REQUIRE(results == std::vector<std::string>(2));
  return sent;
}

}  // namespace

TEST_CASE("netns: each channel leaves through the path of its source address", "[netns]") {
  auto bed = MakeBed();
  const size_t floats = size_t{4} << 20;  // 16 MiB: each rank sends 16 MiB, 8 per channel
  const uint64_t half = floats * sizeof(float) / 2;
  SECTION("two channels, two addresses: two paths") {
    const auto sent = RunOnBed(*bed,
                               {{nb::Bed::Address('a', 1), nb::Bed::Address('a', 2)},
                                {nb::Bed::Address('b', 1), nb::Bed::Address('b', 2)}},
                               floats);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << " sent " << sent[r][0] << " / " << sent[r][1] << " / " << sent[r][2]);
      CHECK(sent[r][0] >= half);
      CHECK(sent[r][1] >= half);
      CHECK(sent[r][2] < 64 * 1024);  // path 3: no channel's address
    }
  }
  SECTION("two channels, one address: one path") {
    const auto sent = RunOnBed(*bed,
                               {{nb::Bed::Address('a', 2), nb::Bed::Address('a', 2)},
                                {nb::Bed::Address('b', 2), nb::Bed::Address('b', 2)}},
                               floats);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << " sent " << sent[r][0] << " / " << sent[r][1] << " / " << sent[r][2]);
      CHECK(sent[r][0] < 64 * 1024);
      CHECK(sent[r][1] >= 2 * half);
      CHECK(sent[r][2] < 64 * 1024);
    }
  }
}
