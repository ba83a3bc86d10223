// The two-signal rate controller with non-default options: the exact cut and recovery sequences
// of each signal, the floor, and refused options.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "plexus/netmodel/rate_controller.hpp"

namespace nm = plexus::netmodel;
using Cause = nm::TwoSignalRateController::Cause;

namespace {

nm::TwoSignalRateController Make() {
  auto made = nm::TwoSignalRateController::Create({.cut_factor = 0.75,
                                                   .min_factor = 0.25,
                                                   .congestion_recovery_steps = 3,
                                                   .additive_step = 0.0625});
  REQUIRE(made.ok());
  return *made;
}

std::vector<double> TickTrace(nm::TwoSignalRateController& r, int ticks) {
  std::vector<double> out;
  for (int i = 0; i < ticks; ++i) {
    r.Tick();
    out.push_back(r.factor());
  }
  return out;
}

}  // namespace

TEST_CASE("rate controller: congestion cuts by the factor, returns to the target in N steps",
          "[netmodel][rate]") {
  auto r = Make();
  r.OnCongestion();
  CHECK(r.factor() == 0.75);  // 1 x 0.75
  CHECK(r.target() == 1.0);
  CHECK(r.cause() == Cause::kCongestion);
  // Steps of (1 - 0.75) / 3; the third lands on the target exactly.
  const auto trace = TickTrace(r, 3);
  CHECK(trace[0] == Approx(0.75 + 0.25 / 3));
  CHECK(trace[1] == Approx(0.75 + 0.5 / 3));
  CHECK(trace[2] == 1.0);
  CHECK(r.cause() == Cause::kNone);
  r.Tick();  // nothing to recover
  CHECK(r.factor() == 1.0);
}

TEST_CASE("rate controller: a second congestion cut remembers the cut rate, then probes additively",
          "[netmodel][rate]") {
  auto r = Make();
  r.OnCongestion();  // 1 -> 0.75
  r.OnCongestion();  // target 0.75, 0.75 x 0.75 = 0.5625, steps of 0.0625
  CHECK(r.factor() == 0.5625);
  CHECK(r.target() == 0.75);
  CHECK(TickTrace(r, 3) == std::vector<double>{0.625, 0.6875, 0.75});
  // Back at the target below full speed: additive steps of 0.0625 up to 1.
  CHECK(r.cause() == Cause::kOverload);
  CHECK(TickTrace(r, 5) == std::vector<double>{0.8125, 0.875, 0.9375, 1.0, 1.0});
  CHECK(r.cause() == Cause::kNone);
}

TEST_CASE("rate controller: overload cuts by the factor and recovers additively",
          "[netmodel][rate]") {
  auto r = Make();
  r.OnOverload();
  CHECK(r.factor() == 0.75);
  CHECK(r.target() == 1.0);
  CHECK(r.cause() == Cause::kOverload);
  CHECK(TickTrace(r, 4) == std::vector<double>{0.8125, 0.875, 0.9375, 1.0});
  CHECK(r.cause() == Cause::kNone);
  // Cuts compound down to the floor and stop there.
  std::vector<double> cuts;
  for (int i = 0; i < 6; ++i) {
    r.OnOverload();
    cuts.push_back(r.factor());
  }
  CHECK(cuts == std::vector<double>{0.75, 0.5625, 0.421875, 0.31640625, 0.25, 0.25});
}

TEST_CASE("rate controller: refused options name the field", "[netmodel][rate]") {
  const auto bad = [](nm::RateControllerOptions o, const std::string& field) {
    const auto made = nm::TwoSignalRateController::Create(o);
    REQUIRE_FALSE(made.ok());
    CHECK(std::string(made.status().message()).find(field) != std::string::npos);
  };
  bad({.cut_factor = 1.0}, "cut_factor");
  bad({.min_factor = 0}, "min_factor");
  bad({.congestion_recovery_steps = 0}, "congestion_recovery_steps");
  bad({.additive_step = 1.5}, "additive_step");
  // The defaults are multipath's: halve, floor 1/8, 4 steps, 1/8 a step.
  const nm::TwoSignalRateController d;
  CHECK(d.options().cut_factor == 0.5);
  CHECK(d.options().min_factor == 0.125);
  CHECK(d.options().congestion_recovery_steps == 4);
  CHECK(d.options().additive_step == 0.125);
}
