// Fused casts (CallOptions::wire_dtype): f32 collectives that travel as bf16 or f16. The kernels
// (AVX2 against scalar, rounding), the documented error bound against an f64 reference, identical
// bits on every rank, exactness, NaN/Inf, odd sizes, argument checks, and the bytes the shm
// transport moved (its own per-connection counters) halved.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "communicator_impl.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/kernels/reduce.hpp"
#include "ranks.hpp"
#include "shm/stats.hpp"
#include "wire.hpp"

namespace pc = plexus::collectives;
namespace pi = plexus::collectives::internal;
namespace pt = plexus::transport;
using pc::Algorithm;
using pc::DataType;
using pc::ReduceOp;
using pc::testing::RunRanks;

namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
// The value an f32 becomes after a trip through the wire type (scalar reference).
float Round(DataType wire, float f) {
  return wire == DataType::kBF16 ? plexus::kernels::Bf16ToFloat(plexus::kernels::FloatToBf16(f))
                                 : plexus::kernels::HalfToFloat(plexus::kernels::FloatToHalf(f));
}
// Unit roundoff of the wire type (round to nearest: half an ulp of 1).
double UnitRoundoff(DataType wire) {
  return wire == DataType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}
// The bound documented at CallOptions::wire_dtype, per element: ((1+u)^n (1+2^-24)^(n-1) - 1)
// times the sum of the magnitudes; f16 adds n * 2^-25 for roundings below its normal range.
double SumBound(DataType wire, int n, double abs_sum) {
  const double u = UnitRoundoff(wire);
  const double g = std::pow(1 + u, n) * std::pow(1 + std::ldexp(1.0, -24), n - 1) - 1;
  return g * abs_sum + (wire == DataType::kF16 ? n * std::ldexp(1.0, -25) : 0.0);
}

// Special and ordinary values, including ties of both wire types and their overflow edges.
std::vector<float> SpecialValues() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1.0f + std::ldexp(1.0f, -8),  // bf16 tie, to even (down)
                          1.0f + 3 * std::ldexp(1.0f, -8),
                          1.0f + std::ldexp(1.0f, -11),  // f16 tie
                          65504.0f,
                          65519.0f,  // f16: rounds down to 65504
                          65520.0f,  // f16: rounds to infinity
                          1e30f,
                          -3.4e38f,
                          std::ldexp(1.0f, -20),  // f16 subnormal
                          std::ldexp(1.0f, -140),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          FromBits(0x7F800001),  // signalling NaN
                          FromBits(0xFFC12345),
                          3.14159265f,
                          -2.7182818f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1000.0f, 1000.0f);
  for (int i = 0; i < 200; ++i) v.push_back(d(rng));
  return v;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------------------------
// Kernels

