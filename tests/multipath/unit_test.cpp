// Units of the multipath library without I/O: frames, reassembly (duplicates, order, held
// bytes), schedulers (weights converge to capacity shares, mice on the min-RTT path), the path
// monitor and the two-signal rate controller.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "device_wire.hpp"
#include "plexus/base/record.hpp"
#include "plexus/multipath/monitor.hpp"
#include "plexus/multipath/scheduler.hpp"
#include "plexus/netmodel/rate_controller.hpp"
#include "reassembler.hpp"
#include "wire.hpp"

namespace pm = plexus::multipath;
namespace pmi = plexus::multipath::internal;
namespace pt = plexus::transport;

namespace {

std::vector<uint8_t> ChunkMessage(pmi::Frame f, const std::vector<uint8_t>& payload) {
  f.type = pmi::FrameType::kChunk;
  f.length = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> out(pmi::kHeaderSize + payload.size());
  pmi::EncodeHeader(f, out.data());
  if (!payload.empty()) std::memcpy(out.data() + pmi::kHeaderSize, payload.data(), payload.size());
  return out;
}

}  // namespace

TEST_CASE("frames round-trip and malformed ones are refused", "[multipath][wire]") {
  pmi::Frame f;
  f.seq = 7;
  f.offset = 100;
  f.total = 300;
  f.send_index = 3;
  f.chunk = 2;
  f.immediate = 99;
  const std::vector<uint8_t> payload(50, 0xab);
  auto bytes = ChunkMessage(f, payload);
  auto decoded = pmi::DecodeFrame(bytes, 1 << 20);
  REQUIRE(decoded.ok());
  CHECK(decoded->type == pmi::FrameType::kChunk);
  CHECK(decoded->seq == 7);
  CHECK(decoded->offset == 100);
  CHECK(decoded->total == 300);
  CHECK(decoded->send_index == 3);
  CHECK(decoded->chunk == 2);
  CHECK(decoded->length == 50);
  CHECK(decoded->immediate == 99);

  SECTION("short") { CHECK_FALSE(pmi::DecodeFrame({bytes.data(), 10}, 1 << 20).ok()); }
  SECTION("bad magic") {
    bytes[0] ^= 1;
    CHECK_FALSE(pmi::DecodeFrame(bytes, 1 << 20).ok());
  }
  SECTION("unknown type") {
    bytes[5] = 42;
    auto r = pmi::DecodeFrame(bytes, 1 << 20);
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()).find("unknown type 42") != std::string::npos);
  }
  SECTION("length disagrees with payload") {
    bytes.pop_back();
    CHECK_FALSE(pmi::DecodeFrame(bytes, 1 << 20).ok());
  }
  SECTION("bytes outside the message") {
    f.offset = 280;
    CHECK_FALSE(pmi::DecodeFrame(ChunkMessage(f, payload), 1 << 20).ok());
    f.offset = ~uint64_t{0} - 10;  // overflow
    CHECK_FALSE(pmi::DecodeFrame(ChunkMessage(f, payload), 1 << 20).ok());
  }
  SECTION("message over the limit") { CHECK_FALSE(pmi::DecodeFrame(bytes, 200).ok()); }
  SECTION("flags not allowed for the type") {
    bytes[6] = static_cast<uint8_t>(pmi::kFlagNotify);
    CHECK_FALSE(pmi::DecodeFrame(bytes, 1 << 20).ok());
  }
  SECTION("control frames carry no payload") {
    pmi::Frame ack;
    ack.type = pmi::FrameType::kAck;
    auto h = pmi::EncodeHeader(ack);
    std::vector<uint8_t> v(h.begin(), h.end());
    CHECK(pmi::DecodeFrame(v, 1 << 20).ok());
    v.push_back(1);
    CHECK_FALSE(pmi::DecodeFrame(v, 1 << 20).ok());
  }
}

