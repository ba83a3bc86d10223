// The pieces of plexus-bench-collectives that decide what is measured and what counts as wrong.
#include <catch2/catch.hpp>

#include <algorithm>
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

  // base::ParseBytes's forms: either case, K or KiB.
  sizes = pb::ParseSizes("64KiB,2m", 4, &error);
  REQUIRE(sizes.has_value());
  CHECK(*sizes == std::vector<size_t>{64 << 10, 2 << 20});
}

TEST_CASE("sizes: bad input is an error naming the item") {
  std::string error;
  for (const char* bad :
       {"", "abc", "8,,16", "-8", "4K..1K", "0..8", "1K..4Kx1", "2", "8Q", "2048G"}) {
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

TEST_CASE("operations: names, lists and nccl-tests bus factors") {
  std::string error;
  auto ops = pb::ParseOps("alltoall,allreduce", &error);
  REQUIRE(ops.has_value());
  CHECK(*ops == std::vector<pb::Op>{pb::Op::kAllreduce, pb::Op::kAlltoall});
  ops = pb::ParseOps("all", &error);
  REQUIRE(ops.has_value());
  CHECK(ops->size() == 6);
  for (pb::Op op : *ops) {
    auto again = pb::ParseOps(std::string(pb::OpName(op)), &error);
    REQUIRE(again.has_value());
    CHECK(*again == std::vector<pb::Op>{op});
  }
  for (const char* bad : {"", "allreduce,", "reduction", "ALL"}) {
    INFO(bad);
    error.clear();
    CHECK_FALSE(pb::ParseOps(bad, &error).has_value());
    CHECK_FALSE(error.empty());
  }
  CHECK(pb::BusFactor(pb::Op::kAllreduce, 4) == 1.5);
  CHECK(pb::BusFactor(pb::Op::kBroadcast, 4) == 1.0);
  CHECK(pb::BusFactor(pb::Op::kReduce, 4) == 1.0);
  CHECK(pb::BusFactor(pb::Op::kAllgather, 4) == 0.75);
  CHECK(pb::BusFactor(pb::Op::kReduceScatter, 2) == 0.5);
  CHECK(pb::BusFactor(pb::Op::kAlltoall, 4) == 0.75);
  CHECK(pb::BusFactor(pb::Op::kAllreduce, 1) == 1.0);
}

TEST_CASE("operation shapes: the size is a rank's whole buffer, per-rank counts at least 1") {
  const pb::OpShape ag = pb::ShapeFor(pb::Op::kAllgather, 1 << 20, 4);
  CHECK(ag.count == (1 << 20) / 16);
  CHECK(ag.send_count == ag.count);
  CHECK(ag.recv_count == ag.count * 4);
  CHECK(ag.bytes == 1 << 20);
  const pb::OpShape rs = pb::ShapeFor(pb::Op::kReduceScatter, 1 << 20, 4);
  CHECK(rs.send_count == rs.count * 4);
  CHECK(rs.recv_count == rs.count);
  const pb::OpShape a2a = pb::ShapeFor(pb::Op::kAlltoall, 8, 4);  // rounded up to 1 per rank
  CHECK(a2a.count == 1);
  CHECK(a2a.bytes == 16);
  const pb::OpShape bc = pb::ShapeFor(pb::Op::kBroadcast, 64, 3);
  CHECK(bc.count == 16);
  CHECK(bc.bytes == 64);
}

// Computes each operation's result from every rank's input the way a correct implementation
// would, checks it counts as right, then corrupts one element.
TEST_CASE("operation checks: exact results pass, a corrupted or misplaced block does not") {
  for (int world : {1, 2, 3, 4}) {
    for (pb::Op op : pb::AllOps()) {
      INFO("world " << world << " op " << pb::OpName(op));
      std::vector<pb::OpBuffers> ranks(world);
      for (int r = 0; r < world; ++r) ranks[r].Prepare(op, 4096, r, world);
      const size_t c = ranks[0].shape().count;
      for (int me = 0; me < world; ++me) {
        float* out = ranks[me].recv();
        const size_t n = ranks[me].shape().recv_count;
        for (size_t i = 0; i < n; ++i) {
          switch (op) {
            case pb::Op::kAllreduce:
            case pb::Op::kReduce: {  // reduce: only the root's output is defined (and checked)
              float sum = 0;
              for (int r = 0; r < world; ++r) sum += ranks[r].send()[i];
              out[i] = sum;
              break;
            }
            case pb::Op::kBroadcast:
              out[i] = ranks[0].recv()[i];
              break;
            case pb::Op::kAllgather:
              out[i] = ranks[i / c].send()[i % c];
              break;
            case pb::Op::kReduceScatter: {
              float sum = 0;
              for (int r = 0; r < world; ++r) sum += ranks[r].send()[me * c + i];
              out[i] = sum;
              break;
            }
            case pb::Op::kAlltoall:
              out[i] = ranks[i / c].send()[me * c + i % c];
              break;
          }
        }
      }
      for (int me = 0; me < world; ++me) CHECK(ranks[me].CountWrong() == 0);
      // A wrong element is counted (on a non-root rank for broadcast: root's is its input; on
      // the root for reduce: the others have no result).
      pb::OpBuffers& victim = ranks[op == pb::Op::kReduce ? 0 : world - 1];
      if (op != pb::Op::kBroadcast || world > 1) {
        victim.recv()[0] += 1.0f;
        CHECK(victim.CountWrong() == 1);
      }
      // The receive buffer as Refill leaves it (-1, never a valid value) is all wrong, except
      // broadcast's root, which holds its input.
      ranks[0].Refill();
      const size_t expected = op == pb::Op::kBroadcast ? 0 : ranks[0].shape().recv_count;
      CHECK(ranks[0].CountWrong() == expected);
    }
  }
}

TEST_CASE("launch order: balanced positions and predecessors over the runs") {
  CHECK(pb::BalancedOrder(0, 3).empty());
  CHECK(pb::BalancedOrder(1, 7) == std::vector<size_t>{0});
  CHECK(pb::BalancedOrder(2, 0) == std::vector<size_t>{0, 1});
  CHECK(pb::BalancedOrder(2, 1) == std::vector<size_t>{1, 0});
  for (size_t n : {2, 3, 4, 5, 6, 7}) {
    INFO("n = " << n);
    const size_t rows = n % 2 == 0 ? n : 2 * n;  // the design's period
    const size_t per_cell = rows / n;
    std::vector<std::vector<size_t>> at_position(n, std::vector<size_t>(n, 0));
    std::vector<std::vector<size_t>> follows(n, std::vector<size_t>(n, 0));
    for (size_t row = 0; row < rows; ++row) {
      const std::vector<size_t> order = pb::BalancedOrder(n, row);
      REQUIRE(order.size() == n);
      std::vector<size_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (size_t k = 0; k < n; ++k) REQUIRE(sorted[k] == k);  // a permutation
      for (size_t k = 0; k < n; ++k) ++at_position[order[k]][k];
      for (size_t k = 1; k < n; ++k) ++follows[order[k]][order[k - 1]];
      CHECK(pb::BalancedOrder(n, row + rows) == order);  // rows repeat
    }
    for (size_t item = 0; item < n; ++item) {
      for (size_t k = 0; k < n; ++k) CHECK(at_position[item][k] == per_cell);
      for (size_t other = 0; other < n; ++other) {
        CHECK(follows[item][other] == (other == item ? 0 : per_cell));
      }
    }
  }
}
