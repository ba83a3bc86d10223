// Reduction kernels (AVX2 against scalar, f16/bf16 rounding), the selector table and the call
// header: the pieces below the communicator.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "blame.hpp"
#include "plan.hpp"
#include "plexus/base/record.hpp"
#include "plexus/collectives/selector.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/netmodel/schedule.hpp"
#include "plexus/transport/store.hpp"
#include "reconfig.hpp"
#include "wire.hpp"

namespace pc = plexus::collectives;
namespace pi = plexus::collectives::internal;
using pc::Algorithm;
using pc::CollectiveKind;
using pc::DataType;
using pc::ReduceOp;

TEST_CASE("f16 and bf16 conversions round to nearest even", "[collectives]") {
  CHECK(plexus::kernels::FloatToHalf(1.0f) == 0x3C00);
  CHECK(plexus::kernels::FloatToHalf(65504.0f) == 0x7BFF);
  CHECK(plexus::kernels::FloatToHalf(65520.0f) ==
        0x7C00);  // halfway to the next: rounds to infinity
  CHECK(plexus::kernels::FloatToHalf(1.0f + 1.0f / 2048) == 0x3C00);  // tie: even
  CHECK(plexus::kernels::FloatToHalf(1.0f + 3.0f / 2048) == 0x3C02);  // tie: even (up)
  CHECK(plexus::kernels::FloatToHalf(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(plexus::kernels::FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(plexus::kernels::FloatToHalf(-0.0f) == 0x8000);
  CHECK((plexus::kernels::FloatToHalf(NAN) & 0x7E00) == 0x7E00);
  CHECK(plexus::kernels::FloatToBf16(1.0f) == 0x3F80);
  CHECK(plexus::kernels::FloatToBf16(1.0f + 1.0f / 256) == 0x3F80);  // tie: even
  CHECK(plexus::kernels::FloatToBf16(1.0f + 3.0f / 256) == 0x3F82);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = plexus::kernels::HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(plexus::kernels::FloatToHalf(f) == h);  // every half survives a round trip
  }
}

// Its own CTest entry (collectives_unit_avx2), reported skipped on a CPU without AVX2.
TEST_CASE("AVX2 kernels are bit-identical to the scalar ones", "[collectives][avx2]") {
  if (!plexus::kernels::Avx2Active()) {
    std::printf("SKIP: this CPU has no AVX2/F16C: only the scalar kernels run\n");
    return;
  }
  std::mt19937 rng(7);
  const size_t n = 1003;  // a vector body and a scalar tail
  for (int t = 0; t < pc::kNumDataTypes; ++t) {
    const DataType dt = static_cast<DataType>(t);
    const size_t es = pc::DataTypeSize(dt);
    for (int o = 0; o < pc::kNumReduceOps; ++o) {
      const ReduceOp op = static_cast<ReduceOp>(o);
      for (bool src_first : {false, true}) {
        std::vector<uint8_t> a(n * es + 1), b(n * es + 1);
        for (auto& x : a) x = static_cast<uint8_t>(rng());
        for (auto& x : b) x = static_cast<uint8_t>(rng());
        // Special values for the floating types: signed zeros, infinities, NaNs.
        if (dt == DataType::kF32) {
          const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f};
          for (size_t i = 0; i < 6; ++i) std::memcpy(&a[1 + 4 * i], &specials[i], 4);
          for (size_t i = 0; i < 6; ++i) std::memcpy(&b[1 + 4 * i], &specials[5 - i], 4);
        }
        std::vector<uint8_t> vec = a, scalar = a;
        plexus::kernels::ReduceInto(dt, op, vec.data() + 1, b.data() + 1, n,
                                    src_first);  // unaligned
        const bool was = plexus::kernels::SetAvx2Allowed(false);
        plexus::kernels::ReduceInto(dt, op, scalar.data() + 1, b.data() + 1, n, src_first);
        plexus::kernels::SetAvx2Allowed(was);
        INFO(pc::DataTypeName(dt) << " " << pc::ReduceOpName(op) << " src_first " << src_first);
        REQUIRE(vec == scalar);
      }
    }
  }
}

TEST_CASE("ReduceOutOf equals a copy then ReduceInto, vector and scalar", "[collectives]") {
  std::mt19937 rng(11);
  const size_t n = 1003;
  for (int t = 0; t < pc::kNumDataTypes; ++t) {
    const DataType dt = static_cast<DataType>(t);
    const size_t es = pc::DataTypeSize(dt);
    for (int o = 0; o < pc::kNumReduceOps; ++o) {
      const ReduceOp op = static_cast<ReduceOp>(o);
      for (bool src_first : {false, true}) {
        for (bool avx2 : {true, false}) {
          std::vector<uint8_t> local(n * es + 1), src(n * es + 1);
          for (auto& x : local) x = static_cast<uint8_t>(rng());
          for (auto& x : src) x = static_cast<uint8_t>(rng());
          const bool was = plexus::kernels::SetAvx2Allowed(avx2);
          std::vector<uint8_t> expected = local;
          plexus::kernels::ReduceInto(dt, op, expected.data() + 1, src.data() + 1, n, src_first);
          // dst distinct from local (filled with garbage it must overwrite), unaligned.
          std::vector<uint8_t> out(n * es + 3, 0xA5);
          plexus::kernels::ReduceOutOf(dt, op, out.data() + 3, local.data() + 1, src.data() + 1, n,
                                       src_first);
          // dst equal to local: the in-place form.
          std::vector<uint8_t> same = local;
          plexus::kernels::ReduceOutOf(dt, op, same.data() + 1, same.data() + 1, src.data() + 1, n,
                                       src_first);
          plexus::kernels::SetAvx2Allowed(was);
          INFO(pc::DataTypeName(dt)
               << " " << pc::ReduceOpName(op) << " src_first " << src_first << " avx2 " << avx2);
          REQUIRE(std::memcmp(out.data() + 3, expected.data() + 1, n * es) == 0);
          REQUIRE(same == expected);
          // The local operand is read only.
          std::vector<uint8_t> again = local;
          plexus::kernels::ReduceOutOf(dt, op, out.data() + 3, again.data() + 1, src.data() + 1, n,
                                       src_first);
          REQUIRE(again == local);
        }
      }
    }
  }
}

TEST_CASE("scalar kernels compute the operation", "[collectives]") {
  int32_t a[3] = {5, -7, 2147483647};
  const int32_t b[3] = {3, 9, 1};
  plexus::kernels::ReduceInto(DataType::kI32, ReduceOp::kSum, a, b, 3, false);
  CHECK(a[0] == 8);
  CHECK(a[1] == 2);
  CHECK(a[2] == -2147483647 - 1);  // wraps
  float f[2] = {1.5f, -2.0f};
  const float g[2] = {2.0f, -3.0f};
  plexus::kernels::ReduceInto(DataType::kF32, ReduceOp::kMin, f, g, 2, false);
  CHECK(f[0] == 1.5f);
  CHECK(f[1] == -3.0f);
  int64_t avg[2] = {10, -9};
  plexus::kernels::DivideInPlace(DataType::kI64, avg, 2, 4);
  CHECK(avg[0] == 2);
  int8_t c[3] = {100, -100, -3};
  const int8_t d[3] = {100, -100, 5};
  plexus::kernels::ReduceInto(DataType::kI8, ReduceOp::kSum, c, d, 3, false);
  CHECK(c[0] == -56);  // wraps
  CHECK(c[1] == 56);
  CHECK(c[2] == 2);
  int8_t lo[2] = {-3, 7};
  const int8_t hi[2] = {5, -8};
  plexus::kernels::ReduceInto(DataType::kI8, ReduceOp::kMin, lo, hi, 2, false);
  CHECK(lo[0] == -3);  // signed comparison
  CHECK(lo[1] == -8);
  int8_t q[2] = {-9, 9};
  plexus::kernels::DivideInPlace(DataType::kI8, q, 2, 4);
  CHECK(q[0] == -2);
  CHECK(q[1] == 2);
  CHECK(avg[1] == -2);
}

TEST_CASE("selector table: default, parsing, errors and round trip", "[collectives]") {
  const pc::AlgorithmTable def = pc::AlgorithmTable::Default();
  CHECK(def.Select(CollectiveKind::kAllReduce, 4, 8) == Algorithm::kHalvingDoubling);
  CHECK(def.Select(CollectiveKind::kAllReduce, 4, 64 << 20) == Algorithm::kRing);
  // 4 ranks over tcp: whole-vector recursive doubling from 64 to 128 KiB, halving-doubling to
  // 8 MiB (fewer dependent steps), ring from there; not over shm, not for other worlds.
  const pc::AlgorithmTable tcp = pc::AlgorithmTable::Default(/*tcp=*/true);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, (64 << 10) - 1) == Algorithm::kHalvingDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, 64 << 10) == Algorithm::kRecursiveDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, (128 << 10) - 1) ==
        Algorithm::kRecursiveDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, 128 << 10) == Algorithm::kHalvingDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, (8 << 20) - 1) == Algorithm::kHalvingDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, 8 << 20) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 2, 1 << 20) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 3, 256 << 10) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 8, 256 << 10) == Algorithm::kTree);
  CHECK(tcp.Select(CollectiveKind::kAllReduce, 4, 8) == Algorithm::kHalvingDoubling);
  CHECK(def.Select(CollectiveKind::kAllReduce, 4, 64 << 10) == Algorithm::kRing);
  // Broadcast, 4 ranks over tcp: the double tree at every size; elsewhere the chain from 256 KiB.
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 4, 8) == Algorithm::kTree);
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 4, 1 << 20) == Algorithm::kTree);
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 4, size_t{64} << 20) == Algorithm::kTree);
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 2, 1 << 20) == Algorithm::kRing);
  // 2 ranks: the chain's one message, not the double tree's two halves (over tcp at every size,
  // elsewhere from 4 KiB, below which the mailbox tree is faster); AllGather by the ring from
  // 8 KiB where no pair uses tcp, the mailbox exchange below.
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 2, 8) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kReduce, 2, 8) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kReduce, 4, 8) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kBroadcast, 2, (4 << 10) - 1) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kBroadcast, 2, 4 << 10) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kBroadcast, 3, 4 << 10) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kReduce, 2, 8) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kReduce, 2, 1 << 20) == Algorithm::kHalvingDoubling);
  CHECK(def.Select(CollectiveKind::kReduce, 2, (8 << 20) - 1) == Algorithm::kHalvingDoubling);
  CHECK(def.Select(CollectiveKind::kReduce, 2, 8 << 20) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kReduce, 2, 1 << 20) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kAllGather, 2, (8 << 10) - 1) == Algorithm::kHalvingDoubling);
  CHECK(def.Select(CollectiveKind::kAllGather, 2, 8 << 10) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kAllGather, 4, 8 << 10) == Algorithm::kHalvingDoubling);
  CHECK(tcp.Select(CollectiveKind::kAllGather, 2, 8 << 10) == Algorithm::kHalvingDoubling);
  CHECK(tcp.Select(CollectiveKind::kBroadcast, 8, 1 << 20) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kBroadcast, 4, 1 << 20) == Algorithm::kRing);
  // Reduce, 4 ranks not over tcp: the tree from 1 to 8 MiB; elsewhere the ring from 256 KiB.
  CHECK(def.Select(CollectiveKind::kReduce, 4, (1 << 20) - 1) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kReduce, 4, 1 << 20) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kReduce, 4, (8 << 20) - 1) == Algorithm::kTree);
  CHECK(def.Select(CollectiveKind::kReduce, 4, 8 << 20) == Algorithm::kRing);
  CHECK(def.Select(CollectiveKind::kReduce, 8, 1 << 20) == Algorithm::kRing);
  CHECK(tcp.Select(CollectiveKind::kReduce, 4, 1 << 20) == Algorithm::kRing);
  auto tcp_parsed = pc::AlgorithmTable::Parse(tcp.ToString());
  REQUIRE(tcp_parsed.ok());
  CHECK(tcp_parsed->ToString() == tcp.ToString());
  auto parsed = pc::AlgorithmTable::Parse(def.ToString());
  REQUIRE(parsed.ok());
  CHECK(parsed->ToString() == def.ToString());

  auto t = pc::AlgorithmTable::Parse(
      "# comment\nallreduce 2-4 0-1K tree\nallreduce * 1K- hd\nbroadcast 8- * ring\n");
  REQUIRE(t.ok());
  CHECK(t->Select(CollectiveKind::kAllReduce, 3, 1024) == Algorithm::kTree);
  CHECK(t->Select(CollectiveKind::kAllReduce, 3, 1025) == Algorithm::kHalvingDoubling);
  CHECK(t->Select(CollectiveKind::kAllReduce, 8, 10) == Algorithm::kRing);  // no rule
  CHECK(t->Select(CollectiveKind::kBroadcast, 9, 10) == Algorithm::kRing);
  // Byte numbers take base::ParseBytes's forms (KiB as well as K).
  auto kib = pc::AlgorithmTable::Parse("allreduce * 0-1KiB tree\n");
  REQUIRE(kib.ok());
  CHECK(kib->Select(CollectiveKind::kAllReduce, 3, 1024) == Algorithm::kTree);
  CHECK(kib->Select(CollectiveKind::kAllReduce, 3, 1025) == Algorithm::kRing);

  for (const char* bad : {"allreduce 2-4 0-1K", "allgatherz * * ring", "allreduce 4-2 * ring",
                          "allreduce * 1Q ring", "allreduce * * auto", "allreduce * * bogus"}) {
    INFO(bad);
    auto r = pc::AlgorithmTable::Parse(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()).find("line 1") != std::string::npos);
  }
  auto bad_bytes = pc::AlgorithmTable::Parse("allreduce * 1Q ring");
  CHECK(std::string(bad_bytes.status().message()).find("byte range") != std::string::npos);
  CHECK_FALSE(pc::AlgorithmTable::Load("/nonexistent/table").ok());

  auto o = pc::AlgorithmOverrides::Parse("allreduce:ring; broadcast:tree");
  REQUIRE(o.ok());
  CHECK(o->Get(CollectiveKind::kAllReduce) == Algorithm::kRing);
  CHECK(o->Get(CollectiveKind::kBroadcast) == Algorithm::kTree);
  CHECK(o->Get(CollectiveKind::kReduce) == Algorithm::kAuto);
  auto all = pc::AlgorithmOverrides::Parse("*:hd");
  REQUIRE(all.ok());
  CHECK(all->Get(CollectiveKind::kAllGather) == Algorithm::kHalvingDoubling);
  CHECK_FALSE(pc::AlgorithmOverrides::Parse("allreduce").ok());
  CHECK_FALSE(pc::AlgorithmOverrides::Parse("allreduce:fast").ok());
}