TEST_CASE("reassembly: out of order, duplicates dropped, completion only when notified",
          "[multipath][reassembly]") {
  pmi::Reassembler r(1 << 20);
  std::vector<uint8_t> out(10, 0);
  r.PostRecv({out.data(), out.size()}, 5);
  pmi::Frame f;
  f.type = pmi::FrameType::kChunk;
  f.seq = 0;
  f.total = 10;
  bool dup = false;
  const std::vector<uint8_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c = {9, 10};
  f.chunk = 2, f.offset = 8, f.length = 2;
  REQUIRE(r.OnChunk(f, c, &dup).ok());
  f.chunk = 0, f.offset = 0, f.length = 4;
  REQUIRE(r.OnChunk(f, a, &dup).ok());
  CHECK_FALSE(dup);
  // The same chunk again (a repost after a path died): dropped, not applied twice.
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{0, 0, 0, 0}, &dup).ok());
  CHECK(dup);
  f.chunk = 1, f.offset = 4, f.length = 4;
  REQUIRE(r.OnChunk(f, b, &dup).ok());
  // Every byte is there, but no notification yet: no completion.
  CHECK(r.TakeCompletions().empty());
  pmi::Frame n;
  n.type = pmi::FrameType::kNotify;
  n.seq = 0;
  n.total = 10;
  n.chunk = 3;
  REQUIRE(r.OnNotify(n, &dup).ok());
  auto done = r.TakeCompletions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].wr_id == 5);
  CHECK(done[0].bytes == 10);
  CHECK(done[0].status.ok());
  CHECK(out == std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(r.duplicates() == 1);
  // A late duplicate of the finished message never touches the (reused) buffer.
  out.assign(10, 0);
  f.chunk = 0, f.offset = 0, f.length = 4;
  REQUIRE(r.OnChunk(f, a, &dup).ok());
  CHECK(dup);
  REQUIRE(r.OnNotify(n, &dup).ok());
  CHECK(dup);
  CHECK(out == std::vector<uint8_t>(10, 0));
  CHECK(r.TakeCompletions().empty());
}

TEST_CASE("reassembly: held before the Recv, Send order, too-long and held caps",
          "[multipath][reassembly]") {
  pmi::Reassembler r(64);
  bool dup = false;
  pmi::Frame f;
  f.type = pmi::FrameType::kChunk;
  f.flags = pmi::kFlagLast;
  // Message 1 arrives (whole) before message 0; neither Recv is posted yet.
  f.seq = 1, f.send_index = 1, f.total = 3, f.length = 3;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{7, 8, 9}, &dup).ok());
  CHECK(r.held_bytes() == 3);
  std::vector<uint8_t> first(2), second(3);
  r.PostRecv({first.data(), first.size()}, 100);
  r.PostRecv({second.data(), second.size()}, 101);
  CHECK(r.held_bytes() == 0);
  CHECK(r.TakeCompletions().empty());                      // message 1 waits for message 0
  f.seq = 0, f.send_index = 0, f.total = 5, f.length = 5;  // longer than Recv 0's buffer
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{1, 2, 3, 4, 5}, &dup).ok());
  auto done = r.TakeCompletions();
  REQUIRE(done.size() == 2);
  CHECK(done[0].wr_id == 100);
  CHECK(absl::IsResourceExhausted(done[0].status));
  CHECK(done[1].wr_id == 101);
  CHECK(done[1].status.ok());
  CHECK(second == std::vector<uint8_t>{7, 8, 9});
  // Holding beyond the cap is refused with a message naming the option.
  f.seq = 2, f.send_index = 2, f.total = 65, f.length = 65;
  auto st = r.OnChunk(f, std::vector<uint8_t>(65, 1), &dup);
  REQUIRE(absl::IsResourceExhausted(st));
  CHECK(std::string(st.message()).find("max_held_bytes") != std::string::npos);
}

