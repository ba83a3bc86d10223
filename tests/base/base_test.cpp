// The base layer: parameter parsing and precedence, file errors, strict JSON fields.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <thread>

#include "plexus/base/byte_order.hpp"
#include "plexus/base/clock.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/hash.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"

namespace pb = plexus::base;

namespace {

const pb::Param<int64_t> kTestInt("PLEXUS_TEST_BASE_INT", 7, "test parameter");
const pb::Param<bool> kTestBool("PLEXUS_TEST_BASE_BOOL", false, "test parameter");
const pb::Param<pb::Bytes> kTestBytes("PLEXUS_TEST_BASE_BYTES", pb::Bytes{4096}, "test");
const pb::Param<absl::Duration> kTestDuration("PLEXUS_TEST_BASE_DURATION", absl::Seconds(1),
                                              "test parameter");

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}
absl::StatusOr<int> Quarter(int x) {
  PLEXUS_ASSIGN_OR_RETURN(int half, Half(x));
  PLEXUS_ASSIGN_OR_RETURN(half, Half(half));
  return half;
}
absl::Status CheckEven(int x) {
  PLEXUS_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

}  // namespace

TEST_CASE("status macros propagate the first error", "[base]") {
  CHECK(*Quarter(8) == 2);
  CHECK(Quarter(6).status().message() == "odd");
  CHECK(CheckEven(4).ok());
  CHECK(!CheckEven(3).ok());
  CHECK(pb::Annotate(absl::NotFoundError("x"), "rank 3").message() == "rank 3: x");
  CHECK(pb::Annotate(absl::OkStatus(), "rank 3").ok());
}

TEST_CASE("parameters: default, environment, explicit, and one spelling per type", "[base]") {
  unsetenv("PLEXUS_TEST_BASE_INT");
  CHECK(*kTestInt.Get() == 7);
  setenv("PLEXUS_TEST_BASE_INT", "12", 1);
  CHECK(*kTestInt.Get() == 12);
  CHECK(*kTestInt.Resolve(3) == 3);  // an explicit option beats the environment
  setenv("PLEXUS_TEST_BASE_INT", "", 1);
  CHECK(*kTestInt.Get() == 7);  // empty means unset
  setenv("PLEXUS_TEST_BASE_INT", "12abc", 1);
  auto bad = kTestInt.Get();
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("PLEXUS_TEST_BASE_INT='12abc'") != std::string::npos);
  unsetenv("PLEXUS_TEST_BASE_INT");

  for (const char* yes : {"1", "true", "YES", "on"}) {
    setenv("PLEXUS_TEST_BASE_BOOL", yes, 1);
    CHECK(*kTestBool.Get());
  }
  for (const char* no : {"0", "False", "no", "OFF"}) {
    setenv("PLEXUS_TEST_BASE_BOOL", no, 1);
    CHECK(!*kTestBool.Get());
  }
  setenv("PLEXUS_TEST_BASE_BOOL", "2", 1);
  CHECK(!kTestBool.Get().ok());
  unsetenv("PLEXUS_TEST_BASE_BOOL");

  setenv("PLEXUS_TEST_BASE_BYTES", "64K", 1);
  CHECK(kTestBytes.Get()->value == 65536);
  setenv("PLEXUS_TEST_BASE_BYTES", "2MiB", 1);
  CHECK(kTestBytes.Get()->value == 2u << 20);
  setenv("PLEXUS_TEST_BASE_BYTES", "lots", 1);
  CHECK(!kTestBytes.Get().ok());
  unsetenv("PLEXUS_TEST_BASE_BYTES");

  setenv("PLEXUS_TEST_BASE_DURATION", "250ms", 1);
  CHECK(*kTestDuration.Get() == absl::Milliseconds(250));
  setenv("PLEXUS_TEST_BASE_DURATION", "2.5", 1);
  CHECK(*kTestDuration.Get() == absl::Milliseconds(2500));
  setenv("PLEXUS_TEST_BASE_DURATION", "-1", 1);
  CHECK(!kTestDuration.Get().ok());
  unsetenv("PLEXUS_TEST_BASE_DURATION");

  setenv("PLEXUS_TEST_BASE_INT", "5", 1);
  const std::string table = pb::FormatParams();
  CHECK(table.find("PLEXUS_TEST_BASE_INT") != std::string::npos);
  CHECK(table.find("environment") != std::string::npos);
  unsetenv("PLEXUS_TEST_BASE_INT");
}

