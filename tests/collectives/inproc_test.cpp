// Communicators of 1 to 8 ranks as threads of this process (inproc backend, one Rendezvous per
// rank over a shared TCP store): the full correctness matrix, determinism, Split, ring orders,
// asynchronous issue order and mismatched calls. (A dying rank needs processes:
// process_test.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/selector.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/transport/store.hpp"
#include "ranks.hpp"
#include "suite.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
using pc::Algorithm;
using pc::DataType;
using pc::ReduceOp;
using pc::testing::RunRanks;

namespace {

pc::CommunicatorOptions InprocOptions() {
  pc::CommunicatorOptions o;
  o.device.backend = pt::Backend::kInproc;
  o.timeout = absl::Seconds(20);
  o.chunk_bytes = 256;  // many chunks per call: exercises the pipeline
  return o;
}

// InprocOptions over loopback tcp between every pair (no per-host shm).
pc::CommunicatorOptions TcpOptions() {
  pc::CommunicatorOptions o = InprocOptions();
  o.device.backend = pt::Backend::kTcp;
  o.device.local_address = "127.0.0.1";
  o.transport_policy = pc::TransportPolicy::kUniform;
  return o;
}

void RequireAllOk(const std::vector<std::string>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
}

// Forwards to another store and tracks the blame records (keys under plexus/coll/blame/):
// how many writes, and which keys are left.
class BlameCountingStore : public pt::Store {
 public:
  explicit BlameCountingStore(std::shared_ptr<pt::Store> inner) : inner_(std::move(inner)) {}
  absl::Status Set(std::string_view key, std::string_view value) override {
    Track(key, true);
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    return inner_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    return inner_->Check(keys);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override {
    Track(key, false);
    return inner_->Delete(key);
  }
  std::string description() const override { return inner_->description(); }

  int writes() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  std::set<std::string> left() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }

 private:
  void Track(std::string_view key, bool set) {
    if (key.rfind("plexus/coll/blame/", 0) != 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    ++writes_;
    if (set) {
      live_.insert(std::string(key));
    } else {
      live_.erase(std::string(key));
    }
  }
  std::shared_ptr<pt::Store> inner_;
  std::mutex mu_;
  int writes_ = 0;
  std::set<std::string> live_;
};

}  // namespace

// Wait records (docs/collectives.md, "Contract", blame) cost the healthy path nothing, are
// posted by a call that waits half the timeout, and are gone once it completed and the
// communicator is destroyed.
TEST_CASE("blame records: no store traffic on the healthy path, no key left after a slow call",
          "[collectives][inproc]") {
  // 8 B: the mailbox path; 64 KiB: a plan. A store of their own each (rendezvous keys).
  for (size_t count : {size_t{2}, size_t{16384}}) {
    auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
    REQUIRE(server.ok());
    auto inner =
        pt::TcpStore::Connect("127.0.0.1:" + std::to_string((*server)->port()), absl::Seconds(10));
    REQUIRE(inner.ok());
    auto store = std::make_shared<BlameCountingStore>(*std::move(inner));
    pc::CommunicatorOptions options;
    options.device.backend = pt::Backend::kInproc;
    options.timeout = absl::Seconds(2);
    std::vector<std::string> results(2);
    int fast_writes = -1;
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto rdv = pt::Rendezvous::Create(r, 2, store);
        if (!rdv.ok()) {
          results[r] = "rendezvous: " + std::string(rdv.status().message());
          return;
        }
        auto comm = pc::Communicator::Create(*rdv, options);
        if (!comm.ok()) {
          results[r] = "create: " + std::string(comm.status().message());
          return;
        }
        std::vector<float> v(count, 1.0f);
        for (int i = 0; i < 50; ++i) {
          absl::Status s =
              (*comm)->AllReduce(v.data(), v.data(), count, DataType::kF32, ReduceOp::kSum);
          if (!s.ok()) {
            results[r] = std::string(s.message());
            return;
          }
        }
        if (absl::Status s = (*comm)->Barrier(); !s.ok()) {
          results[r] = std::string(s.message());
          return;
        }
        if (r == 0) fast_writes = store->writes();
        // Rank 1 comes late (0.7x the timeout): rank 0 waits past half of it.
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1400));
        absl::Status s =
            (*comm)->AllReduce(v.data(), v.data(), count, DataType::kF32, ReduceOp::kSum);
        if (!s.ok()) results[r] = std::string(s.message());
      });
    }
    for (auto& t : threads) t.join();
    INFO(count << " elements");
    RequireAllOk(results);
    CHECK(fast_writes == 0);
    CHECK(store->writes() >= 2);  // rank 0's wait record, and its removal
    CHECK(store->left().empty());
  }
}

TEST_CASE("every collective, dtype, op and algorithm matches the reference, 1 to 8 ranks",
          "[collectives][inproc]") {
  for (int n = 1; n <= 8; ++n) {
    pc::CommunicatorOptions options = InprocOptions();
    options.channels = 1 + n % 2;
    // A non-identity ring order from 3 ranks up: the algorithms must honour any permutation.
    if (n >= 3) {
      for (int i = n - 1; i >= 0; --i) options.ring_order.push_back((i + 1) % n);
    }
    INFO("world size " << n);
    const bool full = n <= 5 || n == 8;
    auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) -> std::string {
      if (comm.ring_order() != options.ring_order && !options.ring_order.empty()) {
        return "ring_order() does not report the order in use";
      }
      pc::testing::Suite suite(comm, /*misalign=*/rank % 3);
      return suite.Run(full).error;
    });
    RequireAllOk(results);
  }
}