TEST_CASE("call header round trip and rejection of garbage", "[collectives]") {
  pi::CallHeader h;
  h.kind = CollectiveKind::kReduce;
  h.dtype = DataType::kBF16;
  h.op = ReduceOp::kMax;
  h.algorithm = Algorithm::kTree;
  h.root = 3;
  h.sender = 5;
  h.sequence = 123456789;
  h.count = 1ull << 33;
  h.extra = 17;
  h.communicator = 0xABCDEF;
  h.epoch = 0x0102030405060708ull;
  uint8_t buf[pi::CallHeader::kEncodedSize];
  h.Encode(buf);
  auto d = pi::CallHeader::Decode(absl::MakeConstSpan(buf, sizeof buf));
  REQUIRE(d.ok());
  CHECK(d->SameCall(h));
  CHECK(d->sender == 5);
  CHECK(d->extra == 17);
  // The configuration epoch: bytes 56-63, little endian; the header stays 64 bytes.
  CHECK(d->epoch == h.epoch);
  CHECK(pi::CallHeader::kEncodedSize == 64);
  CHECK(buf[56] == 0x08);
  CHECK(buf[63] == 0x01);
  pi::CallHeader unchanged = h;
  unchanged.epoch = 0;
  uint8_t zero[pi::CallHeader::kEncodedSize];
  unchanged.Encode(zero);
  for (size_t i = 56; i < 64; ++i) CHECK(zero[i] == 0);  // as version 1 before the epoch
  CHECK(d->Describe().find("reduce #123456789") != std::string::npos);
  CHECK_FALSE(pi::CallHeader::Decode(absl::MakeConstSpan(buf, 10)).ok());
  buf[0] ^= 1;
  CHECK_FALSE(pi::CallHeader::Decode(absl::MakeConstSpan(buf, sizeof buf)).ok());
  buf[0] ^= 1;
  buf[6] = 99;  // dtype out of range
  CHECK_FALSE(pi::CallHeader::Decode(absl::MakeConstSpan(buf, sizeof buf)).ok());
}

