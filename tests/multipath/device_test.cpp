// MultipathDevice through the transport::Device / Connection interfaces only: K = 2 loopback
// paths per side (127.0.0.x sources, no root needed), exact data at several sizes, unaligned and
// gathered, one completion per operation carrying the Connection's id, a path failed
// mid-transfer (path 1 on the connector, path 0 on the listener) and revived by itself, Close on
// either side, and errors for malformed composite addresses.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "channel_support.hpp"
#include "channel_test_access.hpp"
#include "plexus/multipath/device.hpp"
#include "plexus/transport/device.hpp"
#include "support/skip.hpp"

namespace pm = plexus::multipath;
namespace pt = plexus::transport;
namespace pmi = plexus::multipath::internal;
using plexus::multipath::testing::Pattern;
using plexus::multipath::testing::WaitBytesAcked;

namespace {

// Whether a socket can bind to ::1 (a host or container may have IPv6 off).
bool HaveIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return ok;
}

pm::MultipathDeviceOptions Options(std::vector<std::string> addresses) {
  pm::MultipathDeviceOptions o;
  o.local_addresses = std::move(addresses);
  o.channel.path_timeout = absl::Seconds(3);  // a loaded 2-core CI machine starves threads
  o.device.op_timeout = absl::Seconds(20);
  o.device.connect_timeout = absl::Seconds(10);
  return o;
}

// Two MultipathDevices joined by one connection of K = 2 paths: b listens on 127.0.0.1 and
// 127.0.0.2, a connects from 127.0.0.1 and 127.0.0.3 (distinct, so the path mapping is visible
// in peer_address()).
struct Link {
  std::shared_ptr<pm::MultipathDevice> dev_a, dev_b;
  pt::CompletionQueue cq_a, cq_b;
  std::unique_ptr<pt::Connection> a, b;

  Link() : Link(Options({"127.0.0.1", "127.0.0.3"}), Options({"127.0.0.1", "127.0.0.2"})) {}
  Link(const pm::MultipathDeviceOptions& options_a, const pm::MultipathDeviceOptions& options_b) {
    auto da = pm::MultipathDevice::Create(options_a);
    auto db = pm::MultipathDevice::Create(options_b);
    REQUIRE(da.ok());
    REQUIRE(db.ok());
    dev_a = *da;
    dev_b = *db;
    std::shared_ptr<pt::Device> as_device = dev_b;  // through the base interface only
    auto listener = as_device->Listen("");
    INFO(listener.status().ToString());
    REQUIRE(listener.ok());
    absl::StatusOr<std::unique_ptr<pt::Connection>> accepted;
    std::thread acceptor([&] { accepted = (*listener)->Accept(&cq_b, absl::Seconds(10)); });
    auto connected =
        std::static_pointer_cast<pt::Device>(dev_a)->Connect((*listener)->address(), &cq_a);
    acceptor.join();
    INFO(connected.status().ToString() << " / " << accepted.status().ToString());
    REQUIRE(connected.ok());
    REQUIRE(accepted.ok());
    a = *std::move(connected);
    b = *std::move(accepted);
  }
};

// Payload bytes sent on `lane` (only over paths revived there, when `revived_only`).
uint64_t LaneBytes(const pm::MultipathChannel& channel, int lane, bool revived_only) {
  uint64_t bytes = 0;
  for (const pm::PathStats& p : channel.Stats().paths) {
    if (p.lane == lane && (!revived_only || p.index != p.lane)) bytes += p.bytes_acked;
  }
  return bytes;
}

// Both sides get `lane` back without an application call, within 10 s (loopback: the first
// redial succeeds; the bound is for a starved CI machine).
void ExpectRevived(pt::Connection& a, pt::Connection& b, int lane) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (pt::Connection* conn : {&a, &b}) {
    pm::MultipathChannel* channel = pm::MultipathDevice::ChannelOf(*conn);
    REQUIRE(channel != nullptr);
    auto lane_up = [&] {
      for (const pm::PathStats& p : channel->Stats().paths) {
        if (p.lane == lane && p.up) return true;
      }
      return false;
    };
    while (!lane_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    INFO("last redial error: " << channel->Stats().last_redial_error);
    REQUIRE(lane_up());
    CHECK(channel->live_paths() == 2);
  }
}