TEST_CASE("results are bit-identical across runs and ranks", "[collectives][inproc]") {
  const int n = 5;
  constexpr size_t kCount = 3001;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                      Algorithm::kRecursiveDoubling}) {
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      std::vector<std::vector<uint8_t>> outputs(2 * n);
      std::mutex mu;
      auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
        const size_t es = pc::DataTypeSize(dt);
        for (int run = 0; run < 2; ++run) {
          std::vector<uint8_t> buf(kCount * es);
          uint32_t x = 12345u + rank;  // non-integer values: the order of additions shows
          for (size_t i = 0; i < kCount; ++i) {
            x = x * 1664525u + 1013904223u;
            pc::testing::Set(dt, buf.data(), i, (x >> 8) * 1e-5 - 80.0);
          }
          absl::Status s = comm.AllReduce(buf.data(), buf.data(), kCount, dt, ReduceOp::kSum, {a});
          if (!s.ok()) return std::string(s.message());
          std::lock_guard<std::mutex> lock(mu);
          outputs[run * n + rank] = std::move(buf);
        }
        return std::string();
      });
      RequireAllOk(results);
      INFO(pc::AlgorithmName(a) << " " << pc::DataTypeName(dt));
      for (int i = 1; i < 2 * n; ++i) CHECK(outputs[i] == outputs[0]);
    }
  }
}

// Bruck's allgather against the ring's, bit for bit: odd counts and world sizes that are not
// powers of two, several types, a non-identity ring order, two channels, a fused cast; asked for
// per call, through the communicator's overrides and PLEXUS_COLL_ALGO-style text, and picked by
// the default table for small calls at those world sizes.
TEST_CASE("Bruck's allgather gives the ring's bits at any world size", "[collectives][inproc]") {
  struct Case {
    DataType dtype;
    size_t count;
    size_t chunk_bytes;
    std::optional<DataType> wire;
  };
  const Case cases[] = {
      {DataType::kU8, 1, 256, std::nullopt},
      {DataType::kI32, 7, 256, std::nullopt},
      {DataType::kF64, 7, 64, std::nullopt},
      {DataType::kBF16, 1001, 256, std::nullopt},
      {DataType::kF32, 4099, 1024, std::nullopt},
      {DataType::kU8, 1000003, 64 << 10, std::nullopt},
      {DataType::kBF16, 1000003, 256 << 10, std::nullopt},
      {DataType::kF32, 20011, 4096, DataType::kBF16},
  };
  for (int n : {3, 5, 6}) {
    pc::CommunicatorOptions options = InprocOptions();
    options.channels = 2;
    for (int i = n - 1; i >= 0; --i) options.ring_order.push_back((i + 2) % n);
    // One rank's communicator forces Bruck through its overrides, the others per call.
    for (const Case& c : cases) {
      options.chunk_bytes = c.chunk_bytes;
      INFO("world size " << n << ", " << pc::DataTypeName(c.dtype) << " x " << c.count
                         << (c.wire ? " on the wire as bf16" : ""));
      const size_t es = pc::DataTypeSize(c.dtype);
      auto results = pc::testing::RunRanksWith(
          n,
          [&](int rank) {
            pc::CommunicatorOptions o = options;
            if (rank == 1) o.algorithms = *pc::AlgorithmOverrides::Parse("allgather:bruck");
            return o;
          },
          [&](int rank, pc::Communicator& comm) -> std::string {
            std::vector<uint8_t> send(c.count * es);
            uint32_t x = 977u * static_cast<uint32_t>(rank) + 3u;
            for (size_t i = 0; i < c.count; ++i) {
              x = x * 1664525u + 1013904223u;
              pc::testing::Set(c.dtype, send.data(), i,
                               c.dtype == DataType::kU8 ? (x >> 24) : (x >> 8) * 1e-4 - 500.0);
            }
            pc::CallOptions ring{Algorithm::kRing};
            pc::CallOptions bruck{rank == 1 ? Algorithm::kAuto : Algorithm::kBruck};
            ring.wire_dtype = bruck.wire_dtype = c.wire;
            std::vector<uint8_t> by_ring(n * send.size()), by_bruck(n * send.size(), 0xEE);
            if (absl::Status s =
                    comm.AllGather(send.data(), by_ring.data(), c.count, c.dtype, ring);
                !s.ok()) {
              return "ring: " + std::string(s.message());
            }
            if (absl::Status s =
                    comm.AllGather(send.data(), by_bruck.data(), c.count, c.dtype, bruck);
                !s.ok()) {
              return "bruck: " + std::string(s.message());
            }
            if (by_bruck != by_ring) return "Bruck's output differs from the ring's";
            // In place (send is this rank's block of recv), asynchronously.
            std::vector<uint8_t> in_place(n * send.size(), 0);
            std::memcpy(in_place.data() + rank * send.size(), send.data(), send.size());
            auto work = comm.AllGatherAsync(in_place.data() + rank * send.size(), in_place.data(),
                                            c.count, c.dtype, bruck);
            if (absl::Status s = work->Wait(); !s.ok())
              return "in place: " + std::string(s.message());
            if (in_place != by_ring) return "Bruck in place differs from the ring";
            // Uncast, this rank's block is its input as it was.
            if (!c.wire &&
                std::memcmp(by_ring.data() + rank * send.size(), send.data(), send.size()) != 0) {
              return "the ring's output lost this rank's block";
            }
            if (comm.SelectAlgorithm(pc::CollectiveKind::kAllGather, n * send.size(),
                                     Algorithm::kBruck) != Algorithm::kBruck) {
              return "a forced Bruck is not selected";
            }
            if (comm.SelectAlgorithm(pc::CollectiveKind::kReduceScatter, 64, Algorithm::kBruck) !=
                Algorithm::kRing) {
              return "Bruck for a reduce-scatter does not fall back to the ring";
            }
            if (comm.SelectAlgorithm(pc::CollectiveKind::kAllGather, 1024) != Algorithm::kBruck) {
              return "the default table does not pick Bruck for a small allgather";
            }
            return std::string();
          });
      RequireAllOk(results);
    }
  }
  // Powers of two keep halving-doubling by default.
  auto results = RunRanks(4, InprocOptions(), [&](int, pc::Communicator& comm) -> std::string {
    return comm.SelectAlgorithm(pc::CollectiveKind::kAllGather, 1024) == Algorithm::kHalvingDoubling
               ? ""
               : "4 ranks: a small allgather is not halving-doubling";
  });
  RequireAllOk(results);
}

