// Multipath over RDMA verbs on real (or soft-RoCE) hardware: two paths between two verbs devices
// of one process, each path's queue pairs on their own source GID and flow label (checked with
// ibv_query_qp), an explicit GID index accepted or refused against the port's table, and a
// MultipathDevice over two verbs paths moving exact data on both.
//
// Where the paths come from:
// - PLEXUS_VERBS_PATH_ADDRESSES="A0,A1" (or "A0,A1;B0,B1"): local IPs of one RDMA device's
//   interfaces; side a uses A0/A1, side b B0/B1 (default: the same, loopback through the NIC).
// - otherwise, as root with no RDMA device: the test creates a soft-RoCE device on the loopback
//   interface (`rdma link add plexus_rxe_t type rxe netdev lo`, after `modprobe rdma_rxe`) with
//   the addresses 10.251.{0,1}.{1,2}/32 on lo, and removes both when it ends.
// Otherwise it prints why and exits 77 (skipped).
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "channel_support.hpp"
#include "netbed.hpp"
#include "plexus/multipath/device.hpp"
#include "plexus/transport/device.hpp"
#include "support/skip.hpp"
#include "verbs_path_info.hpp"
#if PLEXUS_TEST_HAVE_VERBS
#include "verbs/verbs_loader.hpp"
#endif

namespace pm = plexus::multipath;
namespace pt = plexus::transport;
namespace nb = plexus::netbed;
using plexus::multipath::testing::Pattern;
using plexus::transport::internal::DescribeVerbsPath;
using plexus::transport::internal::VerbsPathInfo;

namespace {

constexpr const char* kRxeName = "plexus_rxe_t";

// The addresses of the two paths on each side, and what the test set up to have them.
struct VerbsBed {
  std::vector<std::string> a, b;
  bool created_rxe = false;
  std::vector<std::string> added;  // "10.251.0.1/32" on lo
  std::string skip;                // why the hardware tests cannot run

  ~VerbsBed() { Remove(); }
  void Remove() {
    if (created_rxe) (void)nb::RunCommand({"rdma", "link", "delete", kRxeName}, true);
    created_rxe = false;
    for (const std::string& address : added) {
      (void)nb::RunCommand({"ip", "addr", "del", address, "dev", "lo"}, true);
    }
    added.clear();
  }
};

void SetUp(VerbsBed& bed) {
  if (const char* env = std::getenv("PLEXUS_VERBS_PATH_ADDRESSES")) {
    std::vector<std::string> sides = absl::StrSplit(env, ';');
    bed.a = absl::StrSplit(sides[0], ',');
    bed.b = sides.size() > 1 ? std::vector<std::string>(absl::StrSplit(sides[1], ',')) : bed.a;
    if (bed.a.size() != 2 || bed.b.size() != 2) {
      bed.skip = absl::StrCat("PLEXUS_VERBS_PATH_ADDRESSES='", env,
                              "' must name two IPs per side: \"A0,A1\" or \"A0,A1;B0,B1\"");
      return;
    }
    std::string why;
    if (!pt::Device::Available(pt::Backend::kVerbs, &why)) bed.skip = why;
    return;
  }
  std::string why;
#if PLEXUS_TEST_HAVE_VERBS
  // Without rdma-core's libraries a soft-RoCE device would not help.
  if (!pt::internal::VerbsLibrariesLoaded(&why)) {
    bed.skip = why;
    return;
  }
#else
  bed.skip = "Plexus was built without RDMA verbs (PLEXUS_WITH_VERBS=OFF)";
  return;
#endif
  if (pt::Device::Available(pt::Backend::kVerbs, &why)) {
    bed.skip =
        "an RDMA device exists, but PLEXUS_VERBS_PATH_ADDRESSES is not set: set it to two local "
        "IPs of that device's interfaces (\"A0,A1\"), one per path";
    return;
  }
  if (geteuid() != 0) {
    bed.skip = absl::StrCat(why, "; not root, so no soft-RoCE device was created (as root the ",
                            "test runs `rdma link add ", kRxeName, " type rxe netdev lo`)");
    return;
  }
  (void)nb::RunCommand({"modprobe", "rdma_rxe"}, true);              // may be built in, or absent
  (void)nb::RunCommand({"rdma", "link", "delete", kRxeName}, true);  // a killed run's leftover
  for (int k = 0; k < 2; ++k) {
    for (int side = 1; side <= 2; ++side) {
      const std::string ip = absl::StrCat("10.251.", k, ".", side);
      (void)nb::RunCommand({"ip", "addr", "del", ip + "/32", "dev", "lo"}, true);
      if (absl::Status s = nb::RunCommand({"ip", "addr", "add", ip + "/32", "dev", "lo"});
          !s.ok()) {
        bed.skip = absl::StrCat(why, "; adding ", ip, " to lo failed: ", s.message());
        return;
      }
      bed.added.push_back(ip + "/32");
      (side == 1 ? bed.a : bed.b).push_back(ip);
    }
  }
  if (absl::Status s =
          nb::RunCommand({"rdma", "link", "add", kRxeName, "type", "rxe", "netdev", "lo"});
      !s.ok()) {
    bed.skip = absl::StrCat(why, "; creating a soft-RoCE device failed (", s.message(),
                            "): it needs the rdma_rxe kernel module and iproute2's rdma tool");
    return;
  }
  bed.created_rxe = true;
  // The GID table fills from the interface's addresses shortly after the device appears.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!pt::Device::Available(pt::Backend::kVerbs, &why) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!pt::Device::Available(pt::Backend::kVerbs, &why)) {
    bed.skip = absl::StrCat("soft-RoCE device ", kRxeName, " created, but: ", why);
    return;
  }
  absl::SleepFor(absl::Milliseconds(500));
}

