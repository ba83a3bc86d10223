// The failover benchmark's computations (bench/multipath/failover_series): the outage (longest
// gap in delivered bytes), a byte stream regrouped as whole messages, goodput, and the timeline
// of per-path wire rates and goodput. No root needed.
#include <catch2/catch.hpp>

#include <vector>

#include "failover_series.hpp"

namespace mpb = plexus::mpbench;

namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
absl::Time At(double s) { return kT0 + absl::Seconds(s); }

}  // namespace

TEST_CASE("LongestGap counts the window's ends and ignores deliveries outside it", "[bench]") {
  const std::vector<mpb::Delivery> d = {
      {At(-0.5), 10}, {At(0.1), 10}, {At(0.15), 10}, {At(0.6), 10}, {At(1.5), 10}};
  CHECK(mpb::LongestGap(d, At(0), At(1)) == absl::Milliseconds(450));
  // Stopping for good: the gap runs to the window's end.
  CHECK(mpb::LongestGap(d, At(0), At(2)) == absl::Milliseconds(900));
  CHECK(mpb::LongestGap({}, At(0), At(1)) == absl::Seconds(1));
}

TEST_CASE("MessageDeliveries: a message is delivered with its last byte", "[bench]") {
  // Cumulative 300, 800, 1100, 2100 bytes; messages of 512 end at 512, 1024, 1536 and 2048.
  const std::vector<mpb::Delivery> d = {{At(1), 300}, {At(2), 500}, {At(3), 300}, {At(4), 1000}};
  const std::vector<mpb::Delivery> m = mpb::MessageDeliveries(d, 512);
  REQUIRE(m.size() == 4);
  CHECK(m[0].at == At(2));
  CHECK(m[1].at == At(3));
  CHECK(m[2].at == At(4));
  CHECK(m[3].at == At(4));
  for (const auto& x : m) CHECK(x.bytes == 512);
  // A trickle of small reads does not end an outage in whole messages.
  const std::vector<mpb::Delivery> trickle = {
      {At(0.1), 512}, {At(0.3), 8}, {At(0.5), 8}, {At(0.7), 8}, {At(0.9), 488}};
  CHECK(mpb::LongestGap(trickle, At(0), At(1)) == absl::Milliseconds(200));
  CHECK(mpb::LongestGap(mpb::MessageDeliveries(trickle, 512), At(0), At(1)) ==
        absl::Milliseconds(800));
}

TEST_CASE("GoodputMbit counts the bytes within the window", "[bench]") {
  const std::vector<mpb::Delivery> d = {{At(-1), 999}, {At(0.5), 1000000}, {At(2.5), 999}};
  CHECK(mpb::GoodputMbit(d, At(0), At(2)) == Approx(4.0));
}

TEST_CASE("Timeline: per-path wire rates and goodput per sampling interval", "[bench]") {
  const std::vector<mpb::WireSampler::Sample> samples = {{At(-0.1), {0, 0}},
                                                         {At(0), {125000, 0}},
                                                         {At(0.1), {1375000, 0}},
                                                         {At(0.2), {2625000, 125000}},
                                                         {At(0.3), {2625000, 125000}}};
  const std::vector<mpb::Delivery> d = {{At(-0.05), 7}, {At(0.05), 1250000}};
  const auto points = mpb::Timeline(samples, d, At(0), At(0.2));
  REQUIRE(points.size() == 2);  // the intervals inside [0, 0.2]
  CHECK(points[0].t_s == Approx(0.1));
  REQUIRE(points[0].path_mbit.size() == 2);
  CHECK(points[0].path_mbit[0] == Approx(100.0));
  CHECK(points[0].path_mbit[1] == 0.0);
  CHECK(points[0].goodput_mbit == Approx(100.0));
  CHECK(points[1].t_s == Approx(0.2));
  CHECK(points[1].path_mbit[0] == Approx(100.0));
  CHECK(points[1].path_mbit[1] == Approx(10.0));
  CHECK(points[1].goodput_mbit == 0.0);
}

TEST_CASE("ReadRxBytes names the namespace it cannot enter", "[bench]") {
  const auto rx = mpb::ReadRxBytes("plexus-no-such-netns", "mpb", 2);
  REQUIRE_FALSE(rx.ok());
  CHECK(rx.status().message().find("plexus-no-such-netns") != absl::string_view::npos);
}
