// Multipath channels across a real shaped bed (tools/netbed: two network namespaces joined by
// veth pairs with tbf rates): exact data over three paths, a link taken down and a path
// blackholed mid-transfer with no byte lost or duplicated, then the path restored, re-added and
// used again. Needs root; skips (exit 77) with the reason otherwise.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel_support.hpp"
#include "multipath_bed.hpp"
#include "support/skip.hpp"

namespace pm = plexus::multipath;
namespace nb = plexus::netbed;
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

}  // namespace

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
