// Multipath channels across a real shaped bed (tools/netbed: two network namespaces joined by
// veth pairs with tbf rates): exact data over three paths, a link taken down and a path
// blackholed mid-transfer with no byte lost or duplicated, then the path restored, re-added and
// used again; and MultipathDevice connections whose path (path 1 = set-up's path 0, or another)
// goes down mid-transfer and, once restored, comes back and carries bytes with no application
// call. Needs root; skips (exit 77) with the reason otherwise.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel_support.hpp"
#include "multipath_bed.hpp"
#include "plexus/multipath/device.hpp"
#include "support/skip.hpp"

namespace pm = plexus::multipath;
namespace nb = plexus::netbed;
namespace pt = plexus::transport;
using namespace plexus::multipath::testing;  // NOLINT: test helpers

namespace {

std::unique_ptr<nb::Bed> MakeBed(const std::vector<int>& rates) {
  static int serial = 0;
  const std::string why = nb::WhyNoBed();
  if (!why.empty()) plexus::testing::SkipTest(why);
  auto bed =
      nb::Bed::Create(PLEXUS_NETBED_SCRIPT, absl::StrCat("mpt", getpid(), "x", serial++), rates);
  if (!bed.ok()) plexus::testing::SkipTest(bed.status().ToString());
  return std::move(*bed);
}

std::unique_ptr<nb::BedChannels> Channels(nb::Bed& bed) {
  pm::ChannelOptions options;
  options.path_timeout = absl::Milliseconds(500);  // slack for a loaded CI machine
  auto ch = nb::BedChannels::Create(bed, options);
  REQUIRE(ch.ok());
  for (size_t k = 1; k <= bed.paths(); ++k) REQUIRE((*ch)->Connect(k).ok());
  REQUIRE((*ch)->WaitLive(static_cast<int>(bed.paths())).ok());
  return std::move(*ch);
}

// A MultipathDevice per namespace and one connection between them over every path of the bed
// (b listens, a connects), with path revival on (the default).
struct BedDevices {
  std::shared_ptr<pm::MultipathDevice> dev_a, dev_b;
  pt::CompletionQueue cq_a, cq_b;
  std::unique_ptr<pt::Connection> a, b;
  pm::MultipathChannel* ch_a = nullptr;
  pm::MultipathChannel* ch_b = nullptr;
};

std::unique_ptr<BedDevices> Devices(nb::Bed& bed) {
  auto out = std::make_unique<BedDevices>();
  auto options = [&](char side) {
    pm::MultipathDeviceOptions o;
    for (size_t k = 1; k <= bed.paths(); ++k)
      o.local_addresses.push_back(nb::Bed::Address(side, k));
    o.channel.path_timeout = absl::Milliseconds(500);  // slack for a loaded CI machine
    o.channel.max_reconnect_backoff = absl::Milliseconds(500);
    o.device.connect_timeout = absl::Seconds(3);
    o.device.op_timeout = absl::Seconds(20);
    return o;
  };
  std::unique_ptr<pt::Listener> listener;
  REQUIRE(nb::InNetns(bed.ns('b'), [&]() -> absl::Status {
            PLEXUS_ASSIGN_OR_RETURN(out->dev_b, pm::MultipathDevice::Create(options('b')));
            PLEXUS_ASSIGN_OR_RETURN(listener, out->dev_b->Listen(""));
            return absl::OkStatus();
          }).ok());
  absl::Status accepted;
  std::thread acceptor([&] {
    accepted = nb::InNetns(bed.ns('b'), [&]() -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(out->b, listener->Accept(&out->cq_b, absl::Seconds(10)));
      return absl::OkStatus();
    });
  });
  const absl::Status connected = nb::InNetns(bed.ns('a'), [&]() -> absl::Status {
    PLEXUS_ASSIGN_OR_RETURN(out->dev_a, pm::MultipathDevice::Create(options('a')));
    PLEXUS_ASSIGN_OR_RETURN(out->a, out->dev_a->Connect(listener->address(), &out->cq_a));
    return absl::OkStatus();
  });
  acceptor.join();
  INFO(connected.ToString() << " / " << accepted.ToString());
  REQUIRE(connected.ok());
  REQUIRE(accepted.ok());
  out->ch_a = pm::MultipathDevice::ChannelOf(*out->a);
  out->ch_b = pm::MultipathDevice::ChannelOf(*out->b);
  return out;
}

// Whether `lane` has a live path on this side.
bool LaneUp(const pm::MultipathChannel& ch, int lane) {
  for (const auto& p : ch.Stats().paths) {
    if (p.lane == lane && p.up) return true;
  }
  return false;
}

// Payload bytes sent over paths revived on `lane` (a revived path has a new index).
uint64_t RevivedBytes(const pm::MultipathChannel& ch, int lane) {
  uint64_t bytes = 0;
  for (const auto& p : ch.Stats().paths) {
    if (p.lane == lane && p.index != lane) bytes += p.bytes_acked;
  }
  return bytes;
}