const VerbsBed& Bed() {
  static VerbsBed bed;
  static const bool ready = [] {
    SetUp(bed);
    return true;
  }();
  (void)ready;
  if (!bed.skip.empty()) {
    bed.Remove();  // SkipTest ends the process without destructors
    plexus::testing::SkipTest(bed.skip);
  }
  return bed;
}

pt::DeviceOptions VerbsOptions(const std::string& address) {
  pt::DeviceOptions o;
  o.backend = pt::Backend::kVerbs;
  o.local_address = address;  // picks the RDMA device holding it
  o.op_timeout = absl::Seconds(10);
  o.connect_timeout = absl::Seconds(10);
  return o;
}

pt::PathBinding Binding(const std::string& address, int gid_index, uint32_t flow_label) {
  pt::PathBinding b;
  b.local_address = address;
  b.gid_index = gid_index;
  b.flow_label = flow_label;
  return b;
}

struct PathPair {
  std::unique_ptr<pt::Connection> a, b;
};

// Connects a (binding `from`) to a listener of b's on `at`, whose accepted end takes `at`.
PathPair Connect(pt::Device& a, pt::CompletionQueue* cq_a, const pt::PathBinding& from,
                 pt::Device& b, pt::CompletionQueue* cq_b, const pt::PathBinding& at) {
  auto listener = b.ListenOnPath(at, "");
  INFO(listener.status().ToString());
  REQUIRE(listener.ok());
  const std::string address = (*listener)->address();
  auto connecting =
      std::async(std::launch::async, [&] { return a.ConnectOnPath(from, address, cq_a); });
  auto accepted = (*listener)->Accept(cq_b, absl::Seconds(15));
  auto connected = connecting.get();
  INFO(accepted.status().ToString() << " / " << connected.status().ToString());
  REQUIRE(accepted.ok());
  REQUIRE(connected.ok());
  return {std::move(*connected), std::move(*accepted)};
}

VerbsPathInfo Describe(const pt::Connection& c) {
  auto info = DescribeVerbsPath(c);
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  return *info;
}

// One message from `from` to `to`, every byte checked.
void Exchange(pt::Connection& from, pt::CompletionQueue& from_cq, pt::Connection& to,
              pt::CompletionQueue& to_cq, size_t bytes, uint32_t seed) {
  const std::vector<uint8_t> src = Pattern(bytes, seed);
  std::vector<uint8_t> dst(bytes, 0);
  REQUIRE(to.PostRecv({dst.data(), dst.size()}, 1).ok());
  REQUIRE(from.PostSend(pt::ConstBuffer{src.data(), src.size()}, 2).ok());
  auto sent = from_cq.Wait(absl::Seconds(10));
  auto got = to_cq.Wait(absl::Seconds(10));
  REQUIRE(sent.ok());
  REQUIRE(got.ok());
  CHECK(sent->status.ok());
  CHECK(got->status.ok());
  CHECK(got->bytes == bytes);
  CHECK(dst == src);
}

}  // namespace