TEST_CASE("wire cast kernels: AVX2 and scalar agree bit for bit and round to nearest even",
          "[collectives][cast]") {
  const std::vector<float> values = SpecialValues();
  for (DataType wire : {DataType::kBF16, DataType::kF16}) {
    INFO("wire " << pc::DataTypeName(wire));
    // Scalar reference: one element at a time through the existing conversions.
    for (float f : values) {
      uint16_t out = 0;
      plexus::kernels::PackWire(wire, &out, &f, 1, nullptr);
      const uint16_t expect = wire == DataType::kBF16 ? plexus::kernels::FloatToBf16(f)
                                                      : plexus::kernels::FloatToHalf(f);
      CHECK(out == expect);
    }
    CHECK(Round(wire, 1.0f + std::ldexp(1.0f, wire == DataType::kBF16 ? -8 : -11)) == 1.0f);
    if (wire == DataType::kF16) {
      CHECK(Round(wire, 65519.0f) == 65504.0f);
      CHECK(std::isinf(Round(wire, 65520.0f)));
    }
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, values.size()}) {
      for (size_t misalign : {size_t{0}, size_t{1}, size_t{3}}) {
        INFO("n " << n << ", misaligned by " << misalign << " bytes");
        // Unaligned storage: byte buffers offset by `misalign`.
        std::vector<uint8_t> in_bytes(4 * n + 8), local_bytes(4 * n + 8);
        std::memcpy(in_bytes.data() + misalign, values.data(), 4 * n);
        for (size_t i = 0; i < n; ++i) {
          const float l = values[(i * 7 + 3) % values.size()];
          std::memcpy(local_bytes.data() + misalign + 4 * i, &l, 4);
        }
        auto* in = reinterpret_cast<float*>(in_bytes.data() + misalign);
        auto* local = reinterpret_cast<float*>(local_bytes.data() + misalign);
        std::vector<uint8_t> wire_v(2 * n + 8), wire_s(2 * n + 8);
        std::vector<uint8_t> keep_v(4 * n + 8), keep_s(4 * n + 8);
        auto* kv = reinterpret_cast<float*>(keep_v.data() + misalign);
        auto* ks = reinterpret_cast<float*>(keep_s.data() + misalign);
        plexus::kernels::PackWire(wire, wire_v.data() + misalign, in, n, kv);
        const bool was = plexus::kernels::SetAvx2Allowed(false);
        plexus::kernels::PackWire(wire, wire_s.data() + misalign, in, n, ks);
        plexus::kernels::SetAvx2Allowed(was);
        CHECK(std::memcmp(wire_v.data(), wire_s.data(), wire_v.size()) == 0);
        CHECK(std::memcmp(keep_v.data(), keep_s.data(), keep_v.size()) == 0);
        for (size_t i = 0; i < n; ++i) {
          const float f = values[i];
          const float k = ks[i];
          if (std::isnan(f)) {
            CHECK(std::isnan(k));
          } else {
            CHECK(Bits(k) == Bits(Round(wire, f)));
          }
        }
        // Unpack.
        std::vector<uint8_t> un_v(4 * n + 8), un_s(4 * n + 8);
        plexus::kernels::UnpackWire(wire, reinterpret_cast<float*>(un_v.data() + misalign),
                                    wire_v.data() + misalign, n);
        plexus::kernels::SetAvx2Allowed(false);
        plexus::kernels::UnpackWire(wire, reinterpret_cast<float*>(un_s.data() + misalign),
                                    wire_v.data() + misalign, n);
        plexus::kernels::SetAvx2Allowed(was);
        CHECK(std::memcmp(un_v.data(), un_s.data(), un_v.size()) == 0);
        CHECK(std::memcmp(un_v.data() + misalign, ks, 4 * n) == 0);
        // Reduce, every op, both operand orders, out of place and in place.
        for (int o = 0; o < pc::kNumReduceOps; ++o) {
          const auto op = static_cast<ReduceOp>(o);
          for (bool src_first : {false, true}) {
            INFO("op " << pc::ReduceOpName(op) << ", src_first " << src_first);
            std::vector<uint8_t> rv(4 * n + 8), rs(4 * n + 8);
            plexus::kernels::ReduceWire(wire, op, reinterpret_cast<float*>(rv.data() + misalign),
                                        local, wire_v.data() + misalign, n, src_first);
            plexus::kernels::SetAvx2Allowed(false);
            plexus::kernels::ReduceWire(wire, op, reinterpret_cast<float*>(rs.data() + misalign),
                                        local, wire_v.data() + misalign, n, src_first);
            plexus::kernels::SetAvx2Allowed(was);
            CHECK(std::memcmp(rv.data(), rs.data(), rv.size()) == 0);
            // In place (local == dst) gives the same bits.
            std::vector<uint8_t> ip(local_bytes);
            plexus::kernels::ReduceWire(wire, op, reinterpret_cast<float*>(ip.data() + misalign),
                                        reinterpret_cast<float*>(ip.data() + misalign),
                                        wire_v.data() + misalign, n, src_first);
            CHECK(std::memcmp(ip.data() + misalign, rv.data() + misalign, 4 * n) == 0);
            if (op == ReduceOp::kSum) {
              for (size_t i = 0; i < n; ++i) {
                const float expect = local[i] + ks[i];
                const float got = reinterpret_cast<float*>(rv.data() + misalign)[i];
                if (std::isnan(expect)) {
                  CHECK(Bits(got) == 0x7FC00000u);  // canonical quiet NaN
                } else {
                  CHECK(Bits(got) == Bits(expect));
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("call header carries the wire type; uncast headers encode as before",
          "[collectives][cast]") {
  pi::CallHeader h;
  h.count = 12345;
  uint8_t plain[pi::CallHeader::kEncodedSize], cast[pi::CallHeader::kEncodedSize];
  h.Encode(plain);
  CHECK(plain[9] == 0);  // the byte version 1 left zero
  h.wire = DataType::kBF16;
  h.Encode(cast);
  auto d = pi::CallHeader::Decode(absl::MakeConstSpan(cast, sizeof cast));
  REQUIRE(d.ok());
  REQUIRE(d->wire.has_value());
  CHECK(*d->wire == DataType::kBF16);
  CHECK(d->SameCall(h));
  CHECK(d->Describe().find("bf16 on the wire") != std::string::npos);
  auto p = pi::CallHeader::Decode(absl::MakeConstSpan(plain, sizeof plain));
  REQUIRE(p.ok());
  CHECK_FALSE(p->wire.has_value());
  CHECK_FALSE(p->SameCall(h));
  cast[9] = pc::kNumDataTypes + 1;  // out of range
  CHECK_FALSE(pi::CallHeader::Decode(absl::MakeConstSpan(cast, sizeof cast)).ok());
}

// ---------------------------------------------------------------------------------------------
// Collectives over ranks as threads

pc::CommunicatorOptions Options(pt::Backend backend, size_t chunk_bytes) {
  pc::CommunicatorOptions o;
  o.device.backend = backend;
  o.transport_policy = pc::TransportPolicy::kUniform;  // the backend named, for every pair
  o.timeout = absl::Seconds(20);
  o.chunk_bytes = chunk_bytes;
  return o;
}

// Rank r's operand: reproducible per (seed, rank, element).
std::vector<float> Operand(int seed, int rank, size_t count, float scale) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 1000 + rank));
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

std::string Fail(const std::string& what, size_t i, float got, double want) {
  return absl::StrCat(what, " at element ", i, ": got ", got, " (0x",
                      absl::Hex(Bits(got), absl::kZeroPad8), "), want ", want);
}

TEST_CASE("fused-cast allreduce: error bound, identical bits on every rank, odd sizes",
          "[collectives][cast]") {
  struct Case {
    int n;
    Algorithm algo;
    size_t chunk;
  };
  // Ring (the bandwidth path), double binary tree and halving-doubling (with a fold at n = 3, 5).
  const Case cases[] = {{2, Algorithm::kRing, 4096},
                        {3, Algorithm::kRing, 4096},
                        {4, Algorithm::kRing, 1024},
                        {5, Algorithm::kRing, 65536},
                        {3, Algorithm::kTree, 2048},
                        {4, Algorithm::kTree, 65536},
                        {3, Algorithm::kHalvingDoubling, 4096},
                        {4, Algorithm::kHalvingDoubling, 4096},
                        {5, Algorithm::kHalvingDoubling, 4096}};
  // Small counts take the uncast latency path; the others travel cast.
  const size_t counts[] = {1, 7, 1000, 4097, 10007, 40000};
  for (const Case& c : cases) {
    for (DataType wire : {DataType::kBF16, DataType::kF16}) {
      for (bool in_place : {false, true}) {
        INFO(c.n << " ranks, " << pc::AlgorithmName(c.algo) << ", chunk " << c.chunk << ", "
                 << pc::DataTypeName(wire) << (in_place ? ", in place" : ", out of place"));
        std::vector<std::vector<float>> results(c.n);
        auto errors = RunRanks(
            c.n, Options(pt::Backend::kInproc, c.chunk),
            [&](int rank, pc::Communicator& comm) -> std::string {
              pc::CallOptions call;
              call.algorithm = c.algo;
              call.wire_dtype = wire;
              for (size_t count : counts) {
                std::vector<float> in = Operand(static_cast<int>(count), rank, count, 4.0f);
                std::vector<float> out(count);
                float* dst = in_place ? in.data() : out.data();
                if (absl::Status s =
                        comm.AllReduce(in.data(), dst, count, DataType::kF32, ReduceOp::kSum, call);
                    !s.ok()) {
                  return absl::StrCat("count ", count, ": ", s.ToString());
                }
                if (count == 40000) results[rank].assign(dst, dst + count);
                // Against the f64 reference and the documented bound.
                const bool cast = count * 4 > 16384;
                std::vector<std::vector<float>> all(c.n);
                for (int r = 0; r < c.n; ++r)
                  all[r] = Operand(static_cast<int>(count), r, count, 4.0f);
                for (size_t i = 0; i < count; ++i) {
                  double exact = 0, abs_sum = 0;
                  for (int r = 0; r < c.n; ++r) {
                    exact += all[r][i];
                    abs_sum += std::fabs(all[r][i]);
                  }
                  const double bound =
                      cast ? SumBound(wire, c.n, abs_sum) : (c.n - 1) * std::ldexp(abs_sum, -24);
                  if (std::fabs(dst[i] - exact) > bound) {
                    return Fail(absl::StrCat("count ", count, ": outside the bound ", bound), i,
                                dst[i], exact);
                  }
                  // The final value is what the owner rounded: representable in the wire type.
                  if (cast && Round(wire, dst[i]) != dst[i]) {
                    return Fail(absl::StrCat("count ", count, ": not a wire value"), i, dst[i],
                                exact);
                  }
                }
                if (count == 40000) break;
              }
              return "";
            });
        for (int r = 0; r < c.n; ++r) {
          INFO("rank " << r);
          CHECK(errors[r] == "");
        }
        for (int r = 1; r < c.n; ++r) {
          INFO("rank " << r << " against rank 0");
          REQUIRE(results[r].size() == results[0].size());
          CHECK(SameBits(results[r].data(), results[0].data(), results[0].size()));
        }
      }
    }
  }
}

// This case checks exact values: integers that the wire type holds (partial sums included),
// min/max (monotone rounding: the result is wire(max)), NaN and infinities, avg.
TEST_CASE("fused-cast allreduce: exact on wire-representable values, min/max, NaN and Inf",
          "[collectives][cast]") {
  constexpr size_t kCount = 6001;  // cast (> 16 KiB), odd
  for (int n : {2, 3, 4}) {
    for (DataType wire : {DataType::kBF16, DataType::kF16}) {
      INFO(n << " ranks, " << pc::DataTypeName(wire));
      auto value = [](int rank, size_t i) {
        // Integers in [-8, 8]: every partial sum of 4 ranks (|.| <= 32) is exact in bf16 and f16.
        return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 17) - 8);
      };
      auto errors = RunRanks(
          n, Options(pt::Backend::kInproc, 4096),
          [&](int rank, pc::Communicator& comm) -> std::string {
            pc::CallOptions call;
            call.algorithm = Algorithm::kRing;
            call.wire_dtype = wire;
            std::vector<float> v(kCount), out(kCount);
            for (size_t i = 0; i < kCount; ++i) v[i] = value(rank, i);
            // Specials at fixed places.
            const float inf = std::numeric_limits<float>::infinity();
            if (rank == 0) {
              v[10] = std::numeric_limits<float>::quiet_NaN();
              v[11] = inf;
              v[12] = inf;
              v[13] = -inf;
            }
            if (rank == n - 1) v[12] = -inf;  // inf + -inf = NaN
            if (absl::Status s = comm.AllReduce(v.data(), out.data(), kCount, DataType::kF32,
                                                ReduceOp::kSum, call);
                !s.ok()) {
              return s.ToString();
            }
            for (size_t i = 0; i < kCount; ++i) {
              if (i >= 10 && i <= 13) continue;
              double exact = 0;
              for (int r = 0; r < n; ++r) exact += value(r, i);
              if (out[i] != exact) return Fail("integer sum not exact", i, out[i], exact);
            }
            if (Bits(out[10]) != 0x7FC00000u) return Fail("NaN lost", 10, out[10], NAN);
            if (out[11] != inf) return Fail("infinity lost", 11, out[11], inf);
            if (Bits(out[12]) != 0x7FC00000u) return Fail("inf + -inf", 12, out[12], NAN);
            if (out[13] != -inf) return Fail("-infinity lost", 13, out[13], -inf);
            // Min and max: exactly the rounded extreme. Avg: the cast sum divided by n.
            std::vector<float> x = Operand(99, rank, kCount, 1000.0f);
            for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
              if (absl::Status s =
                      comm.AllReduce(x.data(), out.data(), kCount, DataType::kF32, op, call);
                  !s.ok()) {
                return s.ToString();
              }
              std::vector<std::vector<float>> all(n);
              for (int r = 0; r < n; ++r) all[r] = Operand(99, r, kCount, 1000.0f);
              for (size_t i = 0; i < kCount; ++i) {
                float ext = x[i];
                for (int r = 0; r < n; ++r) {
                  const float y = all[r][i];
                  ext = op == ReduceOp::kMin ? std::min(ext, y) : std::max(ext, y);
                }
                if (Bits(out[i]) != Bits(Round(wire, ext))) {
                  return Fail(std::string(pc::ReduceOpName(op)), i, out[i], Round(wire, ext));
                }
              }
            }
            std::vector<float> sum(kCount), avg(kCount);
            if (absl::Status s = comm.AllReduce(x.data(), sum.data(), kCount, DataType::kF32,
                                                ReduceOp::kSum, call);
                !s.ok()) {
              return s.ToString();
            }
            if (absl::Status s = comm.AllReduce(x.data(), avg.data(), kCount, DataType::kF32,
                                                ReduceOp::kAvg, call);
                !s.ok()) {
              return s.ToString();
            }
            for (size_t i = 0; i < kCount; ++i) {
              const float want = sum[i] / static_cast<float>(n);
              if (Bits(avg[i]) != Bits(want)) return Fail("avg", i, avg[i], want);
            }
            // f16: beyond its range a partial sum becomes infinite.
            if (wire == DataType::kF16) {
              std::vector<float> big(kCount, 40000.0f);
              if (absl::Status s = comm.AllReduce(big.data(), out.data(), kCount, DataType::kF32,
                                                  ReduceOp::kSum, call);
                  !s.ok()) {
                return s.ToString();
              }
              if (!std::isinf(out[0])) return Fail("f16 overflow", 0, out[0], INFINITY);
            }
            return "";
          });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(errors[r] == "");
      }
    }
  }
}

TEST_CASE("fused-cast broadcast and allgather: every rank gets exactly the rounded source",
          "[collectives][cast]") {
  const std::vector<float> specials = SpecialValues();
  for (int n : {2, 3, 4, 5}) {
    for (DataType wire : {DataType::kBF16, DataType::kF16}) {
      for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
        INFO(n << " ranks, " << pc::DataTypeName(wire) << ", " << pc::AlgorithmName(algo));
        auto source = [&](int rank, size_t count) {
          std::vector<float> v = Operand(static_cast<int>(count) + 5, rank, count, 100.0f);
          for (size_t i = 0; i < count && i < specials.size(); ++i) {
            v[(i * 37) % count] = specials[i];
          }
          return v;
        };
        auto expect = [&](float f) {
          const float r = Round(wire, f);
          return std::isnan(f) ? NAN : r;
        };
        auto same = [&](float got, float f) {
          return std::isnan(f) ? std::isnan(got) : Bits(got) == Bits(Round(wire, f));
        };
        auto errors = RunRanks(
            n, Options(pt::Backend::kInproc, 2048),
            [&](int rank, pc::Communicator& comm) -> std::string {
              pc::CallOptions call;
              call.algorithm = algo;
              call.wire_dtype = wire;
              // 3 and 1001 elements: uncast (exact copies); 5003 and 20011: cast.
              for (size_t count : {size_t{3}, size_t{1001}, size_t{5003}, size_t{20011}}) {
                const bool bcast_cast = count * 4 > 16384;
                const int root = static_cast<int>(count % n);
                std::vector<float> src = source(root, count);
                std::vector<float> buf(count, -1.0f);
                // The root broadcasts in place half the time.
                const bool in_place = rank == root && count % 2 == 1;
                if (in_place) buf = src;
                if (absl::Status s = comm.Broadcast(in_place ? buf.data() : src.data(), buf.data(),
                                                    count, DataType::kF32, root, call);
                    !s.ok()) {
                  return absl::StrCat("broadcast ", count, ": ", s.ToString());
                }
                for (size_t i = 0; i < count; ++i) {
                  const bool ok = bcast_cast ? same(buf[i], src[i])
                                             : (std::isnan(src[i]) ? std::isnan(buf[i])
                                                                   : Bits(buf[i]) == Bits(src[i]));
                  if (!ok)
                    return Fail(absl::StrCat("broadcast ", count), i, buf[i], expect(src[i]));
                }
                // AllGather: out of place, and in place for odd counts.
                std::vector<float> mine = source(rank, count);
                std::vector<float> all(count * n, -1.0f);
                const bool ag_in_place = count % 2 == 1;
                if (ag_in_place) std::copy(mine.begin(), mine.end(), all.begin() + rank * count);
                const float* send = ag_in_place ? all.data() + rank * count : mine.data();
                if (absl::Status s = comm.AllGather(send, all.data(), count, DataType::kF32, call);
                    !s.ok()) {
                  return absl::StrCat("allgather ", count, ": ", s.ToString());
                }
                // Uncast: at most 16 KiB in all, or the mailbox path (halving-doubling, <= 8 KiB).
                const size_t total = count * n * 4;
                const bool mailbox = comm.SelectAlgorithm(pc::CollectiveKind::kAllGather, total,
                                                          algo) == Algorithm::kHalvingDoubling &&
                                     count * 4 <= 8192;
                const bool ag_cast = total > 16384 && !mailbox;
                for (int r = 0; r < n; ++r) {
                  const std::vector<float> theirs = source(r, count);
                  for (size_t i = 0; i < count; ++i) {
                    const float got = all[r * count + i];
                    const bool ok = ag_cast
                                        ? same(got, theirs[i])
                                        : (std::isnan(theirs[i]) ? std::isnan(got)
                                                                 : Bits(got) == Bits(theirs[i]));
                    if (!ok) {
                      return Fail(absl::StrCat("allgather ", count, " block of rank ", r), i, got,
                                  expect(theirs[i]));
                    }
                  }
                }
              }
              return "";
            });
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          CHECK(errors[r] == "");
        }
      }
    }
  }
}