TEST_CASE("names parse back", "[collectives]") {
  for (int t = 0; t < pc::kNumDataTypes; ++t) {
    auto p = pc::ParseDataType(pc::DataTypeName(static_cast<DataType>(t)));
    REQUIRE(p.ok());
    CHECK(static_cast<int>(*p) == t);
  }
  CHECK(pc::ParseAlgorithm("HD").value() == Algorithm::kHalvingDoubling);
  for (int a = 0; a < pc::kNumAlgorithms; ++a) {
    auto p = pc::ParseAlgorithm(pc::AlgorithmName(static_cast<Algorithm>(a)));
    REQUIRE(p.ok());
    CHECK(static_cast<int>(*p) == a);
  }
  CHECK(pc::ParseAlgorithm("rd").value() == Algorithm::kRecursiveDoubling);
  CHECK_FALSE(pc::ParseReduceOp("mean").ok());
}

TEST_CASE("blame accounts round-trip and reject garbage", "[collectives][unit]") {
  pi::Blame b;
  b.final = false;
  b.code = absl::StatusCode::kDeadlineExceeded;
  b.ranks = {2, 5};
  b.reporter = 1;
  b.at_ms = 1700000000123;
  b.reason = "made no progress | with a bar";
  auto back = pi::Blame::Decode(b.Encode());
  REQUIRE(back.has_value());
  CHECK(!back->final);
  CHECK(back->code == absl::StatusCode::kDeadlineExceeded);
  CHECK(back->ranks == std::vector<int>{2, 5});
  CHECK(back->reporter == 1);
  CHECK(back->at_ms == 1700000000123);
  CHECK(back->reason == b.reason);
  CHECK(!back->call.has_value());
  // A wait record names the call it waits in.
  pi::CallHeader h;
  h.kind = CollectiveKind::kBroadcast;
  h.root = 3;
  h.sequence = 41;
  h.count = 1000;
  h.epoch = 2;
  b.call = h;
  auto with_call = pi::Blame::Decode(b.Encode());
  REQUIRE(with_call.has_value());
  REQUIRE(with_call->call.has_value());
  CHECK(with_call->call->SameCall(h));
  CHECK(with_call->call->epoch == 2);
  b.call.reset();
  // A record written field by field: a final account of code 4 blaming rank 1, and the same
  // with one field bad, missing, mistyped, extra or cut short.
  const auto record = [](int64_t final, int64_t code, std::vector<int> ranks, bool with_reason,
                         bool at_as_text, std::string call = "") {
    plexus::base::RecordWriter w("collectives.blame", 2);
    w.Int("final", final).Int("code", code).Ints("ranks", ranks).Int("reporter", 0);
    if (at_as_text) {
      w.String("at_ms", "soon");
    } else {
      w.Int("at_ms", 5);
    }
    if (with_reason) w.String("reason", "x").String("call", call);
    return w.Finish();
  };
  auto good = pi::Blame::Decode(record(1, 4, {1}, true, false));
  REQUIRE(good.has_value());
  CHECK(good->final);
  CHECK(good->code == absl::StatusCode::kDeadlineExceeded);
  CHECK(good->ranks == std::vector<int>{1});
  CHECK(good->reason == "x");
  CHECK(!pi::Blame::Decode(record(1, 99, {1}, true, false)).has_value());  // no such code
  CHECK(!pi::Blame::Decode(record(2, 4, {1}, true, false)).has_value());   // neither F nor W
  CHECK(!pi::Blame::Decode(record(1, 4, {-1}, true, false)).has_value());  // no such rank
  CHECK(!pi::Blame::Decode(record(1, 4, {1}, true, true)).has_value());    // a time as text
  CHECK(!pi::Blame::Decode(record(1, 4, {1}, false, false)).has_value());  // no reason
  // A call that is not 64 bytes of header in hex.
  CHECK(!pi::Blame::Decode(record(1, 4, {1}, true, false, "zz")).has_value());
  CHECK(!pi::Blame::Decode(record(1, 4, {1}, true, false, std::string(128, 'g'))).has_value());
  CHECK(!pi::Blame::Decode(record(1, 4, {1}, true, false, std::string(128, '0'))).has_value());
  const std::string full = record(1, 4, {1}, true, false);
  CHECK(!pi::Blame::Decode(full.substr(0, full.size() - 1)).has_value());  // cut short
  CHECK(!pi::Blame::Decode(full + "x").has_value());                       // trailing bytes
  // The '|'-separated form of earlier builds is not a record.
  CHECK(!pi::Blame::Decode("F|4|1|0|5|x").has_value());
  // An over-long reason is cut on encoding, so that it still decodes.
  b.reason = std::string(5000, 'r');
  auto cut = pi::Blame::Decode(b.Encode());
  REQUIRE(cut.has_value());
  CHECK(cut->reason.size() == 1024);
}