TEST_CASE("verbs paths: each queue pair on its path's GID and flow label", "[multipath][verbs]") {
  const VerbsBed& bed = Bed();
  auto da = pt::Device::Create(VerbsOptions(bed.a[0]));
  auto db = pt::Device::Create(VerbsOptions(bed.b[0]));
  INFO(da.status().ToString() << " / " << db.status().ToString());
  REQUIRE(da.ok());
  REQUIRE(db.ok());
  auto cq_a = (*da)->CreateCompletionQueue();
  auto cq_b = (*db)->CreateCompletionQueue();
  const uint32_t labels_a[2] = {0x1A001, 0x1A102}, labels_b[2] = {0x2B001, 0x2B102};
  std::vector<PathPair> paths;
  for (int k = 0; k < 2; ++k) {
    paths.push_back(Connect(**da, cq_a.get(), Binding(bed.a[k], -1, labels_a[k]), **db, cq_b.get(),
                            Binding(bed.b[k], -1, labels_b[k])));
  }
  VerbsPathInfo info_a[2], info_b[2];
  for (int k = 0; k < 2; ++k) {
    info_a[k] = Describe(*paths[k].a);
    info_b[k] = Describe(*paths[k].b);
    INFO("path " << k << ": a qp " << info_a[k].qp_num << " sgid " << info_a[k].sgid_index
                 << " label " << info_a[k].flow_label << " from " << info_a[k].local_address
                 << "; b qp " << info_b[k].qp_num << " sgid " << info_b[k].sgid_index << " label "
                 << info_b[k].flow_label);
    CHECK(info_a[k].state == "RTS");
    CHECK(info_b[k].state == "RTS");
    REQUIRE(info_a[k].is_global);
    REQUIRE(info_b[k].is_global);
    CHECK(info_a[k].flow_label == labels_a[k]);
    CHECK(info_b[k].flow_label == labels_b[k]);
    CHECK(absl::StartsWith(info_a[k].local_address, bed.a[k] + ":"));
    // Both directions of every path carry exact bytes.
    Exchange(*paths[k].a, *cq_a, *paths[k].b, *cq_b, (size_t{1} << 20) + 3, 10 + k);
    Exchange(*paths[k].b, *cq_b, *paths[k].a, *cq_a, 4097, 20 + k);
  }
  const bool distinct_a = bed.a[0] != bed.a[1];
  if (distinct_a) CHECK(info_a[0].sgid_index != info_a[1].sgid_index);  // one GID per address
  if (bed.b[0] != bed.b[1]) CHECK(info_b[0].sgid_index != info_b[1].sgid_index);

  // The GID chosen by address, named explicitly, is the same entry.
  PathPair again = Connect(**da, cq_a.get(), Binding(bed.a[0], info_a[0].sgid_index, 0x3C003), **db,
                           cq_b.get(), Binding(bed.b[0], -1, 0));
  CHECK(Describe(*again.a).sgid_index == info_a[0].sgid_index);
  CHECK(Describe(*again.a).flow_label == 0x3C003);
  Exchange(*again.a, *cq_a, *again.b, *cq_b, 65536, 30);

  // An index that does not hold the path's address, or is not in the table: refused before any
  // request reaches the peer, naming the field.
  auto listener = (*db)->Listen(bed.b[0] + ":0");
  REQUIRE(listener.ok());
  if (distinct_a) {
    auto wrong = (*da)->ConnectOnPath(Binding(bed.a[0], info_a[1].sgid_index, 0),
                                      (*listener)->address(), cq_a.get());
    INFO(wrong.status().ToString());
    CHECK(absl::IsInvalidArgument(wrong.status()));
    CHECK(absl::StrContains(wrong.status().message(), "not the path's local_address " + bed.a[0]));
  }
  auto missing =
      (*da)->ConnectOnPath(Binding(bed.a[0], 250, 0), (*listener)->address(), cq_a.get());
  INFO(missing.status().ToString());
  CHECK(absl::IsInvalidArgument(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), "gid_index 250 is not a valid entry"));
}

TEST_CASE("verbs paths: a MultipathDevice over two verbs paths moves exact data on both",
          "[multipath][verbs]") {
  const VerbsBed& bed = Bed();
  auto options = [](const std::vector<std::string>& addresses) {
    pm::MultipathDeviceOptions o;
    o.local_addresses = addresses;
    o.device = VerbsOptions(addresses[0]);
    o.channel.path_timeout = absl::Seconds(3);  // lenient on a loaded machine
    return o;
  };
  auto da = pm::MultipathDevice::Create(options(bed.a));
  auto db = pm::MultipathDevice::Create(options(bed.b));
  INFO(da.status().ToString() << " / " << db.status().ToString());
  REQUIRE(da.ok());
  REQUIRE(db.ok());
  CHECK((*da)->backend() == pt::Backend::kVerbs);
  pt::CompletionQueue cq_a, cq_b;
  auto listener = (*db)->Listen("");
  INFO(listener.status().ToString());
  REQUIRE(listener.ok());
  const std::string address = (*listener)->address();
  auto connecting = std::async(std::launch::async, [&] { return (*da)->Connect(address, &cq_a); });
  auto accepted = (*listener)->Accept(&cq_b, absl::Seconds(20));
  auto connected = connecting.get();
  INFO(accepted.status().ToString() << " / " << connected.status().ToString());
  REQUIRE(accepted.ok());
  REQUIRE(connected.ok());
  for (size_t bytes : {size_t{1}, size_t{50001}, (size_t{8} << 20) + 3}) {
    Exchange(**connected, cq_a, **accepted, cq_b, bytes, static_cast<uint32_t>(bytes));
  }
  const std::vector<uint64_t> acked = (*da)->PathBytesAcked();
  INFO("bytes acked per path: " << acked[0] << ", " << acked[1]);
  REQUIRE(acked.size() == 2);
  CHECK(acked[0] > 0);
  CHECK(acked[1] > 0);
}