// Waits for the next completion on `cq` within 60 s.
pt::Completion Next(pt::CompletionQueue& cq) {
  auto c = cq.Wait(absl::Seconds(60));
  REQUIRE(c.ok());
  return *std::move(c);
}

// Sends every size a -> b from unaligned sources into unaligned receives, each message gathered
// from three parts (one empty) when `gather`; checks the bytes, the guard bytes around each
// receive, and exactly one completion per operation with wr_id, bytes and connection id.
void Transfer(pt::Connection& a, pt::CompletionQueue& cq_a, pt::Connection& b,
              pt::CompletionQueue& cq_b, const std::vector<size_t>& sizes, uint32_t seed,
              bool gather) {
  std::vector<std::vector<uint8_t>> src, dst;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(Pattern(sizes[i] + 3, seed + static_cast<uint32_t>(i)));
    dst.emplace_back(sizes[i] + 13, 0xee);  // 5 guard bytes before, 8 after
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    // A receive larger than the message: bytes reports the message length.
    REQUIRE(b.PostRecv({dst[i].data() + 5, sizes[i] + 8}, 100 + i).ok());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint8_t* p = src[i].data() + 3;
    if (gather) {
      const size_t first = sizes[i] / 3, second = sizes[i] - first;
      const pt::ConstBuffer parts[3] = {{p, first}, {nullptr, 0}, {p + first, second}};
      REQUIRE(a.PostSend(absl::MakeConstSpan(parts, 3), 200 + i).ok());
    } else {
      REQUIRE(a.PostSend(pt::ConstBuffer{p, sizes[i]}, 200 + i).ok());
    }
  }
  std::vector<int> sent(sizes.size(), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const pt::Completion c = Next(cq_a);
    INFO(c.status.ToString());
    REQUIRE(c.status.ok());
    CHECK(c.opcode == pt::Opcode::kSend);
    CHECK(c.connection_id == a.id());
    REQUIRE(c.wr_id >= 200);
    REQUIRE(c.wr_id < 200 + sizes.size());
    CHECK(c.bytes == sizes[c.wr_id - 200]);
    ++sent[c.wr_id - 200];
  }
  for (int n : sent) CHECK(n == 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const pt::Completion c = Next(cq_b);
    INFO(c.status.ToString());
    REQUIRE(c.status.ok());
    CHECK(c.opcode == pt::Opcode::kRecv);
    CHECK(c.connection_id == b.id());
    CHECK(c.wr_id == 100 + i);  // in PostSend order
    CHECK(c.bytes == sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message " << i << " of " << sizes[i] << " bytes");
    CHECK(std::memcmp(dst[i].data() + 5, src[i].data() + 3, sizes[i]) == 0);
    CHECK(std::vector<uint8_t>(dst[i].begin(), dst[i].begin() + 5) ==
          std::vector<uint8_t>(5, 0xee));
    CHECK(std::vector<uint8_t>(dst[i].end() - 8, dst[i].end()) == std::vector<uint8_t>(8, 0xee));
  }
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(cq_a.size() == 0);
  CHECK(cq_b.size() == 0);
}

}  // namespace