TEST_CASE("reconfiguration requests round-trip as records and reject garbage",
          "[collectives][unit]") {
  pc::Reconfiguration change;
  change.ring_order = std::vector<int>{0, 2, 1, 3};
  change.channels = 3;
  change.transport =
      pc::TransportChoice{plexus::transport::Backend::kTcp, pc::TransportPolicy::kPerPeer};
  pc::AlgorithmOverrides overrides;
  overrides.Set(CollectiveKind::kAllReduce, Algorithm::kTree);
  change.algorithms = overrides;
  auto back = pi::DecodeReconfiguration(pi::EncodeReconfiguration(change, 2));
  REQUIRE(back.ok());
  CHECK(back->requester == 2);
  CHECK(back->change.ring_order == change.ring_order);
  CHECK(back->change.channels == 3);
  REQUIRE(back->change.transport.has_value());
  CHECK(back->change.transport->backend == plexus::transport::Backend::kTcp);
  CHECK(back->change.transport->policy == pc::TransportPolicy::kPerPeer);
  REQUIRE(back->change.algorithms.has_value());
  CHECK(back->change.algorithms->Get(CollectiveKind::kAllReduce) == Algorithm::kTree);
  // Only what was asked travels.
  auto bare = pi::DecodeReconfiguration(pi::EncodeReconfiguration(pc::Reconfiguration{}, 0));
  REQUIRE(bare.ok());
  CHECK_FALSE(bare->change.ring_order.has_value());
  CHECK_FALSE(bare->change.channels.has_value());
  // Refusals name the field.
  const auto refused = [](const std::string& bytes, const std::string& says) {
    auto r = pi::DecodeReconfiguration(bytes);
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(absl::StrContains(r.status().message(), says));
  };
  refused("requester=1\nchannels=2\n", "not a record");
  refused(plexus::base::RecordWriter("collectives.reconfig", 1).Int("channels", 2).Finish(),
          "field 'requester': is missing");
  refused(plexus::base::RecordWriter("collectives.reconfig", 1)
              .Int("requester", 0)
              .Int("channels", 0)
              .Finish(),
          "field 'channels': 0 is outside [1, 64]");
  refused(plexus::base::RecordWriter("collectives.reconfig", 1)
              .Int("requester", 0)
              .String("transport", "carrier-pigeon")
              .Finish(),
          "field 'transport': ");
  refused(plexus::base::RecordWriter("collectives.reconfig", 1)
              .Int("requester", 0)
              .Int("colour", 1)
              .Finish(),
          "unknown field 'colour'");
}

