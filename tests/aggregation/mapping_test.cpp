// Chunking and the LPT mapping: chunk boundaries, determinism, and Graham's 4/3 - 1/(3m) bound
// against the brute-force optimum on every small instance drawn.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "plexus/aggregation/mapping.hpp"

namespace pa = plexus::aggregation;

namespace {

uint64_t BruteForceOptimum(const std::vector<uint64_t>& sizes, int bins) {
  std::vector<uint64_t> load(bins, 0);
  uint64_t best = UINT64_MAX;
  std::function<void(size_t)> go = [&](size_t i) {
    if (i == sizes.size()) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (int b = 0; b < bins; ++b) {
      load[b] += sizes[i];
      if (load[b] < best) go(i + 1);
      load[b] -= sizes[i];
      if (load[b] == 0) break;  // empty bins are interchangeable
    }
  };
  go(0);
  return best;
}

}  // namespace

TEST_CASE("SplitKey cuts 32 KB chunks with a short tail", "[aggregation][mapping]") {
  auto chunks = pa::SplitKey(7, 20000, 4, pa::kDefaultChunkBytes).value();
  REQUIRE(chunks.size() == 3);  // 8192 elements per chunk
  CHECK(chunks[0].offset == 0);
  CHECK(chunks[0].elements == 8192);
  CHECK(chunks[1].offset == 8192);
  CHECK(chunks[2].elements == 20000 - 16384);
  CHECK(chunks[2].bytes == (20000 - 16384) * 4);
  CHECK(chunks[2].key == 7);
  CHECK(chunks[2].index == 2);
  // bf16: twice the elements per chunk; chunk_bytes not a multiple of the element size.
  auto half = pa::SplitKey(1, 16385, 2, 32769).value();
  REQUIRE(half.size() == 2);
  CHECK(half[0].elements == 16384);
  CHECK(half[1].elements == 1);
  CHECK_FALSE(pa::SplitKey(1, 0, 4, 1024).ok());
  CHECK_FALSE(pa::SplitKey(1, 10, 4, 3).ok());
}

TEST_CASE("LPT is within 4/3 - 1/(3m) of the optimum on small instances",
          "[aggregation][mapping]") {
  std::mt19937 rng(3);
  int worst_num = 0, worst_den = 1;
  for (int trial = 0; trial < 400; ++trial) {
    const int bins = 2 + static_cast<int>(rng() % 3);  // 2..4
    const size_t items = 3 + rng() % 7;                // 3..9
    std::vector<uint64_t> sizes(items);
    for (auto& s : sizes) s = 1 + rng() % 50;
    const auto assign = pa::LptAssign(sizes, bins);
    const uint64_t lpt = pa::Makespan(sizes, assign, bins);
    const uint64_t opt = BruteForceOptimum(sizes, bins);
    INFO("trial " << trial << " bins " << bins << " lpt " << lpt << " opt " << opt);
    REQUIRE(lpt >= opt);
    // lpt / opt <= 4/3 - 1/(3m)  <=>  3m * lpt <= (4m - 1) * opt
    REQUIRE(3 * bins * lpt <= (4 * static_cast<uint64_t>(bins) - 1) * opt);
    if (lpt * worst_den > static_cast<uint64_t>(worst_num) * opt) {
      worst_num = static_cast<int>(lpt);
      worst_den = static_cast<int>(opt);
    }
  }
  // Graham's tight instance for m = 2: {3, 3, 2, 2, 2} -> LPT 7, optimum 6 (ratio 7/6).
  std::vector<uint64_t> tight = {3, 3, 2, 2, 2};
  CHECK(pa::Makespan(tight, pa::LptAssign(tight, 2), 2) == 7);
  CHECK(BruteForceOptimum(tight, 2) == 6);
}

TEST_CASE("LPT breaks ties deterministically and honours initial loads", "[aggregation][mapping]") {
  std::vector<uint64_t> sizes = {5, 5, 5, 5};
  CHECK(pa::LptAssign(sizes, 2) == std::vector<int>{0, 1, 0, 1});
  std::vector<uint64_t> loads = {10, 0};
  CHECK(pa::LptAssign(sizes, 2, loads) == std::vector<int>{1, 1, 0, 1});
}

TEST_CASE("MapChunks balances chunks over connections, connections over cores",
          "[aggregation][mapping]") {
  std::vector<pa::Chunk> all;
  for (uint64_t key = 0; key < 6; ++key) {
    auto c = pa::SplitKey(key, 10000 * (key + 1), 4, pa::kDefaultChunkBytes).value();
    all.insert(all.end(), c.begin(), c.end());
  }
  const auto m1 = pa::MapChunks(all, 8, 2);
  const auto m2 = pa::MapChunks(all, 8, 2);
  CHECK(m1.chunk_connection == m2.chunk_connection);  // same input, same mapping
  CHECK(m1.connection_core == m2.connection_core);
  uint64_t total = 0;
  for (const auto& c : all) total += c.bytes;
  REQUIRE(m1.core_bytes.size() == 2);
  CHECK(m1.core_bytes[0] + m1.core_bytes[1] == total);
  const uint64_t hi = std::max(m1.core_bytes[0], m1.core_bytes[1]);
  CHECK(hi * 2 <= total + pa::kDefaultChunkBytes * 2);  // within a connection's worth of even
}