TEST_CASE("broadcast and allgather into half-width destinations (recv_dtype)",
          "[collectives][cast]") {
  for (int n : {2, 3, 4}) {
    for (DataType out : {DataType::kBF16, DataType::kF16}) {
      INFO(n << " ranks, recv " << pc::DataTypeName(out));
      auto errors = RunRanks(
          n, Options(pt::Backend::kInproc, 2048),
          [&](int rank, pc::Communicator& comm) -> std::string {
            pc::CallOptions call;
            call.recv_dtype = out;
            auto bits = [&](float f) {
              return out == DataType::kBF16 ? plexus::kernels::FloatToBf16(f)
                                            : plexus::kernels::FloatToHalf(f);
            };
            for (size_t count : {size_t{1}, size_t{1001}, size_t{20011}}) {
              const int root = static_cast<int>(count % n);
              const std::vector<float> src = Operand(static_cast<int>(count), root, count, 100.0f);
              std::vector<uint16_t> dst(count, 0xFFFF);
              if (absl::Status s =
                      comm.Broadcast(src.data(), dst.data(), count, DataType::kF32, root, call);
                  !s.ok()) {
                return absl::StrCat("broadcast ", count, ": ", s.ToString());
              }
              for (size_t i = 0; i < count; ++i) {
                if (dst[i] != bits(src[i])) {
                  return absl::StrCat("broadcast ", count, " element ", i, ": ", dst[i], " vs ",
                                      bits(src[i]));
                }
              }
              const std::vector<float> mine = Operand(static_cast<int>(count), rank, count, 100.0f);
              std::vector<uint16_t> all(count * n, 0xFFFF);
              if (absl::Status s =
                      comm.AllGather(mine.data(), all.data(), count, DataType::kF32, call);
                  !s.ok()) {
                return absl::StrCat("allgather ", count, ": ", s.ToString());
              }
              for (int r = 0; r < n; ++r) {
                const std::vector<float> theirs =
                    Operand(static_cast<int>(count), r, count, 100.0f);
                for (size_t i = 0; i < count; ++i) {
                  if (all[r * count + i] != bits(theirs[i])) {
                    return absl::StrCat("allgather ", count, " block ", r, " element ", i);
                  }
                }
              }
            }
            // Errors: another collective, overlapping buffers, a different wire type.
            std::vector<float> f(64, 1.0f);
            absl::Status s =
                comm.AllReduce(f.data(), f.data(), 64, DataType::kF32, ReduceOp::kSum, call);
            if (s.code() != absl::StatusCode::kInvalidArgument) return "allreduce: " + s.ToString();
            s = comm.AllGather(f.data(), f.data(), 8, DataType::kF32, call);
            if (s.code() != absl::StatusCode::kInvalidArgument ||
                std::string(s.message()).find("must not overlap") == std::string::npos) {
              return "overlap: " + s.ToString();
            }
            pc::CallOptions other = call;
            other.wire_dtype = out == DataType::kBF16 ? DataType::kF16 : DataType::kBF16;
            std::vector<uint16_t> h(64 * n);
            s = comm.AllGather(f.data(), h.data(), 64, DataType::kF32, other);
            if (s.code() != absl::StatusCode::kInvalidArgument) return "wire: " + s.ToString();
            return "";
          });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(errors[r] == "");
      }
    }
  }
}