TEST_CASE(
    "reassembly: early chunks go straight into their posted Recv; Recvs complete in Send "
    "order, a too-long one included",
    "[multipath][reassembly]") {
  pmi::Reassembler r(1 << 20);
  bool dup = false;
  std::vector<uint8_t> first(8, 0), second(4, 0), third(2, 0);
  r.PostRecv({first.data(), first.size()}, 200);
  r.PostRecv({second.data(), second.size()}, 201);
  r.PostRecv({third.data(), third.size()}, 202);
  pmi::Frame f;
  f.type = pmi::FrameType::kChunk;
  // Message 1 (whole) and message 2 (too long for its Recv) arrive before any chunk of message
  // 0: message 1 lands in its Recv at once (nothing held), and neither completes before 0.
  f.flags = pmi::kFlagLast;
  f.seq = 1, f.send_index = 1, f.total = 4, f.length = 4, f.offset = 0, f.chunk = 0;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{5, 6, 7, 8}, &dup).ok());
  CHECK(r.held_bytes() == 0);
  CHECK(second == std::vector<uint8_t>{5, 6, 7, 8});
  f.seq = 2, f.send_index = 2, f.total = 3, f.length = 3;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{9, 9, 9}, &dup).ok());
  CHECK(third == std::vector<uint8_t>(2, 0));  // never written past its size
  CHECK(r.TakeCompletions().empty());
  // Message 0 in two chunks and a notification.
  f.flags = 0;
  f.seq = 0, f.send_index = 0, f.total = 8, f.length = 4;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{1, 2, 3, 4}, &dup).ok());
  CHECK(r.TakeCompletions().empty());  // 1 and 2 still wait for 0
  f.chunk = 1, f.offset = 4;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>{5, 6, 7, 8}, &dup).ok());
  CHECK(r.TakeCompletions().empty());  // not notified yet
  pmi::Frame n;
  n.type = pmi::FrameType::kNotify;
  n.seq = 0, n.send_index = 0, n.total = 8, n.chunk = 2;
  REQUIRE(r.OnNotify(n, &dup).ok());
  auto done = r.TakeCompletions();
  REQUIRE(done.size() == 3);
  CHECK(done[0].wr_id == 200);
  CHECK(done[0].status.ok());
  CHECK(done[0].bytes == 8);
  CHECK(first == std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(done[1].wr_id == 201);
  CHECK(done[1].status.ok());
  CHECK(done[1].bytes == 4);
  CHECK(done[2].wr_id == 202);
  CHECK(absl::IsResourceExhausted(done[2].status));
  CHECK(r.held_bytes() == 0);
}

TEST_CASE("reassembly: closing fails every Recv not completed, in progress or waiting",
          "[multipath][reassembly]") {
  pmi::Reassembler r(1 << 20);
  bool dup = false;
  std::vector<uint8_t> a(8), b(8), c(8);
  r.PostRecv({a.data(), a.size()}, 1);
  r.PostRecv({b.data(), b.size()}, 2);
  pmi::Frame f;
  f.type = pmi::FrameType::kChunk;
  f.seq = 0, f.send_index = 0, f.total = 8, f.length = 4;  // message 0 half there
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>(4, 1), &dup).ok());
  r.CancelRecvs(absl::CancelledError("closed"));
  r.PostRecv({c.data(), c.size()}, 3);  // after the close: fails at once
  auto done = r.TakeCompletions();
  REQUIRE(done.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(done[i].wr_id == i + 1);
    CHECK(absl::IsCancelled(done[i].status));
  }
  CHECK(r.held_bytes() == 0);
}

TEST_CASE("reassembly: a peer that contradicts itself is refused", "[multipath][reassembly]") {
  pmi::Reassembler r(1 << 20);
  bool dup = false;
  pmi::Frame f;
  f.type = pmi::FrameType::kChunk;
  f.seq = 0, f.total = 10, f.length = 5;
  REQUIRE(r.OnChunk(f, std::vector<uint8_t>(5), &dup).ok());
  f.total = 11;  // same message, different size
  CHECK(absl::IsDataLoss(r.OnChunk(f, std::vector<uint8_t>(5), &dup)));
}