namespace {

struct StoreFixture {
  std::unique_ptr<plexus::transport::TcpStoreServer> server;
  std::shared_ptr<plexus::transport::Store> store;
  StoreFixture() {
    namespace pt = plexus::transport;
    auto started = pt::TcpStoreServer::Start("127.0.0.1:0");
    REQUIRE(started.ok());
    server = *std::move(started);
    auto client =
        pt::TcpStore::Connect("127.0.0.1:" + std::to_string(server->port()), absl::Seconds(5));
    REQUIRE(client.ok());
    store = *std::move(client);
  }
};

pi::Blame Stall(int self, std::vector<int> waiting) {
  pi::Blame b;
  b.final = false;
  b.code = absl::StatusCode::kDeadlineExceeded;
  b.ranks = std::move(waiting);
  b.reporter = self;
  b.reason = "made no progress for 1s";
  return b;
}

}  // namespace

TEST_CASE("blame follows a stall to the silent rank and adopts an aborted peer's account",
          "[collectives][unit]") {
  StoreFixture f;
  const uint64_t uid = 0xabc;
  // Rank 1 waits for rank 2; rank 2 (stopped) posted nothing.
  pi::BlameBoard one(f.store, uid, 1, absl::Seconds(1));
  one.PostWaiting({2}, absl::StatusCode::kDeadlineExceeded, "waiting");
  REQUIRE(one.Flush(absl::Now() + absl::Seconds(5)));
  pi::BlameBoard zero(f.store, uid, 0, absl::Seconds(1));
  pi::Blame got = zero.Resolve(Stall(0, {1}), {}, absl::Now() + absl::Milliseconds(100));
  CHECK(got.final);
  CHECK(got.ranks == std::vector<int>{2});
  CHECK(got.reporter == 0);
  CHECK(got.code == absl::StatusCode::kDeadlineExceeded);
  // Rank 0's final account is on the store once Resolve returns: rank 3, seeing rank 0 close,
  // adopts it.
  pi::Blame closed;
  closed.code = absl::StatusCode::kUnavailable;
  closed.ranks = {0};
  closed.reporter = 3;
  closed.reason = "closed its connection";
  pi::BlameBoard three(f.store, uid, 3, absl::Seconds(1));
  got = three.Resolve(closed, {0}, absl::Now() + absl::Milliseconds(100));
  CHECK(got.ranks == std::vector<int>{2});
  CHECK(got.reporter == 0);
  CHECK(got.code == absl::StatusCode::kDeadlineExceeded);
  CHECK(got.reason == "made no progress for 1s");
}