// The default table's 4-rank rules (over tcp: whole-vector recursive doubling from 64 to
// 128 KiB, halving-doubling to 8 MiB, ring from there; inproc and shm: ring from 64 KiB): what
// a call selects at their edges, and that the auto-selected calls give the bits of the same
// algorithm asked for by name, out of place (ReduceOutOf on the first chunk of each link), and
// exact integer sums.
TEST_CASE("4 ranks: the default selection at 64 KiB-8 MiB, bit for bit", "[collectives][inproc]") {
  const int n = 4;
  for (bool tcp : {false, true}) {
    const pc::CommunicatorOptions options = tcp ? TcpOptions() : InprocOptions();
    INFO((tcp ? "tcp" : "inproc"));
    const Algorithm low = tcp ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
    const Algorithm mid = tcp ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) {
      struct Case {
        size_t count;
        Algorithm expected;
      };
      for (const Case& c : {Case{16383, Algorithm::kHalvingDoubling}, Case{16384, low},
                            Case{32767, low}, Case{32768, mid}, Case{(size_t{2} << 20) - 1, mid},
                            Case{size_t{2} << 20, Algorithm::kRing}}) {
        const Algorithm chosen =
            comm.SelectAlgorithm(pc::CollectiveKind::kAllReduce, c.count * sizeof(float));
        if (chosen != c.expected) {
          return absl::StrCat("count ", c.count, ": selected ",
                              std::string(pc::AlgorithmName(chosen)), ", expected ",
                              std::string(pc::AlgorithmName(c.expected)));
        }
        std::vector<float> in(c.count), by_auto(c.count), by_name(c.count);
        uint32_t x = 777u + static_cast<uint32_t>(rank);
        for (float& v : in) {
          x = x * 1664525u + 1013904223u;
          v = static_cast<float>((x >> 8) * 1e-5 - 80.0);
        }
        absl::Status s =
            comm.AllReduce(in.data(), by_auto.data(), c.count, DataType::kF32, ReduceOp::kSum);
        if (s.ok()) {
          s = comm.AllReduce(in.data(), by_name.data(), c.count, DataType::kF32, ReduceOp::kSum,
                             {c.expected});
        }
        if (!s.ok()) return absl::StrCat("count ", c.count, ": ", s.message());
        if (by_auto != by_name) return absl::StrCat("count ", c.count, ": auto differs");
        // Every rank's element i is rank + i % 7: the sum is exact in any order.
        std::vector<float> small(c.count), sum(c.count);
        for (size_t i = 0; i < c.count; ++i) small[i] = static_cast<float>(rank + i % 7);
        s = comm.AllReduce(small.data(), sum.data(), c.count, DataType::kF32, ReduceOp::kSum);
        if (!s.ok()) return absl::StrCat("count ", c.count, ": ", s.message());
        for (size_t i = 0; i < c.count; ++i) {
          if (sum[i] != static_cast<float>(6 + 4 * (i % 7))) {
            return absl::StrCat("count ", c.count, ": element ", i, " is ", sum[i]);
          }
        }
      }
      return std::string();
    });
    RequireAllOk(results);
  }
}