TEST_CASE("weighted scheduler: picks converge to capacity shares measured from completions",
          "[multipath][scheduler]") {
  // Three paths serving 50 KB chunks back to back at 100, 200 and 300 MB/s: the monitor measures
  // their bandwidth from (synthetic) completions, and the weighted scheduler then splits chunks
  // 1:2:3 when all paths have room.
  const double rates[3] = {100e6, 200e6, 300e6};
  pm::PathMonitor monitors[3];
  const absl::Time t0 = absl::UnixEpoch();
  for (int p = 0; p < 3; ++p) {
    absl::Time t = t0;
    for (int k = 0; k < 200; ++k) {
      const absl::Time done = t + absl::Seconds(50000 / rates[p]);
      monitors[p].OnChunk(50000, t0, done);  // all posted at t0: pipelined
      t = done;
    }
    CHECK(monitors[p].bandwidth() == Approx(rates[p]).epsilon(1e-6));
  }
  auto sched = *pm::MakeScheduler("weighted");
  std::vector<pm::PathView> views(3);
  for (int p = 0; p < 3; ++p) {
    views[p].index = p;
    views[p].has_slot = true;
    views[p].bandwidth = monitors[p].bandwidth();
  }
  int picks[3] = {0, 0, 0};
  for (int i = 0; i < 6000; ++i) ++picks[sched->Pick(views)];
  // Smooth WRR is exact up to floating-point rounding of the measured weights.
  CHECK(std::abs(picks[0] - 1000) <= 1);
  CHECK(std::abs(picks[1] - 2000) <= 1);
  CHECK(std::abs(picks[2] - 3000) <= 1);
  // A path without a free slot is never picked; the others keep their relative shares.
  views[2].has_slot = false;
  int rest[3] = {0, 0, 0};
  for (int i = 0; i < 300; ++i) ++rest[sched->Pick(views)];
  CHECK(rest[2] == 0);
  CHECK(std::abs(rest[0] - 100) <= 1);
  CHECK(std::abs(rest[1] - 200) <= 1);
}

TEST_CASE("congestion scheduler shifts weight away from a path with RTT inflation",
          "[multipath][scheduler]") {
  auto sched = *pm::MakeScheduler("congestion");
  std::vector<pm::PathView> views(2);
  for (int p = 0; p < 2; ++p) {
    views[p].index = p;
    views[p].has_slot = true;
    views[p].bandwidth = 100e6;
    views[p].min_rtt = absl::Milliseconds(1);
    views[p].srtt = absl::Milliseconds(1);
  }
  views[1].srtt = absl::Milliseconds(4);  // 4x inflated: weight x 1/4
  int picks[2] = {0, 0};
  for (int i = 0; i < 500; ++i) ++picks[sched->Pick(views)];
  CHECK(std::abs(picks[0] - 400) <= 1);
  CHECK(std::abs(picks[1] - 100) <= 1);
}

