// Fianchetto's DRX placement model: link rates and latencies checked by hand on small cases, then
// the properties the model claims on the seed's pipelines.
#include "plexus/netmodel/drx_placement.hpp"

#include <catch2/catch.hpp>
#include <string>

namespace pn = plexus::netmodel;

namespace {

// No software overheads or hop latencies: only bytes over rates remain, which a hand can check.
pn::DrxFabric Bare() {
  pn::DrxFabric f;
  f.stage_overhead_s = 0;
  f.switch_hop_s = 0;
  f.mux_hop_s = 0;
  return f;
}

pn::DrxWorkload OneGigabyte() {
  pn::DrxWorkload w;
  w.name = "hand";
  w.input_bytes = 1e9;
  w.output_bytes = 0.5e9;
  w.cpu_seconds_per_byte = 1e-9;  // 1 GB/s per core
  w.kernel1_s = 0.1;
  w.kernel2_s = 0.2;
  return w;
}

}  // namespace

TEST_CASE("PCIe link rates: 8 GT/s per lane at gen 3, doubling, 128b/130b then FLIT 242/256") {
  CHECK(pn::PcieBytesPerSecond(3, 16) == Approx(8e9 * 16 / 8 * 128 / 130));
  CHECK(pn::PcieBytesPerSecond(4, 8) == Approx(15.75e9).epsilon(1e-3));  // the seed's x8 gen 4
  CHECK(pn::PcieBytesPerSecond(4, 16) == Approx(2 * pn::PcieBytesPerSecond(4, 8)));
  CHECK(pn::PcieBytesPerSecond(6, 16) == Approx(64e9 * 16 / 8 * 242 / 256));
}

TEST_CASE("bump-in-the-wire by hand: in through the mux, restructured at DRAM speed, out") {
  const pn::DrxFabric f = Bare();
  const pn::DrxWorkload w = OneGigabyte();
  const double link = pn::PcieBytesPerSecond(4, 16);
  for (int apps : {1, 7, 15}) {  // nothing a BitW DRX uses is shared
    auto b = pn::DrxLatency(f, w, pn::DrxPlacement::kBumpInTheWire, apps);
    REQUIRE(b.ok());
    CHECK(b->kernels_s == Approx(0.3));
    CHECK(b->movement_s == Approx(1e9 / link + 0.5e9 / link));
    CHECK(b->restructuring_s == Approx(1.5e9 / 25.6e9));
  }
}

TEST_CASE("Multi-Axl by hand: the upstream link and the cores are shared") {
  const pn::DrxFabric f = Bare();
  const pn::DrxWorkload w = OneGigabyte();
  const double link = pn::PcieBytesPerSecond(4, 16), up = pn::PcieBytesPerSecond(4, 8);
  // One application: the x8 upstream link is the narrowest; 4 of the 24 cores restructure.
  auto one = pn::DrxLatency(f, w, pn::DrxPlacement::kMultiAxl, 1);
  REQUIRE(one.ok());
  CHECK(one->movement_s == Approx(1.5e9 / up));
  CHECK(one->restructuring_s == Approx(1e9 * 1e-9 / 4));
  // Twelve: four share each switch's upstream link, and 24 cores give each application 2.
  auto twelve = pn::DrxLatency(f, w, pn::DrxPlacement::kMultiAxl, 12);
  REQUIRE(twelve.ok());
  CHECK(twelve->movement_s == Approx(1.5e9 / (up / 4)));
  CHECK(twelve->restructuring_s == Approx(1e9 * 1e-9 / 2));
  CHECK(link > up);
}

TEST_CASE("hop latencies and overheads add per stage") {
  pn::DrxFabric f = Bare();
  f.switch_hop_s = 1e-6;
  f.mux_hop_s = 1e-7;
  f.stage_overhead_s = 1e-5;
  const pn::DrxWorkload w = OneGigabyte();
  auto bare = pn::DrxLatency(Bare(), w, pn::DrxPlacement::kBumpInTheWire, 1);
  auto real = pn::DrxLatency(f, w, pn::DrxPlacement::kBumpInTheWire, 1);
  REQUIRE(bare.ok());
  REQUIRE(real.ok());
  // In: one mux crossing and one stage; out: two mux crossings, one switch, one stage; the
  // restructuring: one stage.
  CHECK(real->movement_s - bare->movement_s == Approx(3e-7 + 1e-6 + 2e-5));
  CHECK(real->restructuring_s - bare->restructuring_s == Approx(1e-5));
}

TEST_CASE("the seed's placement ordering holds for its five pipelines at 1 to 15 applications") {
  const pn::DrxFabric f;
  const auto workloads = pn::FianchettoWorkloads();
  REQUIRE(workloads.size() == 5);
  for (int apps : {1, 5, 10, 15}) {
    double speedup[5] = {0, 0, 0, 0, 0};
    for (const auto& w : workloads) {
      auto base = pn::DrxLatency(f, w, pn::DrxPlacement::kMultiAxl, apps);
      REQUIRE(base.ok());
      int i = 0;
      for (pn::DrxPlacement p : pn::kDrxPlacements) {
        auto l = pn::DrxLatency(f, w, p, apps);
        REQUIRE(l.ok());
        speedup[i++] += base->total_s() / l->total_s() / workloads.size();
      }
    }
    INFO("apps " << apps);
    CHECK(speedup[0] == Approx(1));
    CHECK(speedup[1] > 1);            // Integrated beats the CPU
    CHECK(speedup[1] <= speedup[2]);  // <= Standalone
    CHECK(speedup[2] <= speedup[3]);  // <= Bump-in-the-Wire
    CHECK(speedup[3] <= speedup[4]);  // <= PCIe-Integrated
  }
}

TEST_CASE("a ring all-reduce that spans switches pays the upstream link on every step") {
  const pn::DrxFabric f = Bare();
  const pn::DrxWorkload w = OneGigabyte();
  const double link = pn::PcieBytesPerSecond(4, 16), up = pn::PcieBytesPerSecond(4, 8);
  auto inside = pn::DrxAllReduce(f, w, 8);   // one switch
  auto across = pn::DrxAllReduce(f, w, 16);  // two
  REQUIRE(inside.ok());
  REQUIRE(across.ok());
  const double front = 1e9 / link + 1.5e9 / 25.6e9;  // in, then the DRX's own restructuring
  const double block8 = 0.5e9 / 8, block16 = 0.5e9 / 16;
  CHECK(inside->fianchetto_s ==
        Approx(front + 7 * (block8 / link + 3 * block8 / 25.6e9) + 7 * block8 / link));
  CHECK(across->fianchetto_s ==
        Approx(front + 15 * (block16 / up + 3 * block16 / 25.6e9) + 15 * block16 / up));
}

TEST_CASE("bad fabrics and workloads are refused with the field named") {
  pn::DrxFabric f;
  f.upstream_lanes = 0;
  auto r = pn::DrxLatency(f, OneGigabyte(), pn::DrxPlacement::kIntegrated, 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("DrxFabric.upstream_lanes") != std::string::npos);
  pn::DrxWorkload w = OneGigabyte();
  w.input_bytes = -1;
  r = pn::DrxLatency(pn::DrxFabric{}, w, pn::DrxPlacement::kIntegrated, 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("DrxWorkload.input_bytes") != std::string::npos);
  r = pn::DrxLatency(pn::DrxFabric{}, OneGigabyte(), pn::DrxPlacement::kIntegrated, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("apps") != std::string::npos);
  CHECK_FALSE(pn::DrxBroadcast(pn::DrxFabric{}, OneGigabyte(), 1).ok());
}