TEST_CASE("fused casts: argument checks and mismatched wire types", "[collectives][cast]") {
  auto errors = RunRanks(
      2, Options(pt::Backend::kInproc, 4096), [&](int rank, pc::Communicator& comm) -> std::string {
        std::vector<float> a(8192, 1.0f), b(16384, 0.0f);
        std::vector<double> d(8192, 1.0);
        pc::CallOptions bf16;
        bf16.wire_dtype = DataType::kBF16;
        auto expect_invalid = [&](absl::Status s, const std::string& fragment) -> std::string {
          if (s.code() != absl::StatusCode::kInvalidArgument ||
              std::string(s.message()).find(fragment) == std::string::npos) {
            return absl::StrCat("expected InvalidArgument with '", fragment, "', got ",
                                s.ToString());
          }
          return "";
        };
        std::string e = expect_invalid(
            comm.ReduceScatter(b.data(), a.data(), 8192, DataType::kF32, ReduceOp::kSum, bf16),
            "only AllReduce, Broadcast and AllGather");
        if (e.empty()) {
          e = expect_invalid(
              comm.AllReduce(d.data(), d.data(), 8192, DataType::kF64, ReduceOp::kSum, bf16),
              "from f32 data to bf16 or f16");
        }
        if (e.empty()) {
          pc::CallOptions i32;
          i32.wire_dtype = DataType::kI32;
          e = expect_invalid(
              comm.AllReduce(a.data(), a.data(), 8192, DataType::kF32, ReduceOp::kSum, i32),
              "from f32 data to bf16 or f16");
        }
        if (!e.empty()) return e;
        // Same type on the wire as the data: no cast, fine.
        pc::CallOptions same;
        same.wire_dtype = DataType::kF32;
        if (absl::Status s =
                comm.AllReduce(a.data(), a.data(), 8192, DataType::kF32, ReduceOp::kSum, same);
            !s.ok() || a[0] != 2.0f) {
          return absl::StrCat("wire = data: ", s.ToString(), " ", a[0]);
        }
        // Rank 0 casts, rank 1 does not: the header check reports it, naming the wire type.
        pc::CallOptions call;
        call.algorithm = Algorithm::kRing;
        if (rank == 0) call.wire_dtype = DataType::kBF16;
        absl::Status s =
            comm.AllReduce(a.data(), a.data(), 8192, DataType::kF32, ReduceOp::kSum, call);
        if (s.code() != absl::StatusCode::kFailedPrecondition ||
            std::string(s.message()).find("bf16 on the wire") == std::string::npos) {
          return absl::StrCat("mismatch: ", s.ToString());
        }
        return "";
      });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

// tcp on 127.0.0.1 with two channels (chunks striped over both, sized for the wire) and the
// default chunk size: the same bound, the same bits on every rank.
TEST_CASE("fused-cast allreduce over tcp with two channels", "[collectives][cast]") {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 300007;
  pc::CommunicatorOptions o = Options(pt::Backend::kTcp, 0);
  o.device.local_address = "127.0.0.1";
  o.channels = 2;
  std::vector<std::vector<float>> all(kRanks), results(kRanks);
  for (int r = 0; r < kRanks; ++r) all[r] = Operand(3, r, kCount, 50.0f);
  auto errors = RunRanks(kRanks, o, [&](int rank, pc::Communicator& comm) -> std::string {
    pc::CallOptions call;
    call.algorithm = Algorithm::kRing;
    call.wire_dtype = DataType::kBF16;
    results[rank].assign(kCount, 0.0f);
    if (absl::Status s = comm.AllReduce(all[rank].data(), results[rank].data(), kCount,
                                        DataType::kF32, ReduceOp::kSum, call);
        !s.ok()) {
      return s.ToString();
    }
    for (size_t i = 0; i < kCount; ++i) {
      double exact = 0, abs_sum = 0;
      for (int r = 0; r < kRanks; ++r) {
        exact += all[r][i];
        abs_sum += std::fabs(all[r][i]);
      }
      const double bound = SumBound(DataType::kBF16, kRanks, abs_sum);
      if (std::fabs(results[rank][i] - exact) > bound) {
        return Fail(absl::StrCat("outside the bound ", bound), i, results[rank][i], exact);
      }
    }
    return "";
  });
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
    CHECK(SameBits(results[r].data(), results[0].data(), kCount));
  }
}