// The 4-rank ring with rank 2 stopped, as seen by rank 3 timing out first: it waits for rank 2
// (receive) and rank 0 (send in flight); rank 1, behind rank 0, posted its wait record before
// anyone timed out. The silent rank is 2, whom ranks 1 and 3 wait for; not rank 0 or 1.
TEST_CASE("blame finds the silent rank through wait records posted before the timeout",
          "[collectives][unit]") {
  StoreFixture f;
  const uint64_t uid = 0xdef;
  pi::BlameBoard zero(f.store, uid, 0, absl::Seconds(1)), one(f.store, uid, 1, absl::Seconds(1)),
      three(f.store, uid, 3, absl::Seconds(1));
  zero.PostWaiting({3}, absl::StatusCode::kDeadlineExceeded, "waiting");
  one.PostWaiting({0, 2}, absl::StatusCode::kDeadlineExceeded, "waiting");
  REQUIRE(zero.Flush(absl::Now() + absl::Seconds(5)));
  REQUIRE(one.Flush(absl::Now() + absl::Seconds(5)));
  pi::Blame got = three.Resolve(Stall(3, {0, 2}), {}, absl::Now() + absl::Milliseconds(100));
  CHECK(got.ranks == std::vector<int>{2});
  CHECK(got.reporter == 3);
}