TEST_CASE("round robin, min-RTT and power-of-two choices", "[multipath][scheduler]") {
  std::vector<pm::PathView> views(3);
  for (int p = 0; p < 3; ++p) {
    views[p].index = p + 10;
    views[p].has_slot = true;
  }
  auto rr = *pm::MakeScheduler("round_robin");
  CHECK(rr->Pick(views) == 10);
  CHECK(rr->Pick(views) == 11);
  CHECK(rr->Pick(views) == 12);
  CHECK(rr->Pick(views) == 10);
  views[1].has_slot = false;
  CHECK(rr->Pick(views) == 12);

  // Mice: the lowest measured RTT with a slot; unmeasured paths lose to measured ones.
  views[1].has_slot = true;
  views[0].srtt = absl::Microseconds(300);
  views[1].srtt = absl::Microseconds(80);
  CHECK(pm::MinRttPath(views) == 11);
  views[1].has_slot = false;
  CHECK(pm::MinRttPath(views) == 10);
  views[1].has_slot = true;

  // Power of two: never the most loaded of three when the two others are less loaded.
  views[0].load = 0.5, views[1].load = 0.1, views[2].load = 0.9;
  auto po2 = *pm::MakeScheduler("power_of_two", 42);
  int picks[3] = {0, 0, 0};
  for (int i = 0; i < 3000; ++i) ++picks[po2->Pick(views) - 10];
  CHECK(picks[2] == 0);        // loses every pair it is in
  CHECK(picks[1] > picks[0]);  // wins every pair it is in
  CHECK(picks[0] + picks[1] == 3000);
  REQUIRE(pm::BuiltinSchedulers().size() == 5);
  for (std::string_view name : pm::BuiltinSchedulers()) {
    auto made = pm::MakeScheduler(name);
    REQUIRE(made.ok());
    CHECK((*made)->name() == name);
    for (auto& v : views) v.has_slot = false;
    CHECK((*made)->Pick(views) == -1);
    for (auto& v : views) v.has_slot = true;
  }
  const auto unknown = pm::MakeScheduler("fastest");
  REQUIRE(absl::IsInvalidArgument(unknown.status()));
  CHECK(std::string(unknown.status().message()).find("power_of_two") != std::string::npos);
}

TEST_CASE("rate controller: congestion returns to the remembered rate, overload adds up",
          "[multipath][monitor]") {
  plexus::netmodel::TwoSignalRateController r;
  const plexus::netmodel::RateControllerOptions defaults;
  r.OnCongestion();
  CHECK(r.factor() == 0.5);
  CHECK(r.target() == 1.0);
  for (int i = 0; i < defaults.congestion_recovery_steps - 1; ++i) {
    r.Tick();
    CHECK(r.factor() < 1.0);
  }
  r.Tick();
  CHECK(r.factor() == 1.0);  // back at the remembered rate in a fixed number of steps
  CHECK(r.cause() == plexus::netmodel::TwoSignalRateController::Cause::kNone);

  r.OnOverload();
  CHECK(r.factor() == 0.5);
  r.Tick();
  CHECK(r.factor() == Approx(0.625));  // additive increase, one step a tick
  r.Tick();
  CHECK(r.factor() == Approx(0.75));
  for (int i = 0; i < 10; ++i) r.Tick();
  CHECK(r.factor() == 1.0);
  // Repeated cuts never go below the floor.
  for (int i = 0; i < 10; ++i) r.OnCongestion();
  CHECK(r.factor() == defaults.min_factor);
}

TEST_CASE("path monitor: RTT EWMA, minimum, inflation; idle gaps are not service time",
          "[multipath][monitor]") {
  pm::PathMonitor m;
  m.OnRtt(absl::Milliseconds(1));
  CHECK(m.srtt() == absl::Milliseconds(1));
  for (int i = 0; i < 50; ++i) m.OnRtt(absl::Milliseconds(10));
  CHECK(m.min_rtt() == absl::Milliseconds(1));
  CHECK(m.Inflated(4, absl::Milliseconds(1)));
  CHECK_FALSE(m.Inflated(20, absl::Milliseconds(1)));
  // 9 ms of the sender's own bytes queued at the bottleneck explain the inflation.
  CHECK_FALSE(m.Inflated(4, absl::Milliseconds(1), absl::Milliseconds(9)));
  const absl::Time t = absl::UnixEpoch();
  m.OnChunk(1000, t, t + absl::Milliseconds(1));  // 1 MB/s
  m.OnIdle();
  m.OnChunk(1000, t + absl::Seconds(10), t + absl::Seconds(10) + absl::Milliseconds(1));
  CHECK(m.bandwidth() == Approx(1e6));
}