// The bytes the shm transport moved for one allreduce (its per-connection counters: payload
// streamed through the rings plus bytes pulled by cross-memory attach), cast against uncast.
TEST_CASE("fused-cast allreduce halves the bytes on the wire (shm counters)",
          "[collectives][cast]") {
  constexpr size_t kCount = size_t{1} << 18;  // 1 MiB of f32
  for (int n : {2, 3}) {
    INFO(n << " ranks");
    std::vector<uint64_t> sent_f32(n), sent_bf16(n), links(n);
    auto errors = RunRanks(
        n, Options(pt::Backend::kShm, size_t{1} << 20),
        [&](int rank, pc::Communicator& comm) -> std::string {
          auto* impl = dynamic_cast<pi::CommunicatorImpl*>(&comm);
          if (impl == nullptr) return "not a CommunicatorImpl";
          auto sent = [&]() -> uint64_t {
            uint64_t total = 0;
            for (const pt::Connection* c : impl->connections()) {
              auto st = pt::internal::shm::GetConnectionStats(*c);
              if (!st.ok()) return 0;
              total += st->ring_bytes_sent + st->cma_bytes_sent;
            }
            return total;
          };
          std::vector<float> v(kCount, 1.0f);
          pc::CallOptions call;
          call.algorithm = Algorithm::kRing;
          for (int pass = 0; pass < 2; ++pass) {
            call.wire_dtype = pass == 0 ? std::nullopt : std::optional<DataType>(DataType::kBF16);
            const uint64_t before = sent();
            if (absl::Status s = comm.AllReduce(v.data(), v.data(), kCount, DataType::kF32,
                                                ReduceOp::kSum, call);
                !s.ok()) {
              return s.ToString();
            }
            (pass == 0 ? sent_f32 : sent_bf16)[rank] = sent() - before;
          }
          links[rank] = impl->options().channels;
          return "";
        });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[r] == "");
      // Ring, identity order: the reduce-scatter sends every segment but (r + 1) mod n, the
      // all-gather every segment but (r + 2) mod n; plus one 64-byte call header per channel.
      const std::vector<pi::Block> seg = pi::EvenBlocks(kCount, n);
      const size_t elems = 2 * kCount - seg[(r + 1) % n].count - seg[(r + 2) % n].count;
      const uint64_t headers = 64 * links[r];
      CHECK(sent_f32[r] == 4 * elems + headers);
      CHECK(sent_bf16[r] == 2 * elems + headers);
    }
  }
}

}  // namespace