// A rank stopped while its own wait record was up (it waited for rank 0, then stopped): the
// record is no longer refreshed and is not trusted once older than `stale_after`. Rank 3 waits
// for rank 0, rank 0 for rank 2: rank 2 is the silent one. Trusting its old record would close a
// cycle 0 -> 2 -> 0 and leave rank 3 blaming rank 0.
TEST_CASE("blame does not trust a wait record its writer stopped refreshing",
          "[collectives][unit]") {
  StoreFixture f;
  for (const bool fresh : {false, true}) {
    const uint64_t uid = fresh ? 0x124 : 0x123;
    pi::Blame two = Stall(2, {0});
    two.at_ms = absl::ToUnixMillis(absl::Now() - (fresh ? absl::ZeroDuration() : absl::Seconds(5)));
    REQUIRE(f.store->Set(pi::BlameKey(uid, 2), two.Encode()).ok());
    pi::BlameBoard zero(f.store, uid, 0, absl::Seconds(1)),
        three(f.store, uid, 3, absl::Seconds(1));
    zero.PostWaiting({2}, absl::StatusCode::kDeadlineExceeded, "waiting");
    REQUIRE(zero.Flush(absl::Now() + absl::Seconds(5)));
    pi::Blame got = three.Resolve(Stall(3, {0}), {}, absl::Now() + absl::Milliseconds(100));
    INFO("rank 2's record fresh: " << fresh);
    // Fresh, the records form a cycle (ranks in different calls): rank 3 keeps its own view.
    CHECK(got.ranks == (fresh ? std::vector<int>{0} : std::vector<int>{2}));
    CHECK(got.reporter == 3);
  }
}

TEST_CASE("a blame board removes its wait record and leaves no key behind", "[collectives][unit]") {
  StoreFixture f;
  const uint64_t uid = 0x456;
  const std::string key = pi::BlameKey(uid, 1);
  {
    pi::BlameBoard board(f.store, uid, 1, absl::Seconds(1));
    board.Retract();  // nothing posted: no store traffic, no key
    CHECK(!board.posted());
    board.PostWaiting({0}, absl::StatusCode::kDeadlineExceeded, "waiting");
    CHECK(board.posted());
    REQUIRE(board.Flush(absl::Now() + absl::Seconds(5)));
    auto text = f.store->Get(key, absl::ZeroDuration());
    REQUIRE(text.ok());
    auto record = pi::Blame::Decode(*text);
    REQUIRE(record.has_value());
    CHECK(!record->final);
    CHECK(record->ranks == std::vector<int>{0});
    CHECK(std::abs(record->at_ms - absl::ToUnixMillis(absl::Now())) < 5000);
    // Many posts and a removal: the last request wins, in order.
    for (int i = 0; i < 50; ++i) {
      board.PostWaiting({i % 3}, absl::StatusCode::kDeadlineExceeded, "waiting");
    }
    board.Retract();
    CHECK(!board.posted());
    REQUIRE(board.Flush(absl::Now() + absl::Seconds(5)));
    CHECK(!f.store->Check({key}).value());
  }
  // A store that is gone: posting and flushing return (false: not written) without hanging.
  pi::BlameBoard orphan(nullptr, uid, 2, absl::Seconds(1));
  orphan.PostWaiting({0}, absl::StatusCode::kDeadlineExceeded, "waiting");
  CHECK(orphan.Flush(absl::Now()));
}