TEST_CASE("device set-up messages: round trips, and malformed ones refused", "[multipath][unit]") {
  namespace pmi = plexus::multipath::internal;
  namespace pb = plexus::base;
  CHECK(*pmi::ParseSetupRequest(pmi::EncodeSetupRequest(3)) == 3);
  CHECK_FALSE(pmi::ParseSetupRequest(pmi::EncodeSetupRequest(0)).ok());
  CHECK_FALSE(pmi::ParseSetupRequest(
                  pb::RecordWriter("multipath.setup_request", 2).String("paths", "x").Finish())
                  .ok());
  CHECK_FALSE(pmi::ParseSetupRequest("GET / HTTP/1.1").ok());
  CHECK_FALSE(pmi::ParseSetupRequest("plexus-multipath/1 paths=2").ok());  // not a record
  const std::vector<std::string> hosts = {"127.0.0.1", "127.0.0.2"};
  auto ok = pmi::ParseSetupReply(pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.2:6"}), hosts);
  REQUIRE(ok.ok());
  CHECK_FALSE(ok->refused);
  CHECK(ok->addresses == std::vector<std::string>{"127.0.0.1:5", "127.0.0.2:6"});
  auto refused = pmi::ParseSetupReply(pmi::EncodeSetupRefusal("the connector has 3 paths"), hosts);
  REQUIRE(refused.ok());
  CHECK(refused->refused);
  CHECK(refused->why == "the connector has 3 paths");
  // IPv6 paths: bracketed addresses on the hosts named without brackets.
  const std::vector<std::string> v6_hosts = {"::1", "fd00::2"};
  auto v6 = pmi::ParseSetupReply(pmi::EncodeSetupAccept({"[::1]:5", "[fd00::2]:6"}), v6_hosts);
  REQUIRE(v6.ok());
  CHECK(v6->addresses == std::vector<std::string>{"[::1]:5", "[fd00::2]:6"});
  CHECK_FALSE(
      pmi::ParseSetupReply(pmi::EncodeSetupAccept({"[::1]:5", "[fd00::9]:6"}), v6_hosts).ok());
  // A path on another host than the address named, a wrong count, a bad port, a refusal
  // without its reason, garbage.
  for (const std::string& bad :
       {pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.9:6"}),
        pmi::EncodeSetupAccept({"127.0.0.1:5"}),
        pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.2:x"}),
        pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.2:6", "127.0.0.3:7"}),
        pb::RecordWriter("multipath.setup_reply", 2).Int("refused", 1).Finish(),
        std::string("hello")}) {
    auto r = pmi::ParseSetupReply(bad, hosts);
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  }
  CHECK(absl::StrContains(
      pmi::ParseSetupReply(pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.9:6"}), hosts)
          .status()
          .message(),
      "field 'addresses': path 1 ('127.0.0.9:6') is not on 127.0.0.2"));
  // The verdicts after the paths: ready, or failed with the reason; a peer of the previous set-up
  // version is refused by name.
  auto ready = pmi::ParseSetupVerdict(pmi::EncodeSetupReady());
  REQUIRE(ready.ok());
  CHECK(ready->ready);
  auto failed = pmi::ParseSetupVerdict(pmi::EncodeSetupFailed("path 1 not up"));
  REQUIRE(failed.ok());
  CHECK_FALSE(failed->ready);
  CHECK(failed->why == "path 1 not up");
  for (const std::string& bad :
       {pb::RecordWriter("multipath.setup_verdict", 2).Int("ready", 0).Finish(),
        pb::RecordWriter("multipath.setup_verdict", 2).Int("ready", 2).Finish(),
        pb::RecordWriter("multipath.setup_verdict", 1).Int("ready", 1).Finish(),
        pmi::EncodeSetupAccept({"127.0.0.1:5", "127.0.0.2:6"}), std::string("ok")}) {
    auto v = pmi::ParseSetupVerdict(bad);
    INFO(v.status().ToString());
    CHECK(v.status().code() == absl::StatusCode::kDataLoss);
  }
  CHECK(
      absl::StrContains(pmi::ParseSetupVerdict(
                            pb::RecordWriter("multipath.setup_verdict", 1).Int("ready", 1).Finish())
                            .status()
                            .message(),
                        "version 1"));
}