// Reductions over tcp with the backend's own message size (512 KiB: messages arrive in many
// socket reads), 2-, 4- and 8-byte elements at odd counts, ring and tree: exact sums.
TEST_CASE("reductions of large tcp messages at odd counts are exact", "[collectives][inproc]") {
  const int n = 3;
  pc::CommunicatorOptions options = TcpOptions();
  options.chunk_bytes = 0;  // the backend's (512 KiB messages)
  auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) -> std::string {
    for (const DataType dt : {DataType::kF64, DataType::kF16, DataType::kI32}) {
      const size_t es = pc::DataTypeSize(dt);
      const size_t count = size_t{1000003} / es * 2 + 1;  // odd, about 2 MB
      std::vector<uint8_t> in(count * es), out(count * es);
      auto value = [&](int r, size_t i) { return static_cast<double>(r + i % 5); };
      auto put = [&](uint8_t* p, size_t i, double v) {
        if (dt == DataType::kF64) {
          std::memcpy(p + i * 8, &v, 8);
        } else if (dt == DataType::kI32) {
          const int32_t x = static_cast<int32_t>(v);
          std::memcpy(p + i * 4, &x, 4);
        } else {
          const uint16_t h = plexus::kernels::FloatToHalf(static_cast<float>(v));
          std::memcpy(p + i * 2, &h, 2);
        }
      };
      auto get = [&](const uint8_t* p, size_t i) -> double {
        if (dt == DataType::kF64) {
          double v;
          std::memcpy(&v, p + i * 8, 8);
          return v;
        }
        if (dt == DataType::kI32) {
          int32_t x;
          std::memcpy(&x, p + i * 4, 4);
          return x;
        }
        uint16_t h;
        std::memcpy(&h, p + i * 2, 2);
        return plexus::kernels::HalfToFloat(h);
      };
      for (size_t i = 0; i < count; ++i) put(in.data(), i, value(rank, i));
      auto sum = [&](size_t i) { return 3.0 + 3.0 * static_cast<double>(i % 5); };
      const std::string what = std::string(pc::DataTypeName(dt));
      for (Algorithm a : {Algorithm::kRing, Algorithm::kTree}) {
        absl::Status s = comm.AllReduce(in.data(), out.data(), count, dt, ReduceOp::kSum, {a});
        if (!s.ok()) return what + " allreduce: " + std::string(s.message());
        for (size_t i = 0; i < count; ++i) {
          if (get(out.data(), i) != sum(i)) return absl::StrCat(what, " allreduce element ", i);
        }
      }
      std::fill(out.begin(), out.end(), 0);
      absl::Status s =
          comm.Reduce(in.data(), out.data(), count, dt, ReduceOp::kSum, n - 1, Algorithm::kRing);
      if (!s.ok()) return what + " reduce: " + std::string(s.message());
      for (size_t i = 0; rank == n - 1 && i < count; ++i) {
        if (get(out.data(), i) != sum(i)) return absl::StrCat(what, " reduce element ", i);
      }
      const size_t block = count / n;
      s = comm.ReduceScatter(in.data(), out.data(), block, dt, ReduceOp::kSum);
      if (!s.ok()) return what + " reduce-scatter: " + std::string(s.message());
      for (size_t i = 0; i < block; ++i) {
        if (get(out.data(), i) != sum(rank * block + i)) {
          return absl::StrCat(what, " reduce-scatter element ", i);
        }
      }
    }
    return std::string();
  });
  RequireAllOk(results);
}

// Whole-vector doubling on a power-of-two world reads the operand from the send buffer (no
// copy into the output first): the bits of the same call in place, and the input untouched.
TEST_CASE("4 ranks: whole-vector doubling out of place gives the bits of in place",
          "[collectives][inproc]") {
  const int n = 4;
  for (bool tcp : {false, true}) {
    const pc::CommunicatorOptions options = tcp ? TcpOptions() : InprocOptions();
    INFO((tcp ? "tcp" : "inproc"));
    auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) {
      struct Case {
        size_t count;
        Algorithm algorithm;
      };
      // 3 < n and 3000 (12 KB) take halving-doubling's whole-vector path (inproc: 3 by mailbox);
      // the others are named.
      for (const Case& c :
           {Case{3, Algorithm::kHalvingDoubling}, Case{3000, Algorithm::kHalvingDoubling},
            Case{3000, Algorithm::kRecursiveDoubling},
            Case{20001, Algorithm::kRecursiveDoubling}}) {
        std::vector<float> in(c.count), out(c.count);
        uint32_t x = 4242u + static_cast<uint32_t>(rank);
        for (float& v : in) {
          x = x * 1664525u + 1013904223u;
          v = static_cast<float>((x >> 8) * 1e-5 - 80.0);
        }
        const std::vector<float> original = in;
        const std::string what =
            absl::StrCat("count ", c.count, " ", std::string(pc::AlgorithmName(c.algorithm)));
        absl::Status s = comm.AllReduce(in.data(), out.data(), c.count, DataType::kF32,
                                        ReduceOp::kSum, {c.algorithm});
        if (!s.ok()) return absl::StrCat(what, ": ", s.message());
        if (in != original) return absl::StrCat(what, ": out of place changed its input");
        s = comm.AllReduce(in.data(), in.data(), c.count, DataType::kF32, ReduceOp::kSum,
                           {c.algorithm});
        if (!s.ok()) return absl::StrCat(what, ": ", s.message());
        if (out != in) return absl::StrCat(what, ": out of place differs from in place");
      }
      return std::string();
    });
    RequireAllOk(results);
  }
}

// A small ReduceScatter (halving-doubling, the whole input within the mailbox limit) goes by
// mailbox as a small AllReduce of the whole input: each rank's block is the bits of that
// AllReduce's, at odd counts, on the power-of-two worlds where halving-doubling runs (elsewhere
// it falls back to the ring), for ops that round (sum, avg) and pick (max); with 2 ranks, where
// both orders are one addition, also the ring's bits. Inputs far from integers, so that another
// order of additions shows.
TEST_CASE("a small reduce-scatter by mailbox gives the bits of a small allreduce's block",
          "[collectives][inproc]") {
  for (int n : {2, 4, 8}) {
    INFO("ranks " << n);
    auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
      for (size_t count : {size_t{1}, size_t{3}, size_t{129}, size_t{8192 / 4 / 8}}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          const std::string what = absl::StrCat("count ", count, " op ", static_cast<int>(op));
          std::vector<float> in(count * n);
          uint32_t x = 7u + 31u * static_cast<uint32_t>(rank);
          for (float& v : in) {
            x = x * 1664525u + 1013904223u;
            v = static_cast<float>((x >> 8) * 1.37e-5 - 80.0);
          }
          std::vector<float> all(count * n), out(count, -1.0f);
          absl::Status s = comm.AllReduce(in.data(), all.data(), count * n, DataType::kF32, op);
          if (!s.ok()) return absl::StrCat("AllReduce ", what, ": ", s.message());
          s = comm.ReduceScatter(in.data(), out.data(), count, DataType::kF32, op,
                                 {Algorithm::kHalvingDoubling});
          if (!s.ok()) return absl::StrCat("ReduceScatter ", what, ": ", s.message());
          const float* block = all.data() + static_cast<size_t>(rank) * count;
          if (std::memcmp(out.data(), block, count * sizeof(float)) != 0) {
            return absl::StrCat("ReduceScatter ", what, ": not the allreduce's bits");
          }
          if (n == 2) {
            std::vector<float> ring(count);
            s = comm.ReduceScatter(in.data(), ring.data(), count, DataType::kF32, op,
                                   {Algorithm::kRing});
            if (!s.ok()) return absl::StrCat("ring ReduceScatter ", what, ": ", s.message());
            if (std::memcmp(out.data(), ring.data(), count * sizeof(float)) != 0) {
              return absl::StrCat("ReduceScatter ", what, ": not the ring's bits");
            }
          }
        }
      }
      return std::string();
    });
    RequireAllOk(results);
  }
}