TEST_CASE("a schedule lowers to one rank's plan: chunks, data dependencies, the input",
          "[collectives][unit]") {
  // Ring allreduce over 3 positions, identity order, rank 0; 12 elements of 4 bytes, pieces of
  // 4 elements cut into chunks of 2: every transfer is two messages.
  pi::Layout L;
  L.rank = 0;
  L.n = 3;
  L.order = {0, 1, 2};
  L.position = {0, 1, 2};
  L.channels = 2;
  L.chunk_bytes = 8;
  auto s = pi::ScheduleOf(pi::Shape::kRing, 3);
  REQUIRE(s.ok());
  std::vector<float> buf(12), input(12);
  auto* b = reinterpret_cast<uint8_t*>(buf.data());
  auto* in = reinterpret_cast<const uint8_t*>(input.data());
  const std::vector<pi::Block> pieces = pi::EvenBlocks(12, 3);
  pi::Plan plan;
  pi::BuildFromSchedule(**s, L, b, pieces, 1, in, &plan);
  // 4 steps, one send to rank 1 and one receive from rank 2 each, 2 chunks apiece.
  REQUIRE(plan.sends.size() == 8);
  REQUIRE(plan.recvs.size() == 8);
  for (const auto& op : plan.sends) CHECK(op.peer == 1);
  for (const auto& op : plan.recvs) CHECK(op.peer == 2);
  // Step 0 sends piece 0 straight from the input, waiting for nothing.
  CHECK(plan.sends[0].data == in);
  CHECK(plan.sends[0].dep == -1);
  CHECK(plan.sends[1].data == in + 8);
  CHECK(plan.sends[0].channel == 0);
  CHECK(plan.sends[1].channel == 1);
  // Step 0 receives piece 2 (from position 2), reducing it with the input, nothing to wait for.
  CHECK(plan.recvs[0].data == b + 32);
  CHECK(plan.recvs[0].reduce);
  CHECK(plan.recvs[0].local == in + 32);
  CHECK(plan.recvs[0].war_prefix == 0);
  // Step 1 forwards piece 2 chunk by chunk as each chunk is reduced, from buf.
  CHECK(plan.sends[2].data == b + 32);
  CHECK(plan.sends[2].dep == 0);
  CHECK(plan.sends[3].dep == 1);
  CHECK(!plan.sends[2].final);
  // Step 1 receives piece 1: the first write here, reduced with the input.
  CHECK(plan.recvs[2].data == b + 16);
  CHECK(plan.recvs[2].local == in + 16);
  // All-gather step 0 (step 2) sends the reduced piece 1, a final result.
  CHECK(plan.sends[4].data == b + 16);
  CHECK(plan.sends[4].dep == 2);
  CHECK(plan.sends[4].final);
  // ... and receives piece 0, which step 0 sent from the input: no write-after-read wait; a
  // placement, not a reduction.
  CHECK(plan.recvs[4].data == b);
  CHECK(!plan.recvs[4].reduce);
  CHECK(plan.recvs[4].war_prefix == 0);
  // Step 3 receives piece 2, which step 1 sent from buf: each chunk waits for its send.
  CHECK(plan.recvs[6].data == b + 32);
  CHECK(plan.recvs[6].war_prefix == 3);
  CHECK(plan.recvs[7].war_prefix == 4);

  // Without an input, the first send reads buf and the first receive reduces in place.
  pi::Plan in_place;
  pi::BuildFromSchedule(**s, L, b, pieces, 1, nullptr, &in_place);
  CHECK(in_place.sends[0].data == b);
  CHECK(in_place.recvs[0].local == nullptr);
  CHECK(in_place.recvs[4].war_prefix == 1);  // piece 0 left from buf at step 0
}

TEST_CASE("schedules that cannot run are refused with the transfer named", "[collectives][unit]") {
  namespace nm = plexus::netmodel;
  auto ring = nm::RingAllreduceSchedule(3, 1);
  REQUIRE(ring.ok());
  CHECK(pi::MakeRunnable(*ring, 3).ok());
  auto sizes_only = nm::BCubeSchedule(4, 1, 2);
  REQUIRE(sizes_only.ok());
  CHECK(absl::StrContains(pi::MakeRunnable(*sizes_only, 4).status().message(), "no pieces"));
  nm::Schedule bad = *ring;
  bad.transfers[2].first_piece = 7;
  CHECK(absl::StrContains(pi::MakeRunnable(bad, 3).status().message(), "transfer 2: pieces 7"));
  bad = *ring;
  bad.transfers[1].dst = 3;
  CHECK(absl::StrContains(pi::MakeRunnable(bad, 3).status().message(), "outside positions"));
  bad = *ring;
  bad.transfers[0].after = {4};
  CHECK(absl::StrContains(pi::MakeRunnable(bad, 3).status().message(), "waits for 4"));
}