TEST_CASE("device: exact data at several sizes through Device/Connection, plain and gathered",
          "[multipath][device]") {
  Link link;
  // Path k goes from the connector's local_addresses[k] to the listener's k-th address.
  const std::string b_peer = link.b->peer_address();
  INFO(b_peer);
  CHECK(absl::StartsWith(b_peer, "mp:127.0.0.1:"));
  CHECK(absl::StrContains(b_peer, ",127.0.0.3:"));
  CHECK(absl::StartsWith(link.a->peer_address(), "mp:127.0.0.1:"));
  CHECK(absl::StrContains(link.a->peer_address(), ",127.0.0.2:"));
  CHECK(link.a->status().ok());
  const std::vector<size_t> sizes = {0,     1,     7,       16383,         16385,
                                     49999, 50001, 1 << 20, (1 << 20) + 3, (size_t{16} << 20) + 5};
  Transfer(*link.a, link.cq_a, *link.b, link.cq_b, sizes, 1, /*gather=*/false);
  Transfer(*link.a, link.cq_a, *link.b, link.cq_b, sizes, 2, /*gather=*/true);
  Transfer(*link.b, link.cq_b, *link.a, link.cq_a, {3, 50001, (size_t{4} << 20) + 1}, 3, true);
  // Both paths carried the large messages; the device sums its connections' paths.
  const auto paths = pm::MultipathDevice::ChannelOf(*link.a)->Stats().paths;
  REQUIRE(paths.size() == 2);
  for (const auto& p : paths) CHECK(p.bytes_acked > 0);
  CHECK(link.dev_a->PathBytesAcked() ==
        std::vector<uint64_t>{paths[0].bytes_acked, paths[1].bytes_acked});
  // Many parts whose boundaries fall inside chunks (50 KB) and at their edges.
  {
    const std::vector<size_t> part_sizes = {1, 49999, 50001, 0, 3, 200000, 17, 49980};
    size_t total = 0;
    for (size_t s : part_sizes) total += s;
    const std::vector<uint8_t> src = Pattern(total + 1, 21);
    std::vector<pt::ConstBuffer> parts;
    size_t at = 1;
    for (size_t s : part_sizes) {
      parts.push_back({s == 0 ? nullptr : src.data() + at, s});
      at += s;
    }
    std::vector<uint8_t> dst(total, 0);
    REQUIRE(link.b->PostRecv({dst.data(), total}, 31).ok());
    REQUIRE(link.a->PostSend(absl::MakeConstSpan(parts), 32).ok());
    const pt::Completion s = Next(link.cq_a);
    CHECK((s.status.ok() && s.wr_id == 32 && s.bytes == total));
    const pt::Completion r = Next(link.cq_b);
    CHECK((r.status.ok() && r.wr_id == 31 && r.bytes == total));
    CHECK(std::memcmp(dst.data(), src.data() + 1, total) == 0);
    // A null part with bytes is refused up front, naming it.
    const pt::ConstBuffer bad[2] = {{src.data(), 4}, {nullptr, 5}};
    const absl::Status refused = link.a->PostSend(absl::MakeConstSpan(bad, 2), 33);
    CHECK(absl::IsInvalidArgument(refused));
    CHECK(absl::StrContains(refused.message(), "buffer 1 of 2 is null"));
  }
  // A receive shorter than the message fails (ResourceExhausted), as on every transport.
  std::vector<uint8_t> small(10), big = Pattern(100, 4);
  REQUIRE(link.b->PostRecv({small.data(), small.size()}, 7).ok());
  REQUIRE(link.a->PostSend(pt::ConstBuffer{big.data(), big.size()}, 8).ok());
  const pt::Completion r = Next(link.cq_b);
  CHECK(r.wr_id == 7);
  CHECK(absl::IsResourceExhausted(r.status));
}

// Its own CTest entry (multipath_device_ipv6_test), skipped (77) where there is no IPv6 loopback.
TEST_CASE("device: IPv6 paths (loopback) set up from a bracketed address and carry data",
          "[multipath][device][ipv6]") {
  if (!HaveIpv6Loopback()) plexus::testing::SkipTest("no IPv6 loopback (::1) here");
  Link link(Options({"::1", "::1"}), Options({"::1", "::1"}));
  CHECK(absl::StartsWith(link.b->peer_address(), "mp:[::1]:"));
  Transfer(*link.a, link.cq_a, *link.b, link.cq_b, {0, 7, 50001, (size_t{1} << 20) + 3}, 5,
           /*gather=*/false);
}