// Out of place, ReduceScatter's first step reads the operand straight from the send buffer
// (no copy into scratch): the bits of the same call in place. A Broadcast's root sends straight
// from its input (copied into its output after): the root's values on every rank. The inputs
// stay untouched. Counts cross the
// chunk size and the mailbox limit; 3 ranks fold nothing (ring) but are no power of two.
TEST_CASE("reduce-scatter and broadcast out of place read the input directly",
          "[collectives][inproc]") {
  for (int n : {2, 3, 4}) {
    INFO("ranks " << n);
    auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}}) {
        for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
          const std::string what =
              absl::StrCat("count ", count, " ", std::string(pc::AlgorithmName(a)));
          std::vector<float> in(count * n);
          uint32_t x = 99u + static_cast<uint32_t>(rank);
          for (float& v : in) {
            x = x * 1664525u + 1013904223u;
            v = static_cast<float>((x >> 8) * 1e-5 - 80.0);
          }
          const std::vector<float> original = in;
          if (a != Algorithm::kTree) {
            std::vector<float> out(count);
            absl::Status s = comm.ReduceScatter(in.data(), out.data(), count, DataType::kF32,
                                                ReduceOp::kSum, {a});
            if (!s.ok()) return absl::StrCat("ReduceScatter ", what, ": ", s.message());
            if (in != original) return absl::StrCat("ReduceScatter ", what, ": input changed");
            float* mine = in.data() + static_cast<size_t>(rank) * count;
            s = comm.ReduceScatter(in.data(), mine, count, DataType::kF32, ReduceOp::kSum, {a});
            if (!s.ok()) return absl::StrCat("ReduceScatter ", what, " in place: ", s.message());
            if (!std::equal(out.begin(), out.end(), mine)) {
              return absl::StrCat("ReduceScatter ", what, ": out of place differs from in place");
            }
            in = original;
          }
          if (a == Algorithm::kHalvingDoubling) continue;  // broadcasts: chain and tree
          for (int root = 0; root < n; ++root) {
            std::vector<float> out(count * n, -1.0f);
            absl::Status s =
                comm.Broadcast(in.data(), out.data(), count * n, DataType::kF32, root, {a});
            if (!s.ok()) return absl::StrCat("Broadcast ", what, ": ", s.message());
            if (in != original) return absl::StrCat("Broadcast ", what, ": input changed");
            std::vector<float> expected(count * n);
            uint32_t y = 99u + static_cast<uint32_t>(root);
            for (float& v : expected) {
              y = y * 1664525u + 1013904223u;
              v = static_cast<float>((y >> 8) * 1e-5 - 80.0);
            }
            if (out != expected) {
              return absl::StrCat("Broadcast ", what, " root ", root, ": wrong result");
            }
          }
        }
      }
      return std::string();
    });
    RequireAllOk(results);
  }
}

// Broadcast over tcp, 4 ranks: the default table's double tree at every size (inproc: the
// chain from 256 KiB); auto gives the root's bits on every rank, out of place.
TEST_CASE("4 ranks over tcp: broadcasts select the double tree", "[collectives][inproc]") {
  const int n = 4;
  for (bool tcp : {false, true}) {
    const pc::CommunicatorOptions options = tcp ? TcpOptions() : InprocOptions();
    INFO((tcp ? "tcp" : "inproc"));
    auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) {
      for (size_t count : {size_t{100}, size_t{65536}, size_t{300001}}) {
        const size_t bytes = count * sizeof(float);
        const Algorithm expected = tcp || bytes < (256 << 10) ? Algorithm::kTree : Algorithm::kRing;
        const Algorithm chosen = comm.SelectAlgorithm(pc::CollectiveKind::kBroadcast, bytes);
        if (chosen != expected) {
          return absl::StrCat("count ", count, ": selected ",
                              std::string(pc::AlgorithmName(chosen)));
        }
        const int root = static_cast<int>(count % n);
        std::vector<float> in(count), out(count, -1.0f);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 1000003 + i) * 0.5f;
        absl::Status s = comm.Broadcast(in.data(), out.data(), count, DataType::kF32, root);
        if (!s.ok()) return absl::StrCat("count ", count, ": ", s.message());
        for (size_t i = 0; i < count; ++i) {
          if (out[i] != static_cast<float>(root * 1000003 + i) * 0.5f) {
            return absl::StrCat("count ", count, ": element ", i, " is ", out[i]);
          }
        }
      }
      return std::string();
    });
    RequireAllOk(results);
  }
}

