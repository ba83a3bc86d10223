// The pieces of plexus-bench-collectives that decide what is measured and what counts as wrong.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bench_common.hpp"

namespace pb = plexus::bench;

TEST_CASE("sizes: lists, ranges, factors and suffixes") {
  std::string error;
  auto sizes = pb::ParseSizes("8,1K..4K", 4, &error);
  REQUIRE(sizes.has_value());
  CHECK(*sizes == std::vector<size_t>{8, 1024, 2048, 4096});

  sizes = pb::ParseSizes("1M..64Mx4,8", 4, &error);
  REQUIRE(sizes.has_value());
  CHECK(*sizes == std::vector<size_t>{8, 1 << 20, 4 << 20, 16 << 20, 64 << 20});

  // Rounded down to whole elements, duplicates merged.
  sizes = pb::ParseSizes("10,8", 4, &error);
  REQUIRE(sizes.has_value());
  CHECK(*sizes == std::vector<size_t>{8});
}

TEST_CASE("sizes: bad input is an error naming the item") {
  std::string error;
  for (const char* bad : {"", "abc", "8,,16", "-8", "4K..1K", "0..8", "1K..4Kx1", "2", "8Q"}) {
    INFO(bad);
    error.clear();
    CHECK_FALSE(pb::ParseSizes(bad, 4, &error).has_value());
    CHECK_FALSE(error.empty());
  }
}

TEST_CASE("expected sums are exact and every corrupted element is counted") {
  for (int world : {1, 2, 3, 4, 8}) {
    const size_t count = 1000;
    std::vector<float> sum(count, 0.0f);
    std::vector<float> input(count);
    for (int r = 0; r < world; ++r) {
      pb::FillInput(input.data(), count, r);
      for (size_t i = 0; i < count; ++i) sum[i] += input[i];
    }
    CHECK(pb::CountWrong(sum.data(), count, world) == 0);
    sum[0] += 1.0f;
    sum[17] = -1.0f;
    sum[999] *= 2.0f;
    const size_t expected_wrong = sum[999] == 0.0f ? 2 : 3;  // doubling 0 leaves it right
    CHECK(pb::CountWrong(sum.data(), count, world) == expected_wrong);
  }
  // Ranks contribute different values, so a result from one rank alone is wrong.
  std::vector<float> one_rank(64);
  pb::FillInput(one_rank.data(), one_rank.size(), 0);
  CHECK(pb::CountWrong(one_rank.data(), one_rank.size(), 2) > 0);
}

TEST_CASE("iteration counts: fixed when given, bounded otherwise") {
  CHECK(pb::IterationsFor(8, 7) == 7);
  CHECK(pb::IterationsFor(8, 0) == 1000);
  CHECK(pb::IterationsFor(size_t{1} << 20, 0) == 256);
  CHECK(pb::IterationsFor(size_t{1} << 30, 0) == 5);
  CHECK(pb::WarmupFor(1000, -1) == 100);
  CHECK(pb::WarmupFor(5, -1) == 2);
  CHECK(pb::WarmupFor(5, 0) == 0);
}