TEST_CASE("device: PostWrite with an immediate lands every byte before the peer's completion",
          "[multipath][device]") {
  Link link;
  const size_t bytes = (size_t{8} << 20) + 64;
  std::vector<uint8_t> src = Pattern(bytes, 9), dst(bytes, 0);
  auto local = link.dev_a->Register(src.data(), src.size());
  auto remote = link.dev_b->Register(dst.data(), dst.size());
  REQUIRE(local.ok());
  REQUIRE(remote.ok());
  for (size_t length : {size_t{1}, size_t{50001}, size_t{8} << 20}) {
    std::fill(dst.begin(), dst.end(), 0);
    REQUIRE(link.a->PostWrite(**local, 3, length, (*remote)->handle(), 17, 0xabc, 77).ok());
    const pt::Completion w = Next(link.cq_a);
    REQUIRE(w.status.ok());
    CHECK(w.opcode == pt::Opcode::kWrite);
    CHECK(w.wr_id == 77);
    CHECK(w.bytes == length);
    CHECK(w.connection_id == link.a->id());
    const pt::Completion n = Next(link.cq_b);
    REQUIRE(n.status.ok());
    CHECK(n.opcode == pt::Opcode::kRemoteWrite);
    CHECK(n.has_immediate);
    CHECK(n.immediate == 0xabc);
    CHECK(n.connection_id == link.b->id());
    CHECK(std::memcmp(dst.data() + 17, src.data() + 3, length) == 0);
    CHECK(dst[16] == 0);
    CHECK(dst[17 + length] == 0);
  }
}

TEST_CASE("device: a path failed mid-transfer loses and duplicates nothing",
          "[multipath][device][failover]") {
  Link link;
  pm::MultipathChannel* channel_a = pm::MultipathDevice::ChannelOf(*link.a);
  REQUIRE(channel_a != nullptr);
  REQUIRE(channel_a->live_paths() == 2);
  const size_t n = size_t{24} << 20;
  std::vector<uint8_t> src = Pattern(n + 1, 5), dst(n, 0), src2 = Pattern(n, 6), dst2(n, 0);
  REQUIRE(link.b->PostRecv({dst.data(), n}, 1).ok());
  REQUIRE(link.b->PostRecv({dst2.data(), n}, 2).ok());
  REQUIRE(link.a->PostSend(pt::ConstBuffer{src.data() + 1, n}, 11).ok());
  REQUIRE(link.a->PostSend(pt::ConstBuffer{src2.data(), n}, 12).ok());
  WaitBytesAcked(*channel_a, 4 << 20);
  pmi::ChannelTestAccess::FailPath(*channel_a, 1);
  std::vector<uint64_t> sent;
  for (int i = 0; i < 2; ++i) {
    const pt::Completion c = Next(link.cq_a);
    INFO(c.status.ToString());
    CHECK(c.status.ok());
    sent.push_back(c.wr_id);
  }
  std::sort(sent.begin(), sent.end());
  CHECK(sent == std::vector<uint64_t>{11, 12});
  for (uint64_t wr : {1, 2}) {
    const pt::Completion c = Next(link.cq_b);
    INFO(c.status.ToString());
    CHECK(c.status.ok());
    CHECK(c.wr_id == wr);
    CHECK(c.bytes == n);
  }
  CHECK(std::memcmp(dst.data(), src.data() + 1, n) == 0);
  CHECK(dst2 == src2);
  CHECK(channel_a->Stats().paths[1].chunks_reposted > 0);
  // The connection goes on, and the path comes back by itself (revive_paths): a new path on
  // lane 1, which carries chunks again.
  CHECK(link.a->status().ok());
  CHECK(link.b->status().ok());
  ExpectRevived(*link.a, *link.b, 1);
  Transfer(*link.a, link.cq_a, *link.b, link.cq_b, {1, (size_t{8} << 20) + 1}, 7, true);
  CHECK(LaneBytes(*channel_a, 1, /*revived_only=*/true) > 0);
}