TEST_CASE("small allreduces by mailbox give the bits of the plan path", "[collectives][inproc]") {
  // Inproc connections have mailboxes, so small halving-doubling allreduces take the mailbox
  // path; PLEXUS_COLL_MAILBOX=0 (read at creation) forces the plan path. Counts cover one
  // fragment, fragment boundaries and the mailbox path's limit; odd world sizes fold.
  for (int n : {2, 3, 4, 6}) {
    for (DataType dt : {DataType::kF32, DataType::kF64, DataType::kBF16}) {
      const size_t es = pc::DataTypeSize(dt);
      const std::vector<size_t> counts = {1, 58, 59, 232 / es + 1, 8192 / es};
      std::vector<std::vector<std::vector<uint8_t>>> outputs(2);  // [path][rank*counts + i]
      for (int path = 0; path < 2; ++path) {
        if (path == 1) setenv("PLEXUS_COLL_MAILBOX", "0", 1);
        outputs[path].resize(n * counts.size());
        std::mutex mu;
        auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
          for (size_t c = 0; c < counts.size(); ++c) {
            std::vector<uint8_t> buf(counts[c] * es);
            uint32_t x = 777u + rank;
            for (size_t i = 0; i < counts[c]; ++i) {
              x = x * 1664525u + 1013904223u;
              pc::testing::Set(dt, buf.data(), i, (x >> 8) * 1e-5 - 80.0);
            }
            absl::Status s = comm.AllReduce(buf.data(), buf.data(), counts[c], dt, ReduceOp::kSum,
                                            {Algorithm::kHalvingDoubling});
            if (!s.ok()) return std::string(s.message());
            std::lock_guard<std::mutex> lock(mu);
            outputs[path][rank * counts.size() + c] = std::move(buf);
          }
          return std::string();
        });
        unsetenv("PLEXUS_COLL_MAILBOX");
        RequireAllOk(results);
      }
      for (int r = 0; r < n; ++r) {
        for (size_t c = 0; c < counts.size(); ++c) {
          INFO("n " << n << " " << pc::DataTypeName(dt) << " count " << counts[c] << " rank " << r);
          CHECK(outputs[0][r * counts.size() + c] == outputs[1][r * counts.size() + c]);
          CHECK(outputs[0][r * counts.size() + c] == outputs[0][c]);  // and across ranks
        }
      }
    }
  }
}

TEST_CASE("asynchronous calls execute in issue order", "[collectives][inproc]") {
  const int n = 4;
  auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
    // Each call adds to the previous one's output: any reordering changes the result.
    constexpr int kCalls = 12;
    std::vector<std::vector<int64_t>> bufs(kCalls, std::vector<int64_t>(1000));
    std::vector<std::shared_ptr<pc::Work>> works;
    for (int c = 0; c < kCalls; ++c) {
      for (auto& v : bufs[c]) v = rank + c;
      works.push_back(comm.AllReduceAsync(bufs[c].data(), bufs[c].data(), 1000, DataType::kI64,
                                          ReduceOp::kSum, {}));
    }
    // A blocking call issued now runs after all of them.
    std::vector<int64_t> last(7, rank);
    absl::Status s = comm.AllReduce(last.data(), last.data(), 7, DataType::kI64, ReduceOp::kMax);
    if (!s.ok()) return std::string(s.message());
    for (int c = 0; c < kCalls; ++c) {
      if (!works[c]->Test()) return std::string("an earlier async call was still running");
      if (!works[c]->Wait(absl::Seconds(10)).ok()) return std::string(works[c]->status().message());
      const int64_t want = n * (n - 1) / 2 + static_cast<int64_t>(n) * c;
      for (int64_t v : bufs[c]) {
        if (v != want) return "call " + std::to_string(c) + " gave " + std::to_string(v);
      }
    }
    if (last[0] != n - 1) return std::string("blocking call after async ones is wrong");
    return std::string();
  });
  RequireAllOk(results);
}

TEST_CASE("Split forms sub-communicators ordered by key", "[collectives][inproc]") {
  const int n = 6;
  auto results = RunRanks(n, InprocOptions(), [&](int rank, pc::Communicator& comm) {
    const int color = rank == 5 ? pc::Communicator::kNoColor : rank % 2;
    auto child = comm.Split(color, -rank);  // descending parent rank
    if (!child.ok()) return std::string(child.status().message());
    int32_t v = rank;
    int32_t sum = 0;
    if (rank == 5) {
      if (*child != nullptr) return std::string("kNoColor got a communicator");
      // The parent still works after the split (every rank takes part).
      absl::Status s = comm.AllReduce(&v, &sum, 1, DataType::kI32, ReduceOp::kSum);
      return s.ok() && sum == 15 ? std::string() : std::string("parent allreduce after split");
    }
    if (*child == nullptr) return std::string("no child communicator");
    pc::Communicator& c = **child;
    const int expected_size = rank % 2 == 0 ? 3 : 2;  // evens 0,2,4; odds 1,3
    if (c.size() != expected_size) return "child size " + std::to_string(c.size());
    const int expected_rank = rank % 2 == 0 ? (4 - rank) / 2 : (3 - rank) / 2;
    if (c.rank() != expected_rank) return "child rank " + std::to_string(c.rank());
    absl::Status s = c.AllReduce(&v, &sum, 1, DataType::kI32, ReduceOp::kSum);
    if (!s.ok()) return std::string(s.message());
    if (sum != (rank % 2 == 0 ? 6 : 4)) return "child sum " + std::to_string(sum);
    // The parent still works after the split.
    s = comm.AllReduce(&v, &sum, 1, DataType::kI32, ReduceOp::kSum);
    if (!s.ok()) return std::string(s.message());
    return sum == 15 ? std::string() : "parent sum " + std::to_string(sum);
  });
  RequireAllOk(results);
}