TEST_CASE("files: errors say what is wrong with the path", "[base]") {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("plexus-base-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto as_dir = pb::ReadFile(dir);
  REQUIRE(!as_dir.ok());
  CHECK(as_dir.status().message().find("is a directory") != std::string::npos);
  auto missing = pb::ReadFile(dir + "/nope.json");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message().find("nope.json") != std::string::npos);
  const std::string file = dir + "/a.json";
  REQUIRE(pb::WriteFileAtomic(file, R"({"nodes": 3, "nodse": 4})").ok());
  CHECK(*pb::ReadFile(file) == R"({"nodes": 3, "nodse": 4})");
  auto too_big = pb::ReadFile(file, 4);
  CHECK(too_big.status().message().find("limit") != std::string::npos);

  auto doc = pb::json::ReadJsonFile(file);
  REQUIRE(doc.ok());
  auto keys = pb::json::CheckKeys(*doc, "scenario", {"nodes"});
  REQUIRE(!keys.ok());
  CHECK(keys.message().find("scenario.nodse: unknown field") != std::string::npos);
  REQUIRE(pb::WriteFileAtomic(file, "{ bad").ok());
  auto bad = pb::json::ReadJsonFile(file);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("a.json") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("byte order: fields are little-endian at any alignment and read back", "[base]") {
  uint8_t buf[1 + 2 + 4 + 8] = {};
  pb::ByteWriter w(buf);
  w.U8(0xab);
  w.U16(0x1234);
  w.U32(0xdeadbeef);
  w.U64(0x0102030405060708ull);
  CHECK(w.position() == buf + sizeof buf);
  // Least significant byte first, at odd offsets.
  const uint8_t expected[] = {0xab, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde, 8, 7, 6, 5, 4, 3, 2, 1};
  CHECK(std::equal(std::begin(buf), std::end(buf), std::begin(expected)));
  pb::ByteReader r(buf);
  CHECK(r.U8() == 0xab);
  CHECK(r.U16() == 0x1234);
  CHECK(r.U32() == 0xdeadbeef);
  CHECK(r.U64() == 0x0102030405060708ull);
  CHECK(pb::LoadLittleEndian<uint32_t>(buf + 3) == 0xdeadbeef);
  std::string s;
  pb::AppendLittleEndian<uint16_t>(s, 0x0102);
  pb::AppendLittleEndian<int32_t>(s, -2);
  CHECK(s == std::string("\x02\x01\xfe\xff\xff\xff", 6));
}

TEST_CASE("byte order: CheckedByteReader reads what is there and stops at the first short read",
          "[base]") {
  std::string bytes;
  pb::AppendLittleEndian<uint32_t>(bytes, 3);
  bytes += "abc";
  pb::AppendLittleEndian<int64_t>(bytes, -7);
  pb::CheckedByteReader r(bytes);
  uint32_t n = 0;
  std::string_view text;
  int64_t v = 0;
  REQUIRE(r.U32(&n));
  REQUIRE(r.Bytes(n, &text));
  REQUIRE(r.I64(&v));
  CHECK(text == "abc");
  CHECK(v == -7);
  CHECK(r.ok());
  CHECK(r.remaining() == 0);
  // Short: nothing is read, the error says where, and it sticks.
  uint16_t more = 0;
  CHECK_FALSE(r.U16(&more));
  CHECK(r.error() == "truncated: needs 2 more bytes at offset 15, has 0");
  CHECK_FALSE(r.Bytes(0, &text));
  CHECK_FALSE(r.Fail("later"));
  CHECK(r.error() == "truncated: needs 2 more bytes at offset 15, has 0");
  pb::CheckedByteReader short_bytes(std::string_view("\x05\x00\x00\x00xy", 6));
  CHECK(short_bytes.U32(&n));
  CHECK_FALSE(short_bytes.Bytes(n, &text));
  CHECK(short_bytes.offset() == 4);
  CHECK_FALSE(short_bytes.ok());
}

TEST_CASE("host probing", "[base]") {
  CHECK(!pb::HostName().empty());
  CHECK(!pb::UsableCpus().empty());
  CHECK(pb::OnlineCpuCount() >= 1);
}

TEST_CASE("net: addresses parse, join and resolve; a loopback port can be reserved", "[base]") {
  namespace net = pb::net;
  auto v6 = net::ParseHostPort("[::1]:29500", "test");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->port == 29500);
  CHECK(net::JoinHostPort(v6->host, v6->port) == "[::1]:29500");
  CHECK(net::JoinHostPort("10.0.0.1", 80) == "10.0.0.1:80");
  CHECK(net::IsIpLiteral("10.0.0.1"));
  CHECK(net::IsIpLiteral("::1"));
  CHECK(net::IsIpLiteral("fd00::2"));
  CHECK_FALSE(net::IsIpLiteral("[::1]"));
  CHECK_FALSE(net::IsIpLiteral("300.0.0.1"));
  CHECK_FALSE(net::IsIpLiteral("localhost"));
  CHECK_FALSE(net::IsIpLiteral(""));
  CHECK(net::ParseHostPort("::1:80", "the test address")
            .status()
            .message()
            .find("the test address '::1:80'") != std::string::npos);
  auto sa = net::ResolveFirst("127.0.0.1:7", "test");
  REQUIRE(sa.ok());
  CHECK(sa->family() == AF_INET);
  CHECK(net::FormatAddress(*sa) == "127.0.0.1:7");
  CHECK(absl::IsUnavailable(net::ErrnoStatus(ECONNREFUSED, "connect")));
  CHECK(net::ErrnoStatus(EMFILE, "accept").message() == "accept: Too many open files");
  // Reserved ports come from below the ephemeral range (where outgoing connections cannot take
  // them in between) and can be bound once released.
  for (int i = 0; i < 8; ++i) {
    auto port = net::ReserveLoopbackPort();
    REQUIRE(port.ok());
    CHECK(*port != 0);
    if (net::EphemeralPortLow() > 11000) CHECK(*port < net::EphemeralPortLow());
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(*port);
    CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    close(fd);
  }
}