TEST_CASE(
    "device: path 0 (set-up's path) failed on the listening side mid-transfer; it comes "
    "back by itself",
    "[multipath][device][failover]") {
  Link link;
  pm::MultipathChannel* channel_a = pm::MultipathDevice::ChannelOf(*link.a);
  pm::MultipathChannel* channel_b = pm::MultipathDevice::ChannelOf(*link.b);
  REQUIRE(channel_b != nullptr);
  // b -> a, so that the side that loses the path (b, the listener) is the sender; a, the
  // connector, learns of it from b's fence and redials.
  const size_t n = size_t{24} << 20;
  std::vector<uint8_t> src = Pattern(n, 8), dst(n + 1, 0);
  REQUIRE(link.a->PostRecv({dst.data() + 1, n}, 1).ok());
  REQUIRE(link.b->PostSend(pt::ConstBuffer{src.data(), n}, 2).ok());
  WaitBytesAcked(*channel_b, 4 << 20);
  pmi::ChannelTestAccess::FailPath(*channel_b, 0);
  const pt::Completion sent = Next(link.cq_b);
  INFO(sent.status.ToString());
  CHECK(sent.status.ok());
  const pt::Completion received = Next(link.cq_a);
  INFO(received.status.ToString());
  CHECK(received.status.ok());
  CHECK(received.bytes == n);
  CHECK(std::memcmp(dst.data() + 1, src.data(), n) == 0);
  ExpectRevived(*link.a, *link.b, 0);
  Transfer(*link.b, link.cq_b, *link.a, link.cq_a, {(size_t{8} << 20) + 3}, 9, false);
  CHECK(LaneBytes(*channel_b, 0, /*revived_only=*/true) > 0);
  CHECK(channel_a->Stats().paths_revived + channel_b->Stats().paths_revived >= 2);
}

TEST_CASE("device: revive_paths = false leaves a dead path dead", "[multipath][device]") {
  auto oa = Options({"127.0.0.1", "127.0.0.3"});
  auto ob = Options({"127.0.0.1", "127.0.0.2"});
  oa.revive_paths = ob.revive_paths = false;
  Link link(oa, ob);
  pm::MultipathChannel* channel_a = pm::MultipathDevice::ChannelOf(*link.a);
  pmi::ChannelTestAccess::FailPath(*channel_a, 1);
  absl::SleepFor(absl::Milliseconds(500));
  CHECK(channel_a->live_paths() == 1);
  CHECK(channel_a->Stats().paths.size() == 2);
  CHECK(channel_a->Stats().paths_revived == 0);
  Transfer(*link.a, link.cq_a, *link.b, link.cq_b, {(size_t{1} << 20) + 1}, 10, false);
}

TEST_CASE("device: Close cancels local operations and fails the peer's with Aborted",
          "[multipath][device]") {
  Link link;
  std::vector<uint8_t> buf_a(64), buf_b(64);
  REQUIRE(link.a->PostRecv({buf_a.data(), buf_a.size()}, 1).ok());
  REQUIRE(link.b->PostRecv({buf_b.data(), buf_b.size()}, 2).ok());
  link.a->Close();
  link.a->Close();  // idempotent
  const pt::Completion local = Next(link.cq_a);
  CHECK(local.wr_id == 1);
  CHECK(absl::IsCancelled(local.status));
  CHECK(absl::IsCancelled(link.a->status()));
  CHECK(absl::IsCancelled(link.a->PostSend(pt::ConstBuffer{buf_a.data(), 1}, 3)));
  const absl::Time start = absl::Now();
  const pt::Completion remote = Next(link.cq_b);
  INFO(remote.status.ToString());
  CHECK(remote.wr_id == 2);
  CHECK(absl::IsAborted(remote.status));
  CHECK(absl::Now() - start < absl::Seconds(5));  // not the 30 s no-path wait of a channel
  CHECK(absl::IsAborted(link.b->status()));
}