// Path `k` (1-based; lane k-1) of a device connection goes down (link down or blackhole) while
// 128 MiB stream a -> b; traffic goes on over the others; the path is restored 0.3 s after
// this side saw it die and must be up again on both sides within 6 s and carry chunks of the
// same stream (or of the one after it), with no call from the test. Every byte is checked.
void ReviveMidTransfer(size_t k, const std::string& event) {
  auto bed = MakeBed({200, 400, 100});
  auto link = Devices(*bed);
  const int lane = static_cast<int>(k) - 1;
  absl::Duration revived_after = absl::InfiniteDuration();
  SendAndCheck(*link->ch_a, *link->ch_b, link->cq_a, link->cq_b,
               std::vector<size_t>(32, (size_t{4} << 20) + 7), 20, [&](size_t i) {
                 if (i == 0) {
                   WaitBytesAcked(*link->ch_a, 4 << 20);
                   REQUIRE(bed->Run({event, std::to_string(k)}).ok());
                 } else if (i == 1) {
                   const absl::Time deadline = absl::Now() + absl::Seconds(10);
                   while (LaneUp(*link->ch_a, lane) && absl::Now() < deadline) {
                     absl::SleepFor(absl::Milliseconds(2));
                   }
                   REQUIRE_FALSE(LaneUp(*link->ch_a, lane));
                   absl::SleepFor(absl::Milliseconds(300));
                   // Timed from the restore command's start: the path may come back while the
                   // script still shapes the link.
                   const absl::Time restored = absl::Now();
                   REQUIRE(bed->Run({"restore", std::to_string(k)}).ok());
                   while (!(LaneUp(*link->ch_a, lane) && LaneUp(*link->ch_b, lane)) &&
                          absl::Now() - restored < absl::Seconds(6)) {
                     absl::SleepFor(absl::Milliseconds(2));
                   }
                   revived_after = absl::Now() - restored;
                 }
               });
  INFO("a: " << link->ch_a->Stats().last_redial_error
             << "; b: " << link->ch_b->Stats().last_redial_error);
  INFO("lane " << lane << " up again " << absl::FormatDuration(revived_after)
               << " after the restore");
  REQUIRE(revived_after < absl::Seconds(6));
  CHECK(link->a->status().ok());
  CHECK(link->b->status().ok());
  CHECK(link->ch_a->Stats().paths_revived >= 1);
  // The revived path carries chunks (of the stream above, or of this one).
  SendAndCheck(*link->ch_a, *link->ch_b, link->cq_a, link->cq_b, {size_t{16} << 20}, 21);
  CHECK(RevivedBytes(*link->ch_a, lane) > 0);
  CHECK(link->ch_a->live_paths() == 3);
  CHECK(link->ch_b->live_paths() == 3);
}

}  // namespace

TEST_CASE("netns: device path 2 link down mid-transfer, revived by itself after the restore",
          "[netns][revive]") {
  ReviveMidTransfer(2, "link-down");
}

TEST_CASE("netns: device path 1 (set-up's path 0) link down mid-transfer, revived by itself",
          "[netns][revive]") {
  ReviveMidTransfer(1, "link-down");
}

TEST_CASE("netns: device path 2 blackholed mid-transfer, revived by itself after the restore",
          "[netns][revive]") {
  ReviveMidTransfer(2, "blackhole");
}

TEST_CASE("netns: exact data over three shaped paths", "[netns]") {
  auto bed = MakeBed({200, 400, 100});
  auto ch = Channels(*bed);
  SendAndCheck(*ch->a, *ch->b, ch->cq_a, ch->cq_b, {1, 50001, (size_t{24} << 20) + 5}, 1);
  for (const auto& p : ch->a->Stats().paths) CHECK(p.bytes_acked > 0);
}

TEST_CASE("netns: link down mid-transfer, no loss or duplication; restored path reused",
          "[netns]") {
  auto bed = MakeBed({200, 400, 100});
  auto ch = Channels(*bed);
  const size_t n = size_t{16} << 20;
  SendAndCheck(*ch->a, *ch->b, ch->cq_a, ch->cq_b, {n, n}, 2, [&](size_t i) {
    if (i == 0) {
      WaitBytesAcked(*ch->a, 2 << 20);
      REQUIRE(bed->Run({"link-down", "2"}).ok());
    }
  });
  const auto stats = ch->a->Stats();
  CHECK_FALSE(stats.paths[1].up);
  CHECK(stats.paths[0].up);
  CHECK(stats.paths[2].up);
  REQUIRE(bed->Run({"restore", "2"}).ok());
  auto revived = ch->Connect(2);
  REQUIRE(revived.ok());
  REQUIRE(ch->WaitLive(3).ok());
  SendAndCheck(*ch->a, *ch->b, ch->cq_a, ch->cq_b, {n}, 3);
  CHECK(ch->a->Stats().paths[*revived].bytes_acked > 0);
}

TEST_CASE("netns: blackhole mid-transfer, no loss or duplication; restored path reused",
          "[netns]") {
  auto bed = MakeBed({200, 400, 100});
  auto ch = Channels(*bed);
  const size_t n = size_t{16} << 20;
  SendAndCheck(*ch->a, *ch->b, ch->cq_a, ch->cq_b, {n, n}, 4, [&](size_t i) {
    if (i == 0) {
      WaitBytesAcked(*ch->a, 2 << 20);
      REQUIRE(bed->Run({"blackhole", "2"}).ok());
    }
  });
  const auto stats = ch->a->Stats();
  CHECK_FALSE(stats.paths[1].up);
  // Either side may notice the silence first: this one by its timeout, or the peer, which then
  // tells this side to close the path.
  INFO(stats.paths[1].error);
  CHECK((stats.paths[1].error.find("no progress") != std::string::npos ||
         stats.paths[1].error.find("peer declared this path dead") != std::string::npos));
  // Bytes the dead path still held must never land later: restore it and send more; the
  // receiver closed its end before the first transfer completed.
  REQUIRE(bed->Run({"restore", "2"}).ok());
  auto revived = ch->Connect(2);
  REQUIRE(revived.ok());
  REQUIRE(ch->WaitLive(3).ok());
  SendAndCheck(*ch->a, *ch->b, ch->cq_a, ch->cq_b, {n}, 5);
  CHECK(ch->a->Stats().paths[*revived].bytes_acked > 0);
}