TEST_CASE("ring order is validated, used and reported", "[collectives][inproc]") {
  pc::CommunicatorOptions bad = InprocOptions();
  bad.ring_order = {0, 1, 1};
  auto results = RunRanks(3, bad, [](int, pc::Communicator&) { return std::string(); });
  for (const std::string& r : results) CHECK(r.find("not a permutation") != std::string::npos);

  pc::CommunicatorOptions good = InprocOptions();
  good.ring_order = {2, 0, 3, 1};
  results = RunRanks(4, good, [&](int rank, pc::Communicator& comm) {
    if (comm.ring_order() != good.ring_order) return std::string("order not reported");
    // Ring segments are assigned by position in the order: the gathered blocks still land at
    // their ranks' offsets.
    std::vector<int32_t> out(4);
    int32_t mine = rank * 10;
    absl::Status s = comm.AllGather(&mine, out.data(), 1, DataType::kI32, {Algorithm::kRing});
    if (!s.ok()) return std::string(s.message());
    for (int r = 0; r < 4; ++r) {
      if (out[r] != r * 10) return "allgather slot " + std::to_string(r);
    }
    return std::string();
  });
  RequireAllOk(results);
}

TEST_CASE("AllGather with the input inside another rank's block of the output",
          "[collectives][inproc]") {
  // Not in place: rank r's input lies where rank r+1's block lands, so receives overwrite it
  // during the call; every rank must still get every block as it was when the call began.
  constexpr int n = 3;
  constexpr size_t kCount = 70001;  // odd, several chunks of a small chunk_bytes
  pc::CommunicatorOptions options = InprocOptions();
  options.chunk_bytes = 64 << 10;
  auto results = RunRanks(n, options, [&](int rank, pc::Communicator& comm) {
    for (Algorithm a : {Algorithm::kRing, Algorithm::kAuto}) {
      std::vector<int32_t> out(n * kCount, -1);
      int32_t* in = out.data() + ((rank + 1) % n) * kCount;
      for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<int32_t>(rank * 1000003 + i);
      absl::Status s = comm.AllGather(in, out.data(), kCount, DataType::kI32, {a});
      if (!s.ok()) return std::string(s.message());
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          if (out[r * kCount + i] != static_cast<int32_t>(r * 1000003 + i)) {
            return absl::StrCat(std::string(pc::AlgorithmName(a)), ": block ", r, " element ", i,
                                " is ", out[r * kCount + i]);
          }
        }
      }
    }
    return std::string();
  });
  RequireAllOk(results);
}

TEST_CASE("mismatched calls are reported, not silently corrupted", "[collectives][inproc]") {
  auto options = InprocOptions();
  options.timeout = absl::Seconds(5);
  struct Case {
    const char* name;
    std::function<absl::Status(int, pc::Communicator&)> call;
  };
  std::vector<Case> cases = {
      {"count",
       [](int rank, pc::Communicator& c) {
         std::vector<float> v(64, 1);
         return c.AllReduce(v.data(), v.data(), rank == 1 ? 10 : 12, DataType::kF32,
                            ReduceOp::kSum);
       }},
      {"dtype",
       [](int rank, pc::Communicator& c) {
         std::vector<int32_t> v(64, 1);
         return c.AllReduce(v.data(), v.data(), 16, rank == 2 ? DataType::kI32 : DataType::kF32,
                            ReduceOp::kSum);
       }},
      {"op",
       [](int rank, pc::Communicator& c) {
         std::vector<float> v(64, 1);
         return c.AllReduce(v.data(), v.data(), 16, DataType::kF32,
                            rank == 0 ? ReduceOp::kMax : ReduceOp::kSum);
       }},
      {"collective",
       [](int rank, pc::Communicator& c) {
         std::vector<float> v(64, 1);
         if (rank == 0) return c.Broadcast(v.data(), v.data(), 16, DataType::kF32, 0);
         return c.AllReduce(v.data(), v.data(), 16, DataType::kF32, ReduceOp::kSum);
       }},
      // Large first payloads travel behind a header of their own, small ones with it: a
      // mismatch across that line is named too, in either direction.
      {"broadcast count across the header split",
       [](int rank, pc::Communicator& c) {
         std::vector<float> v(size_t{1} << 16, 1);
         return c.Broadcast(v.data(), v.data(), rank == 1 ? 1000 : 60000, DataType::kF32, 0,
                            pc::Algorithm::kRing);
       }},
      {"broadcast count across the header split, root small",
       [](int rank, pc::Communicator& c) {
         std::vector<float> v(size_t{1} << 16, 1);
         return c.Broadcast(v.data(), v.data(), rank == 0 ? 3000 : 60000, DataType::kF32, 0,
                            pc::Algorithm::kRing);
       }},
      {"allgather count across the header split",
       [](int rank, pc::Communicator& c) {
         std::vector<float> in(size_t{1} << 14, 1), out(size_t{3} << 14, 0);
         return c.AllGather(in.data(), out.data(), rank == 2 ? 512 : 16000, DataType::kF32);
       }},
  };
  for (const Case& tc : cases) {
    INFO("mismatched " << tc.name);
    std::vector<std::string> codes(3);
    auto results = RunRanks(3, options, [&](int rank, pc::Communicator& comm) {
      absl::Status s = tc.call(rank, comm);
      // A rank that only sent (a broadcast root) cannot tell; its next call fails because the
      // receivers aborted. A broken communicator refuses every later call.
      std::vector<float> v(4, 1);
      absl::Status again = comm.AllReduce(v.data(), v.data(), 4, DataType::kF32, ReduceOp::kSum);
      if (again.ok()) return std::string("usable after a mismatch");
      return std::string(s.ok() ? again.message() : s.message());
    });
    bool named = false;
    for (const std::string& r : results) {
      CHECK(r != "usable after a mismatch");
      if (r.find("mismatched") != std::string::npos ||
          r.find("do not match") != std::string::npos) {
        named = true;
      }
    }
    CHECK(named);
  }
}