TEST_CASE("device: malformed composite addresses are refused, naming the entry",
          "[multipath][device]") {
  auto device = pm::MultipathDevice::Create(Options({"127.0.0.1", "127.0.0.2"}));
  REQUIRE(device.ok());
  pt::CompletionQueue cq;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"127.0.0.1:5000", "missing the 'mp:' prefix"},
      {"mp:", "entry 0 is empty"},
      {"mp:127.0.0.1", "entry 0 '127.0.0.1' is not a valid address: no ':port'"},
      {"mp:127.0.0.1:70000,127.0.0.2",
       "entry 0 '127.0.0.1:70000' is not a valid address: port "
       "'70000'"},
      {"mp:127.0.0.1:x,127.0.0.2", "port 'x' is not a number"},
      {"mp:300.0.0.1:5000,127.0.0.2", "'300.0.0.1' is not an IP address"},
      {"mp:::1:5000,::1", "IPv6 addresses need brackets"},
      {"mp:127.0.0.1:5000,,127.0.0.2", "entry 1 is empty"},
      {"mp:127.0.0.1:5000,host2", "entry 1 ('host2') is not an IP address"},
      {"mp:127.0.0.1:5000", "names 1 paths, this device has 2"},
      {"mp:127.0.0.1:5000,127.0.0.2,127.0.0.3", "names 3 paths, this device has 2"},
  };
  for (const auto& [address, expected] : cases) {
    auto conn = (*device)->Connect(address, &cq);
    INFO(address << " -> " << conn.status().ToString());
    REQUIRE_FALSE(conn.ok());
    CHECK(absl::IsInvalidArgument(conn.status()));
    CHECK(absl::StrContains(conn.status().message(), expected));
  }
  // A well-formed address where nothing listens: Unavailable, naming the control address.
  {
    auto closed = (*device)->Listen("");
    REQUIRE(closed.ok());
    const std::string address = (*closed)->address();
    closed->reset();  // the port is free again
    auto conn = (*device)->Connect(address, &cq);
    INFO(conn.status().ToString());
    CHECK(absl::IsUnavailable(conn.status()));
    auto where = pm::MultipathDevice::ParseAddress(address);
    REQUIRE(where.ok());
    CHECK(absl::StrContains(conn.status().message(),
                            absl::StrCat("control connection to ", where->control)));
  }
  auto parsed = pm::MultipathDevice::ParseAddress("mp:127.0.0.1:5000,127.0.0.2");
  REQUIRE(parsed.ok());
  CHECK(parsed->control == "127.0.0.1:5000");
  CHECK(parsed->hosts == std::vector<std::string>{"127.0.0.1", "127.0.0.2"});
  // IPv6: the control address in brackets, the other paths' IPs with or without.
  auto v6 = pm::MultipathDevice::ParseAddress("mp:[::1]:5000,fd00::2,[fd00::3]");
  REQUIRE(v6.ok());
  CHECK(v6->control == "[::1]:5000");
  CHECK(v6->hosts == std::vector<std::string>{"::1", "fd00::2", "fd00::3"});
  // Listen checks its address the same way, and that the IPs are this device's.
  CHECK(absl::StrContains((*device)->Listen("mp:127.0.0.1:0,127.0.0.9").status().message(),
                          "must be this device's local_addresses"));
  // A source of its own is refused (ConnectFrom is ConnectOnPath with an address-only binding).
  const absl::Status from =
      (*device)->ConnectFrom("127.0.0.5", "mp:127.0.0.1:1,127.0.0.2", &cq).status();
  CHECK(absl::IsInvalidArgument(from));
  CHECK(absl::StrContains(from.message(), "binds each of its paths itself"));
}