TEST_CASE("WaitPolicy: spin, then yield, then sleep", "[base][wait]") {
  using plexus::base::WaitPolicy;
  using Phase = WaitPolicy::Phase;
  const WaitPolicy w(absl::Microseconds(50), absl::Milliseconds(2));
  CHECK(w.At(absl::ZeroDuration()) == Phase::kSpin);
  CHECK(w.At(absl::Microseconds(49)) == Phase::kSpin);
  CHECK(w.At(absl::Microseconds(50)) == Phase::kYield);
  CHECK(w.At(absl::Microseconds(1999)) == Phase::kYield);
  CHECK(w.At(absl::Milliseconds(2)) == Phase::kSleep);
  CHECK(w.At(absl::InfiniteDuration()) == Phase::kSleep);
  // No spin (an oversubscribed host): yield at once.
  const WaitPolicy no_spin(absl::ZeroDuration(), absl::Milliseconds(2));
  CHECK(no_spin.At(absl::ZeroDuration()) == Phase::kYield);
  CHECK(no_spin.At(absl::Milliseconds(2)) == Phase::kSleep);
  // sleep_after <= spin: spin, then sleep, no yielding (the completion queue's Wait).
  const WaitPolicy cq(absl::Microseconds(20), absl::Microseconds(20));
  CHECK(cq.At(absl::Microseconds(19)) == Phase::kSpin);
  CHECK(cq.At(absl::Microseconds(20)) == Phase::kSleep);
  const WaitPolicy long_spin(absl::Milliseconds(5), absl::Milliseconds(2));
  CHECK(long_spin.sleep_after() == absl::Milliseconds(5));
  CHECK(long_spin.At(absl::Milliseconds(3)) == Phase::kSpin);
  CHECK(long_spin.At(absl::Milliseconds(5)) == Phase::kSleep);
  // Negative spin counts as none.
  CHECK(WaitPolicy(absl::Microseconds(-1), absl::Milliseconds(1)).At(absl::ZeroDuration()) ==
        Phase::kYield);
}