TEST_CASE("a rank in another collective over tcp is named with both calls, not blamed for a hang",
          "[collectives][inproc]") {
  // Over tcp the other call's messages wait unmatched in the transport: no receive ever sees
  // their header. The wait records say which call each stalled rank is in.
  auto options = TcpOptions();
  options.timeout = absl::Seconds(3);
  constexpr size_t kCount = size_t{4} << 20;
  for (int odd : {2, 1}) {
    INFO("rank " << odd << " broadcasts");
    std::vector<double> seconds(4, 0);
    std::vector<std::string> codes(4);
    auto results = RunRanks(4, options, [&](int rank, pc::Communicator& comm) -> std::string {
      std::vector<float> v(kCount, 1.0f);
      if (absl::Status s = comm.AllReduce(v.data(), v.data(), 16, DataType::kF32, ReduceOp::kSum);
          !s.ok()) {
        return absl::StrCat("warm-up: ", s.message());
      }
      const absl::Time start = absl::Now();
      absl::Status s =
          rank == odd ? comm.Broadcast(v.data(), v.data(), kCount, DataType::kF32, 0)
                      : comm.AllReduce(v.data(), v.data(), kCount, DataType::kF32, ReduceOp::kSum);
      seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);
      if (s.ok()) return "completed a mismatched call";
      codes[rank] = absl::StatusCodeToString(s.code());
      return std::string(s.message());
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << results[r] << " after " << seconds[r] << " s");
      CHECK(codes[r] == absl::StatusCodeToString(absl::StatusCode::kFailedPrecondition));
      CHECK(absl::StrContains(results[r], "broadcast #"));
      CHECK(absl::StrContains(results[r], "allreduce #"));
      CHECK((absl::StrContains(results[r], "made different calls") ||
             absl::StrContains(results[r], "mismatched collective calls")));
      CHECK(seconds[r] < 3 * 1.5);
    }
  }
}

TEST_CASE("a receive does not mistake a peer's next collective for a mismatch",
          "[collectives][inproc]") {
  // Rank 2 sends to rank 0 late; ranks 1 and 3 are already in the allreduce that follows, and
  // their (mailbox) messages of it wait in rank 0's inboxes while rank 0 receives.
  auto results = RunRanks(4, InprocOptions(), [](int rank, pc::Communicator& comm) {
    float x = 1, y = 0;
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (absl::Status s = comm.Send(&x, 1, DataType::kF32, 0); !s.ok()) {
        return std::string(s.message());
      }
    }
    if (rank == 0) {
      if (absl::Status s = comm.Recv(&y, 1, DataType::kF32, 2); !s.ok()) {
        return std::string(s.message());
      }
      if (y != 1) return std::string("received the wrong value");
    }
    absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kF32, ReduceOp::kSum);
    if (!s.ok()) return std::string(s.message());
    return y == 4 ? std::string() : std::string("wrong sum");
  });
  RequireAllOk(results);
}

TEST_CASE("a broadcast whose ranks disagree on the root is reported", "[collectives][inproc]") {
  auto options = InprocOptions();
  options.timeout = absl::Seconds(5);
  // Small (mailbox path) and large (plan path) vectors.
  for (size_t count : {size_t{16}, size_t{20000}}) {
    auto results = RunRanks(3, options, [&](int rank, pc::Communicator& comm) {
      std::vector<float> v(count, static_cast<float>(rank));
      absl::Status s = comm.Broadcast(v.data(), v.data(), count, DataType::kF32, rank == 0 ? 0 : 1);
      // A root only sends: it can learn of the mismatch only from a later call that reads the
      // same message stream (mailbox calls do not), so the next call is a large allreduce.
      std::vector<float> w(20000, 1);
      absl::Status again =
          comm.AllReduce(w.data(), w.data(), w.size(), DataType::kF32, ReduceOp::kSum);
      if (s.ok() && again.ok()) return std::string("no error");
      return std::string(s.ok() ? again.message() : s.message());
    });
    INFO("count " << count);
    bool named = false;
    for (const std::string& r : results) {
      CHECK(r != "no error");
      named = named || r.find("mismatched") != std::string::npos;
    }
    CHECK(named);
  }
}

TEST_CASE("bad arguments are refused before anything is sent", "[collectives][inproc]") {
  auto results = RunRanks(2, InprocOptions(), [](int, pc::Communicator& comm) -> std::string {
    float v = 0;
    if (comm.Broadcast(&v, &v, 1, DataType::kF32, 7).ok()) return "root 7 accepted";
    if (comm.AllReduce(nullptr, &v, 1, DataType::kF32, ReduceOp::kSum).ok()) return "null send";
    if (comm.Send(&v, 1, DataType::kF32, comm.rank()).ok()) return "send to self accepted";
    std::vector<size_t> one(1, 0);
    if (comm.AllToAllV(&v, one, one, &v, one, one, DataType::kF32).ok()) return "short spans";
    auto work = comm.AllReduceAsync(&v, &v, 1, static_cast<DataType>(42), ReduceOp::kSum);
    if (!work->Test() || work->status().ok()) return "bad dtype accepted";
    // The communicator is still healthy: argument errors do not break it.
    return comm.AllReduce(&v, &v, 1, DataType::kF32, ReduceOp::kSum).ok() ? "" : "broken";
  });
  RequireAllOk(results);
}