TEST_CASE("device: options and a peer with another number of paths are refused with the reason",
          "[multipath][device]") {
  auto empty = pm::MultipathDevice::Create(Options({}));
  CHECK(absl::StrContains(empty.status().message(), "local_addresses is empty"));
  auto bad = pm::MultipathDevice::Create(Options({"127.0.0.1", "nohost"}));
  CHECK(absl::StrContains(bad.status().message(),
                          "local_addresses[1] ('nohost') is not an IP address"));
  auto caller = Options({"127.0.0.1"});
  caller.device.progress = pt::ProgressMode::kCaller;
  CHECK(absl::StrContains(pm::MultipathDevice::Create(caller).status().message(),
                          "progress must be kThread"));
  auto shm = Options({"127.0.0.1"});
  shm.device.backend = pt::Backend::kShm;
  CHECK(absl::StrContains(pm::MultipathDevice::Create(shm).status().message(),
                          "backend must be tcp"));
  auto chunk = Options({"127.0.0.1"});
  chunk.channel.chunk_bytes = 0;
  CHECK(absl::StrContains(pm::MultipathDevice::Create(chunk).status().message(),
                          "MultipathDeviceOptions.channel: multipath: chunk_bytes"));

  // A 3-path listener and a 2-path connector whose address was rewritten to name 2 paths.
  auto three = pm::MultipathDevice::Create(Options({"127.0.0.1", "127.0.0.2", "127.0.0.3"}));
  auto two = pm::MultipathDevice::Create(Options({"127.0.0.1", "127.0.0.2"}));
  REQUIRE(three.ok());
  REQUIRE(two.ok());
  auto listener = (*three)->Listen("");
  REQUIRE(listener.ok());
  const std::string address = (*listener)->address();
  CHECK(absl::EndsWith(address, ",127.0.0.2,127.0.0.3"));
  auto parsed = pm::MultipathDevice::ParseAddress(address);
  REQUIRE(parsed.ok());
  pt::CompletionQueue cq_l, cq_c;
  absl::StatusOr<std::unique_ptr<pt::Connection>> accepted;
  std::thread acceptor([&] { accepted = (*listener)->Accept(&cq_l, absl::Seconds(10)); });
  auto conn = (*two)->Connect(absl::StrCat("mp:", parsed->control, ",127.0.0.2"), &cq_c);
  acceptor.join();
  INFO(conn.status().ToString() << " / " << accepted.status().ToString());
  CHECK(absl::IsFailedPrecondition(conn.status()));
  CHECK(absl::StrContains(conn.status().message(), "has 2 paths"));
  CHECK(absl::StrContains(conn.status().message(), "has 3"));
  CHECK(absl::IsFailedPrecondition(accepted.status()));
}

namespace {

// One set-up between two fresh 2-path devices (options as Options(), with `path_timeout`), both
// outcomes and how long each side took.
struct SetupOutcome {
  absl::StatusOr<std::unique_ptr<pt::Connection>> connected, accepted;
  absl::Duration connect_took, accept_took;
  std::shared_ptr<pm::MultipathDevice> dev_a, dev_b;
  pt::CompletionQueue cq_a, cq_b;
};

void SetUp(SetupOutcome& out, absl::Duration path_timeout) {
  auto options_a = Options({"127.0.0.1", "127.0.0.3"});
  auto options_b = Options({"127.0.0.1", "127.0.0.2"});
  options_a.channel.path_timeout = options_b.channel.path_timeout = path_timeout;
  auto da = pm::MultipathDevice::Create(options_a);
  auto db = pm::MultipathDevice::Create(options_b);
  REQUIRE(da.ok());
  REQUIRE(db.ok());
  out.dev_a = *da;
  out.dev_b = *db;
  auto listener = out.dev_b->Listen("");
  REQUIRE(listener.ok());
  const absl::Time start = absl::Now();
  std::thread acceptor([&] {
    out.accepted = (*listener)->Accept(&out.cq_b, absl::Seconds(10));
    out.accept_took = absl::Now() - start;
  });
  out.connected = out.dev_a->Connect((*listener)->address(), &out.cq_a);
  out.connect_took = absl::Now() - start;
  acceptor.join();
}

// Installs set-up hooks for one scope.
struct ScopedHooks {
  explicit ScopedHooks(pmi::DeviceTestHooks hooks) { pmi::SetDeviceTestHooks(std::move(hooks)); }
  ~ScopedHooks() { pmi::SetDeviceTestHooks({}); }
};

}  // namespace