TEST_CASE("WaitPolicy: SpinUntil, Sleep and AwaitOthersProgress bound their waits",
          "[base][wait]") {
  using plexus::base::WaitPolicy;
  int calls = 0;
  CHECK(WaitPolicy::SpinUntil(absl::Now() + absl::Seconds(10), [&] { return ++calls == 5; }));
  CHECK(calls == 5);
  // A passed deadline does not call at all; a condition that never holds spins until it.
  calls = 0;
  CHECK_FALSE(WaitPolicy::SpinUntil(absl::Now() - absl::Seconds(1), [&] { return ++calls > 0; }));
  CHECK(calls == 0);
  absl::Time start = absl::Now();
  CHECK_FALSE(WaitPolicy::SpinUntil(start + absl::Milliseconds(2), [] { return false; }));
  CHECK(absl::Now() - start >= absl::Milliseconds(2));

  start = absl::Now();
  WaitPolicy::Sleep(absl::Milliseconds(3));
  CHECK(absl::Now() - start >= absl::Milliseconds(3));
  // Zero and negative durations return at once; so does a caller that only polls.
  start = absl::Now();
  WaitPolicy::Sleep(absl::ZeroDuration());
  WaitPolicy::Sleep(absl::Seconds(-5));
  WaitPolicy::AwaitOthersProgress(absl::ZeroDuration());
  CHECK(absl::Now() - start < absl::Seconds(1));
  // A long max_block is cut to kOthersProgress.
  start = absl::Now();
  WaitPolicy::AwaitOthersProgress(absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  CHECK(took >= WaitPolicy::kOthersProgress);
  CHECK(took < absl::Seconds(1));
}

TEST_CASE("AdaptiveSpin: stops after spins that miss, probes, resumes on a probe that hits",
          "[base][wait]") {
  using plexus::base::AdaptiveSpin;
  const absl::Duration us20 = absl::Microseconds(20), late = absl::Microseconds(40);
  AdaptiveSpin s(us20);
  // Hits keep it spinning; a hit resets the misses.
  for (uint32_t i = 0; i + 1 < AdaptiveSpin::kMissesToStop; ++i) s.Record(s.spin(), late);
  s.Record(s.spin(), absl::Microseconds(5));
  CHECK(s.spinning());
  for (uint32_t i = 0; i + 1 < AdaptiveSpin::kMissesToStop; ++i) s.Record(s.spin(), late);
  CHECK(s.spinning());
  s.Record(s.spin(), late);  // the kMissesToStop-th miss in a row
  CHECK_FALSE(s.spinning());
  // Off: no spin, except a probe after kProbeEvery waits; each probe that misses doubles the
  // waits to the next one, up to kMaxProbeEvery; waits without a spin say nothing.
  auto waits_to_probe = [&](absl::Duration probe_waited) {
    uint32_t waits = 1;
    absl::Duration spun;
    while ((spun = s.spin()) == absl::ZeroDuration()) {
      s.Record(spun, absl::Microseconds(1));
      CHECK_FALSE(s.spinning());
      ++waits;
      REQUIRE(waits <= AdaptiveSpin::kMaxProbeEvery);
    }
    CHECK(spun == us20);
    s.Record(spun, probe_waited);
    return waits;
  };
  uint32_t expected = AdaptiveSpin::kProbeEvery;
  for (int probe = 0; probe < 10; ++probe) {
    CHECK(waits_to_probe(late) == expected);  // a probe that misses: still off
    CHECK_FALSE(s.spinning());
    expected = std::min(expected * 2, AdaptiveSpin::kMaxProbeEvery);
  }
  CHECK(s.probe_every() == AdaptiveSpin::kMaxProbeEvery);
  CHECK(waits_to_probe(late) == AdaptiveSpin::kMaxProbeEvery);  // capped
  // A probe that catches its event turns spinning back on, and the probes start over.
  CHECK(waits_to_probe(absl::Microseconds(3)) == AdaptiveSpin::kMaxProbeEvery);
  CHECK(s.spinning());
  CHECK(s.spin() == us20);
  CHECK(s.probe_every() == AdaptiveSpin::kProbeEvery);
  for (uint32_t i = 0; i < AdaptiveSpin::kMissesToStop; ++i) s.Record(s.spin(), late);
  CHECK_FALSE(s.spinning());
  CHECK(waits_to_probe(late) == AdaptiveSpin::kProbeEvery);
}

TEST_CASE("AdaptiveToggle: on until tries stop paying, probes while off, back on when one pays",
          "[base][wait]") {
  using plexus::base::AdaptiveToggle;
  AdaptiveToggle t;
  CHECK(t.on());
  CHECK(t.Next());
  // A try that pays resets the misses: kMissesToStop - 1 misses, a hit, then as many again.
  for (uint32_t i = 0; i + 1 < AdaptiveToggle::kMissesToStop; ++i) t.Record(false);
  t.Record(true);
  for (uint32_t i = 0; i + 1 < AdaptiveToggle::kMissesToStop; ++i) t.Record(false);
  CHECK(t.on());
  t.Record(false);  // the kMissesToStop-th miss in a row
  CHECK_FALSE(t.on());
  // Off: one probe every kProbeEvery chances; a probe that does not pay keeps it off.
  int probes = 0;
  for (uint32_t i = 0; i < 3 * AdaptiveToggle::kProbeEvery; ++i) {
    if (t.Next()) {
      ++probes;
      t.Record(false);
    }
  }
  CHECK(probes == 3);
  CHECK_FALSE(t.on());
  while (!t.Next()) {
  }
  t.Record(true);  // a probe that pays
  CHECK(t.on());
  CHECK(t.Next());
  // Thresholds of the caller's: off after 2 misses, a probe every 4 chances.
  AdaptiveToggle quick(2, 4);
  quick.Record(false);
  CHECK(quick.on());
  quick.Record(false);
  CHECK_FALSE(quick.on());
  CHECK_FALSE(quick.Next());
  CHECK_FALSE(quick.Next());
  CHECK_FALSE(quick.Next());
  CHECK(quick.Next());
}

TEST_CASE("Backoff: doubling delays up to the cap, jitter within bounds, cut at the deadline",
          "[base][wait]") {
  using plexus::base::Backoff;
  Backoff b(absl::Milliseconds(5), absl::Milliseconds(30));
  CHECK(b.delay() == absl::Milliseconds(5));
  CHECK(b.Next() == absl::Milliseconds(5));
  CHECK(b.Next() == absl::Milliseconds(10));
  CHECK(b.Next() == absl::Milliseconds(20));
  CHECK(b.Next() == absl::Milliseconds(30));  // capped
  CHECK(b.Next() == absl::Milliseconds(30));
  CHECK(b.delay() == absl::Milliseconds(30));
  b.Reset();
  CHECK(b.Next() == absl::Milliseconds(5));

  Backoff jittered(absl::Milliseconds(5), absl::Milliseconds(5), absl::Milliseconds(10));
  bool varied = false;
  absl::Duration first = jittered.Next();
  for (int i = 0; i < 50; ++i) {
    const absl::Duration d = jittered.Next();
    CHECK(d >= absl::Milliseconds(5));
    CHECK(d < absl::Milliseconds(15));
    varied |= d != first;
  }
  CHECK(varied);

  // A passed deadline: no sleep, false. A near one: the sleep stops there, not after `initial`.
  Backoff slow(absl::Seconds(30), absl::Seconds(60));
  const absl::Time start = absl::Now();
  CHECK_FALSE(slow.SleepBefore(start - absl::Milliseconds(1)));
  CHECK(slow.SleepBefore(start + absl::Milliseconds(20)));
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK_FALSE(slow.SleepBefore(start + absl::Milliseconds(20)));
}

TEST_CASE("PollUntil: true once the condition holds, false at the deadline, always polls once",
          "[base][wait]") {
  int calls = 0;
  CHECK(plexus::base::PollUntil(absl::Now() + absl::Seconds(10), absl::Milliseconds(1),
                                [&] { return ++calls == 3; }));
  CHECK(calls == 3);
  calls = 0;
  const absl::Time start = absl::Now();
  CHECK_FALSE(plexus::base::PollUntil(start + absl::Milliseconds(30), absl::Milliseconds(5), [&] {
    ++calls;
    return false;
  }));
  CHECK(absl::Now() - start >= absl::Milliseconds(30));
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(calls >= 2);
  // A passed deadline still polls once.
  calls = 0;
  CHECK(plexus::base::PollUntil(start - absl::Seconds(1), absl::Seconds(1), [&] {
    ++calls;
    return true;
  }));
  CHECK(calls == 1);
}

TEST_CASE("WaitPolicy::Yield finds a contended CPU and remembers it", "[base][wait]") {
  using plexus::base::WaitPolicy;
  // This thread and a busy one share one CPU: a yield hands it to the busy thread for a time
  // slice, which is what a loaded host does to a yielding waiter.
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  REQUIRE(cpu < CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    sched_setaffinity(0, sizeof(one), &one);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  bool contended = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!contended && absl::Now() < deadline) contended = WaitPolicy::Yield();
  stop = true;
  busy.join();
  sched_setaffinity(0, sizeof(mine), &mine);
  CHECK(contended);
  // Remembered: the next waits are told to sleep without yielding first.
  CHECK(WaitPolicy::Yield());
}

TEST_CASE("hash: FNV-1a 64 matches the published vectors and continues over pieces", "[base]") {
  namespace pb = plexus::base;
  static_assert(pb::Fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(pb::Fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(pb::Fnv1a64("foobar") == 0x85944171f73967e8ull);
  CHECK(pb::Fnv1a64("bar", pb::Fnv1a64("foo")) == pb::Fnv1a64("foobar"));
  const unsigned char bytes[3] = {0x00, 0xff, 0x80};
  CHECK(pb::Fnv1a64(std::string_view(reinterpret_cast<const char*>(bytes), 3)) ==
        pb::Fnv1a64(std::string("\x00\xff\x80", 3)));
  // One flipped bit changes the hash.
  CHECK(pb::Fnv1a64("foobar") != pb::Fnv1a64("foobas"));
}

TEST_CASE("json: integers are read within their range, never wrapped", "[base]") {
  namespace pj = plexus::base::json;
  const pj::Json doc =
      pj::Json::parse(R"({"small": 12, "negative": -3, "huge": 9223372036854775808, "real": 2.5})");
  CHECK(*pj::IntegerField(doc, "doc", "small", true) == 12);
  CHECK(*pj::IntegerField(doc, "doc", "negative", true) == -3);
  auto huge = pj::IntegerField(doc, "doc", "huge", true);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().message() ==
        "doc.huge: expected an integer in -9223372036854775808..9223372036854775807, got "
        "9223372036854775808");
  CHECK(pj::IntegerField(doc, "doc", "real", true).status().message() ==
        "doc.real: expected an integer, got 2.5");
  CHECK(pj::IntegerValue(doc["small"], "doc.small", 0, 10).status().message() ==
        "doc.small: expected an integer in 0..10, got 12");
  CHECK(pj::IntegerValue(doc["negative"], "doc.negative", 0, 10).status().message() ==
        "doc.negative: expected an integer in 0..10, got -3");
  CHECK(*pj::IntegerValue(doc["small"], "doc.small", 0, 12) == 12);
}

TEST_CASE("tick clock: monotonic on one thread and ticking at its stated rate", "[base]") {
  const double per_second = pb::TicksPerSecond();
  REQUIRE(per_second >= 1e8);
  int64_t last = pb::TickNow();
  for (int i = 0; i < 100000; ++i) {
    const int64_t now = pb::TickNow();
    REQUIRE(now >= last);
    last = now;
  }
  // 50 ms in ticks against the wall clock read around each end (inner and outer interval), with
  // 10 % for the rate's measurement.
  const absl::Time w0 = absl::Now();
  const int64_t t0 = pb::TickNow();
  const absl::Time w1 = absl::Now();
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time w2 = absl::Now();
  const int64_t t1 = pb::TickNow();
  const absl::Time w3 = absl::Now();
  const double ticked = static_cast<double>(t1 - t0) / per_second;
  CHECK(ticked >= absl::ToDoubleSeconds(w2 - w1) * 0.9);
  CHECK(ticked <= absl::ToDoubleSeconds(w3 - w0) * 1.1);
}