// A path that dies in the middle of set-up, after its greeting (here: the connector's path 0,
// killed once the connector saw every greeting, while the listener has not yet checked its
// paths), is a path of an established connection that died: both sides return the connection,
// the path comes back by itself, and data flows. (Before, the connector returned a connection
// while the listener failed after its 10 s connect timeout.)
TEST_CASE("device: a path dying during set-up leaves both sides connected",
          "[multipath][device][setup]") {
  std::atomic<bool> killed{false};
  ScopedHooks hooks({
      .connector_greeted =
          [&](pm::MultipathChannel& channel) {
            pmi::ChannelTestAccess::FailPath(channel, 0);
            killed = true;
          },
      .listener_accepted =
          [&](pm::MultipathChannel& channel) {
            // Until the connector's close of path 0 reached this side.
            const absl::Time until = absl::Now() + absl::Seconds(5);
            while (absl::Now() < until) {
              if (killed && !channel.Stats().paths[0].up) break;
              absl::SleepFor(absl::Milliseconds(1));
            }
          },
  });
  SetupOutcome s;
  SetUp(s, absl::Seconds(3));
  INFO(s.connected.status().ToString() << " / " << s.accepted.status().ToString());
  REQUIRE(killed);
  REQUIRE(s.connected.ok());
  REQUIRE(s.accepted.ok());
  CHECK(s.accept_took < absl::Seconds(5));
  ExpectRevived(**s.connected, **s.accepted, 0);
  Transfer(**s.connected, s.cq_a, **s.accepted, s.cq_b, {1, (size_t{8} << 20) + 1}, 9, false);
}

// A listener whose paths fail before they are checked fails its Accept, and the connector learns
// it from the listener's verdict at once, with the listener's reason, instead of returning a
// connection to a peer that has none.
TEST_CASE("device: a set-up that fails on the listener fails on the connector, promptly",
          "[multipath][device][setup]") {
  ScopedHooks hooks({
      .connector_greeted = nullptr,
      .listener_accepted =
          [&](pm::MultipathChannel& channel) {
            pmi::ChannelTestAccess::FailPath(channel, 0);
            pmi::ChannelTestAccess::FailPath(channel, 1);
          },
  });
  SetupOutcome s;
  SetUp(s, absl::Seconds(3));
  INFO(s.connected.status().ToString() << " / " << s.accepted.status().ToString());
  CHECK_FALSE(s.accepted.ok());
  REQUIRE_FALSE(s.connected.ok());
  // The listener's verdict ("the peer ... failed: ... every path is down"), or the connector's
  // own paths failing first (the listener closed them), whichever it saw first.
  const std::string why(s.connected.status().message());
  CHECK(
      (absl::StrContains(why, "every path is down") || absl::StrContains(why, "multipath set-up")));
  CHECK(s.connect_took < absl::Seconds(3));
  CHECK(s.accept_took < absl::Seconds(3));
}

// The defect's own setting: 64 MiB over a fresh connection per run with the default path timeout
// (100 ms) on a loaded machine; each run must set up on both sides or fail on both.
TEST_CASE("device: fresh connections under load agree on set-up", "[.setup-stress]") {
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  int failed = 0;
  for (int run = 0; run < 80; ++run) {
    SetupOutcome s;
    SetUp(s, absl::Milliseconds(100));
    INFO("run " << run << ": " << s.connected.status().ToString() << " / "
                << s.accepted.status().ToString());
    REQUIRE(s.connected.ok() == s.accepted.ok());
    if (!s.connected.ok()) {
      ++failed;
      continue;
    }
    Transfer(**s.connected, s.cq_a, **s.accepted, s.cq_b, {size_t{64} << 20}, run, false);
  }
  stop = true;
  busy.join();
  CHECK(failed == 0);
}
