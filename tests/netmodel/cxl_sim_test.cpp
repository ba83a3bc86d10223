// The CXL flit-level simulator on the seed's k = 4 fat-tree: latencies derived by hand from the
// calibration, a congested link's pause count by hand, the two-signal rate controller in the
// loop, determinism for a seed, and Aurelia's congestion control against vanilla CXL.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "plexus/netmodel/cxl_sim.hpp"

namespace cxl = plexus::netmodel::cxl;
using Cause = plexus::netmodel::TwoSignalRateController::Cause;

namespace {

cxl::FanId Id(const char* text) { return cxl::ParseFanId(text).value(); }

cxl::Transfer Make(const char* src, const char* dst, int64_t bytes, cxl::Op op = cxl::Op::kWrite) {
  cxl::Transfer t;
  t.src = Id(src);
  t.dst = Id(dst);
  t.bytes = bytes;
  t.op = op;
  return t;
}

const cxl::Fabric& K4() {
  static const cxl::Fabric f = cxl::Fabric::FatTree(4).value();
  return f;
}

// Every device outside pod 0 writes `bytes` to 0:0:2: 12-to-1 across the core.
std::vector<cxl::Transfer> Incast(int64_t bytes) {
  std::vector<cxl::Transfer> t;
  for (int pod = 1; pod < 4; ++pod) {
    for (int sw = 0; sw < 2; ++sw) {
      for (int dev = 2; dev < 4; ++dev) {
        const std::string src = cxl::FormatFanId({pod, sw, dev});
        t.push_back(Make(src.c_str(), "0:0:2", bytes));
      }
    }
  }
  return t;
}

}  // namespace

TEST_CASE("cxl sim: one-flit latencies match the calibration by hand", "[netmodel][cxl]") {
  // One flit of a 64 B write. Per link: 1 ns serialization (256 B at 256 GB/s) + 11.5 ns wire
  // + one 20 ns retimer = 32.5 ns; per switch 70 ns; the device port 67.5 ns at each end.
  //   one switch (0:0:2 -> 0:0:3): 2 x 67.5 + 2 x 32.5 + 70            = 270 ns (Pond's figure)
  //   three switches, same pod:     2 x 67.5 + 4 x 32.5 + 3 x 70        = 475 ns
  //   five switches, across pods:   2 x 67.5 + 6 x 32.5 + 5 x 70        = 680 ns (Aurelia's)
  // The write completes when its NDR (one flit) is processed back at the writer: one-way there,
  // 1 ns of processing at the receiver (line rate), one-way back, 1 ns at the writer.
  const std::vector<std::pair<const char*, double>> cases = {
      {"0:0:3", 270}, {"0:1:2", 475}, {"1:0:2", 680}};
  for (const auto& [dst, one_way] : cases) {
    INFO(dst);
    auto r = cxl::Simulate(K4(), {Make("0:0:2", dst, 64)}, {});
    REQUIRE(r.ok());
    CHECK(r->one_way_max_ns == Approx(one_way));
    CHECK(r->finish_ns[0] == Approx(2 * one_way + 2));
    CHECK(r->latency_p50_ns == Approx(2 * one_way + 2));
    CHECK(r->pauses == 0);
    // Request out, response back: 1 flit per link of the path each way.
    CHECK(r->flits == 2 * (one_way == 270 ? 2 : one_way == 475 ? 4 : 6));
  }
  // A read's request is one flit; its data (1 cache line) come back in one DRS flit.
  auto read = cxl::Simulate(K4(), {Make("0:0:2", "1:0:2", 64, cxl::Op::kRead)}, {});
  REQUIRE(read.ok());
  CHECK(read->finish_ns[0] == Approx(2 * 680 + 2));
  // Two retimers per link (1 m cables) add 20 ns per link: 6 more ns x 20 across pods.
  cxl::SimOptions far;
  far.link.retimers = 2;
  auto r = cxl::Simulate(K4(), {Make("0:0:2", "1:0:2", 64)}, far);
  REQUIRE(r.ok());
  CHECK(r->one_way_max_ns == Approx(680 + 6 * 20));
}

TEST_CASE("cxl sim: a slow receiver's link pauses once per flit beyond its credits",
          "[netmodel][cxl]") {
  // 40 flits (3 cache lines each) from 0:0:2 to 0:0:3 through switch 0:0:1; 8 credits per VC;
  // the receiver processes a flit in 100 ns (2.56 GB/s). By hand, on the switch's egress to
  // 0:0:3: flits 1-8 leave at 170-177 ns on the 8 credits. Flit 9 reaches the switch at
  // 371.5 ns (the writer's credit for flit 1 came back at 201.5, + 170 to the switch) and finds
  // no credit: pause 1. The receiver frees a slot every 100 ns from 370 ns (270 + 100), each
  // credit back 31.5 ns later; each one sends one flit and, with more queued (the switch's
  // 8-flit buffer refills 201.5 ns after a slot frees, 100 ns per drained flit), the link
  // pauses again, until the 40th flit leaves with nothing behind it. Pauses: 40 - 8 = 32.
  cxl::SimOptions o;
  o.link.credits_per_vc = 8;
  o.device_rates = {{Id("0:0:3"), 2.56e9}};
  auto r = cxl::Simulate(K4(), {Make("0:0:2", "0:0:3", 40 * 192)}, o);
  REQUIRE(r.ok());
  const int egress = K4().LinkOf(K4().NodeOf(Id("0:0:1")).value(), 1);
  CHECK(r->links[egress].flits == 40);
  CHECK(r->links[egress].pauses == 32);
  // Each pause lasts until the next credit: 32 pauses over 100 ns credit spacing, less the
  // 1 ns each flit takes: the first from 371.5 to 401.5 (30 ns), then 99 ns each.
  CHECK(r->links[egress].paused_ns == Approx(30 + 31 * 99));
  CHECK(r->switch_pauses >= 32);
  // The receiver's pace sets the finish: the 40th flit is processed at 270 + 40 x 100 ns.
  CHECK(r->finish_ns[0] > 4270);
}

TEST_CASE("cxl sim: senders run the two-signal controller, cut and recovery as specified",
          "[netmodel][cxl]") {
  cxl::SimOptions o;
  o.cc.enabled = true;
  o.trace_rates = true;
  auto r = cxl::Simulate(K4(), Incast(128 << 10), o);
  REQUIRE(r.ok());
  REQUIRE(r->congestion_cuts > 0);
  CHECK(r->overload_cuts == 0);  // the receiver keeps up at line rate
  // Replay every flow's trace on a fresh controller: each cut and each step must match, cuts
  // at least one tick apart, steps exactly one tick after the cut or the previous step.
  std::map<std::pair<int, int>, std::vector<cxl::RateChange>> by_flow;
  for (const auto& c : r->rate_trace) by_flow[{c.src.value(), c.dst.value()}].push_back(c);
  REQUIRE(by_flow.size() == 12);
  int steps_checked = 0;
  for (const auto& [flow, trace] : by_flow) {
    auto replay = plexus::netmodel::TwoSignalRateController::Create(o.cc.rate).value();
    double last = -1;
    double last_cut = -1e18;
    for (const auto& c : trace) {
      if (c.cut) {
        CHECK(c.t_ns - last_cut >= o.cc.tick_ns);
        c.cause == Cause::kOverload ? replay.OnOverload() : replay.OnCongestion();
        last_cut = c.t_ns;
      } else {
        replay.Tick();
        CHECK(c.t_ns == Approx(last + o.cc.tick_ns));
        ++steps_checked;
      }
      CHECK(c.factor == replay.factor());
      last = c.t_ns;
    }
    // The first signal halves the line rate.
    REQUIRE(trace.front().cut);
    CHECK(trace.front().factor == 0.5);
  }
  CHECK(steps_checked > 0);

  // A receiver at a quarter of line rate with one writer: its backlog sets OVERLOAD, and the
  // writer recovers additively (1/8 a tick) after an overload cut.
  cxl::SimOptions slow = o;
  slow.device_rates = {{Id("0:0:3"), 64e9}};
  slow.cc.epn = false;
  auto s = cxl::Simulate(K4(), {Make("0:0:2", "0:0:3", 256 << 10)}, slow);
  REQUIRE(s.ok());
  CHECK(s->overload_cuts > 0);
  CHECK(s->congestion_cuts == 0);
  CHECK(s->epn_marked == 0);
  const auto& t = s->rate_trace;
  REQUIRE(t.size() >= 2);
  CHECK(t[0].cut);
  CHECK(t[0].cause == Cause::kOverload);
  CHECK(t[0].factor == 0.5);
  if (!t[1].cut) CHECK(t[1].factor == Approx(0.625));
}

TEST_CASE("cxl sim: a run is determined by its seed", "[netmodel][cxl]") {
  for (auto policy : {cxl::RoutingPolicy::kSpray, cxl::RoutingPolicy::kAdaptive}) {
    cxl::SimOptions o;
    o.routing = policy;
    o.cc.enabled = true;
    o.seed = 11;
    const auto t = Incast(64 << 10);
    auto a = cxl::Simulate(K4(), t, o);
    auto b = cxl::Simulate(K4(), t, o);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->finish_ns == b->finish_ns);
    CHECK(a->pauses == b->pauses);
    CHECK(a->events == b->events);
    CHECK(a->epn_marked == b->epn_marked);
    for (size_t l = 0; l < a->links.size(); ++l) CHECK(a->links[l].flits == b->links[l].flits);
  }
}

TEST_CASE("cxl sim: congestion control pauses links less than vanilla CXL on an incast",
          "[netmodel][cxl]") {
  // 1 MB each: more than the fabric's buffers hold (256 flits per link and VC), so that the
  // senders are still sending when the first marked responses come back.
  const auto t = Incast(1 << 20);
  cxl::SimOptions vanilla;
  auto v = cxl::Simulate(K4(), t, vanilla);
  cxl::SimOptions aurelia;
  aurelia.cc.enabled = true;
  auto a = cxl::Simulate(K4(), t, aurelia);
  REQUIRE(v.ok());
  REQUIRE(a.ok());
  INFO("vanilla pauses " << v->pauses << ", with CC " << a->pauses);
  CHECK(v->epn_marked == 0);
  CHECK(v->congestion_cuts == 0);
  CHECK(v->switch_pauses > 0);
  CHECK(a->epn_marked > 0);
  CHECK(a->congestion_cuts > 0);
  CHECK(a->pauses * 3 < v->pauses * 2);  // at least 1.5x fewer
  // The bottleneck (the edge's link to 0:0:2) carries the same flits either way.
  const int sink = K4().LinkOf(K4().NodeOf(Id("0:0:1")).value(), 0);
  CHECK(a->links[sink].flits == v->links[sink].flits);
  CHECK(v->events > 0);
  CHECK(v->events_per_s > 0);
}

TEST_CASE("cxl sim: bad transfers and options are refused by name", "[netmodel][cxl]") {
  const auto msg = [](const absl::StatusOr<cxl::SimResult>& r) {
    REQUIRE_FALSE(r.ok());
    return std::string(r.status().message());
  };
  CHECK(msg(cxl::Simulate(K4(), {Make("0:0:2", "0:0:1", 64)}, {})).find("0:0:1 is not a device") !=
        std::string::npos);
  CHECK(msg(cxl::Simulate(K4(), {Make("0:0:2", "0:0:3", 0)}, {})).find("transfer 0") !=
        std::string::npos);
  auto dep = Make("0:0:2", "0:0:3", 64);
  dep.after = {1};
  CHECK(msg(cxl::Simulate(K4(), {dep}, {})).find("not an earlier transfer") != std::string::npos);
  cxl::SimOptions o;
  o.link.credits_per_vc = 0;
  CHECK(msg(cxl::Simulate(K4(), {}, o)).find("credits_per_vc") != std::string::npos);
  o = {};
  o.cc.rate.cut_factor = 2;
  CHECK(msg(cxl::Simulate(K4(), {}, o)).find("cut_factor") != std::string::npos);
  // A transfer that cannot finish in the time allowed.
  o = {};
  o.max_time_ns = 100;
  CHECK(msg(cxl::Simulate(K4(), {Make("0:0:2", "0:0:3", 64)}, o)).find("max_time_ns") !=
        std::string::npos);
}

TEST_CASE("cxl sim: dependencies start a transfer after its predecessors plus the gap",
          "[netmodel][cxl]") {
  auto second = Make("0:0:3", "0:0:2", 64);
  second.after = {0};
  second.gap_ns = 1000;
  auto r = cxl::Simulate(K4(), {Make("0:0:2", "0:0:3", 64), second}, {});
  REQUIRE(r.ok());
  CHECK(r->finish_ns[0] == Approx(542));
  CHECK(r->finish_ns[1] == Approx(542 + 1000 + 542));
  CHECK(r->makespan_ns == Approx(2084));
}

TEST_CASE("cxl sim: multipath policies spread what the single route piles on one uplink",
          "[netmodel][cxl]") {
  // 0:0:2 -> 1:0:2 and 0:0:3 -> 1:1:2 both end in device field 2, so edge 0:0:1's suffix table
  // sends both up port 2 (to 0:2:1) under port-ID routing: two line-rate flows share one link
  // while the other uplink idles. Spraying and adaptive routing use both uplinks.
  const std::vector<cxl::Transfer> t = {Make("0:0:2", "1:0:2", 1 << 20),
                                        Make("0:0:3", "1:1:2", 1 << 20)};
  std::map<cxl::RoutingPolicy, double> makespan;
  for (auto policy : {cxl::RoutingPolicy::kPortId, cxl::RoutingPolicy::kTwoLevel,
                      cxl::RoutingPolicy::kSpray, cxl::RoutingPolicy::kAdaptive}) {
    cxl::SimOptions o;
    o.routing = policy;
    auto r = cxl::Simulate(K4(), t, o);
    REQUIRE(r.ok());
    makespan[policy] = r->makespan_ns;
    const int up0 = K4().LinkOf(K4().NodeOf(Id("0:0:1")).value(), 2);
    const int up1 = K4().LinkOf(K4().NodeOf(Id("0:0:1")).value(), 3);
    INFO(cxl::RoutingPolicyName(policy));
    if (policy == cxl::RoutingPolicy::kPortId || policy == cxl::RoutingPolicy::kTwoLevel) {
      CHECK(r->links[up1].flits == 0);
    } else {
      CHECK(r->links[up1].flits > r->links[up0].flits / 2);
    }
  }
  // 2 MB through one 256 GB/s uplink vs 1 MB through each of two.
  CHECK(makespan[cxl::RoutingPolicy::kTwoLevel] == makespan[cxl::RoutingPolicy::kPortId]);
  CHECK(makespan[cxl::RoutingPolicy::kSpray] < 0.75 * makespan[cxl::RoutingPolicy::kPortId]);
  CHECK(makespan[cxl::RoutingPolicy::kAdaptive] < 0.75 * makespan[cxl::RoutingPolicy::kPortId]);
}

TEST_CASE("cxl sim: the fabric manager moves a flow to the idle uplink mid-run",
          "[netmodel][cxl]") {
  // The collision above under port-ID routing; 2 us in, the fabric manager sends 1:1:2's
  // traffic up edge 0:0:1's port 3: the rest of that flow takes the idle uplink.
  const std::vector<cxl::Transfer> t = {Make("0:0:2", "1:0:2", 1 << 20),
                                        Make("0:0:3", "1:1:2", 1 << 20)};
  auto before = cxl::Simulate(K4(), t, {});
  cxl::SimOptions o;
  o.route_changes = {{.t_ns = 2000, .sw = Id("0:0:1"), .dst = Id("1:1:2"), .ports = {3}}};
  auto after = cxl::Simulate(K4(), t, o);
  REQUIRE(before.ok());
  REQUIRE(after.ok());
  const int up1 = K4().LinkOf(K4().NodeOf(Id("0:0:1")).value(), 3);
  CHECK(before->links[up1].flits == 0);
  CHECK(after->links[up1].flits > 0);
  CHECK(after->makespan_ns < 0.75 * before->makespan_ns);
  // The caller's fabric is untouched.
  CHECK(K4().ManagerRoute(K4().NodeOf(Id("0:0:1")).value(), Id("1:1:2")) == nullptr);
  // A change the fabric manager refuses ends the run, naming it.
  o.route_changes[0].ports = {7};
  auto bad = cxl::Simulate(K4(), t, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("route_changes[0]") != std::string::npos);
}

TEST_CASE("cxl sim: a device with one tag sends a request packet per round trip",
          "[netmodel][cxl]") {
  // 10 packets of 4 flits (12 writes of 64 B each) through one switch. With one tag each packet
  // waits for the previous one's completion: 4 flits out (4 ns), 270 ns one way, 1 ns at the
  // receiver per flit, the NDR back (270 ns) and 1 ns processed, about 550 ns per packet.
  const std::vector<cxl::Transfer> t = {Make("0:0:2", "0:0:3", 10 * 12 * 64)};
  cxl::SimOptions o;
  const auto free_run = cxl::Simulate(K4(), t, o).value();
  o.max_outstanding_packets = 1;
  const auto one_tag = cxl::Simulate(K4(), t, o).value();
  CHECK(free_run.makespan_ns < 600);
  CHECK(one_tag.makespan_ns > 10 * 540);
  CHECK(one_tag.makespan_ns < 10 * 560);
  CHECK(one_tag.pauses == 0);  // out of tags is not out of credits
  o.max_outstanding_packets = -1;
  CHECK(cxl::Simulate(K4(), t, o).status().message().find("max_outstanding_packets") !=
        std::string::npos);
}

TEST_CASE("cxl sim: an input FIFO blocks a flow behind flits for a slow receiver",
          "[netmodel][cxl]") {
  // 0:0:2 writes 256 KB to 0:0:3, a receiver at 1/8 of line rate, and from 3 us on 64 KB to
  // 0:1:2 (another edge switch, free). Both enter edge 0:0:1 on one link and VC. By then the
  // slow receiver's buffer (256 flits) is full and the switch holds the slow flow's flits. Alone,
  // the free flow would take about 0.5 us (342 flits plus a round trip). With virtual output
  // queues it is slowed already: the slow flits hold most of the input link's 256 credits. With
  // one FIFO per input link it also waits behind them, and they leave at the receiver's pace.
  std::vector<cxl::Transfer> t = {Make("0:0:2", "0:0:3", 256 << 10),
                                  Make("0:0:2", "0:1:2", 64 << 10)};
  t[1].start_ns = 3000;
  cxl::SimOptions o;
  o.device_rates = {{Id("0:0:3"), 32e9}};
  const auto voq = cxl::Simulate(K4(), t, o).value();
  o.input_fifo = true;
  const auto fifo = cxl::Simulate(K4(), t, o).value();
  CHECK(voq.finish_ns[1] - 3000 > 1000);
  CHECK(fifo.finish_ns[1] - 3000 > 1.3 * (voq.finish_ns[1] - 3000));
  // The slow flow is bound by its receiver either way (256 KB at 32 GB/s: 8 us and more).
  CHECK(fifo.finish_ns[0] > 8000);
  CHECK(fifo.finish_ns[0] < 1.2 * voq.finish_ns[0]);
}

TEST_CASE("cxl sim: one credit pool per protocol holds a read's requests behind write data",
          "[netmodel][cxl]") {
  // 0:0:2 writes 256 KB to 0:0:3, a receiver at 1/8 of line rate, and from 3 us on reads 64 KB
  // from 0:1:2. The write data fills the edge switch's buffer for the slow receiver, and so holds
  // the credits of the writer's uplink. Per message class the read requests have their own VC
  // on that uplink and pass; with CXL.mem's classes in one pool (the seed's "flow control for
  // packets of each CXL protocol") they wait for credits the write data holds.
  std::vector<cxl::Transfer> t = {Make("0:0:2", "0:0:3", 256 << 10),
                                  Make("0:0:2", "0:1:2", 64 << 10, cxl::Op::kRead)};
  t[1].start_ns = 3000;
  cxl::SimOptions o;
  o.device_rates = {{Id("0:0:3"), 32e9}};
  const auto per_class = cxl::Simulate(K4(), t, o).value();
  o.credit_pools = cxl::CreditPools::kPerProtocol;
  const auto per_protocol = cxl::Simulate(K4(), t, o).value();
  INFO("read done after " << per_class.finish_ns[1] - 3000 << " ns per class, "
                          << per_protocol.finish_ns[1] - 3000 << " ns per protocol");
  CHECK(per_protocol.finish_ns[1] - 3000 > 2 * (per_class.finish_ns[1] - 3000));
  CHECK(per_protocol.pauses > per_class.pauses);
  // The write is bound by its receiver either way.
  CHECK(per_protocol.finish_ns[0] > 8000);
  CHECK(per_protocol.finish_ns[0] < 1.2 * per_class.finish_ns[0]);
}

TEST_CASE("cxl sim: credits returned every update period bound a link to its credits per period",
          "[netmodel][cxl]") {
  // 0:0:2 writes 1 MiB to 0:0:3 with 8 credits per link and VC. Credits returned flit by flit
  // come back one round trip (a few hundred ns) after use; returned together every 1 us, a link
  // sends at most 8 flits per microsecond: 1 MiB of 64-byte messages, three to a flit (a header
  // slot and four data slots each, of 15), is 5,462 flits: at least 682 us.
  std::vector<cxl::Transfer> t = {Make("0:0:2", "0:0:3", 1 << 20)};
  cxl::SimOptions o;
  o.link.credits_per_vc = 8;
  const auto each = cxl::Simulate(K4(), t, o).value();
  o.link.credit_update_ns = 1000;
  const auto batched = cxl::Simulate(K4(), t, o).value();
  INFO("finish " << each.finish_ns[0] << " ns flit by flit, " << batched.finish_ns[0]
                 << " ns every 1 us");
  CHECK(batched.finish_ns[0] > 682000);
  CHECK(batched.finish_ns[0] < 684000);
  CHECK(each.finish_ns[0] < 0.5 * batched.finish_ns[0]);
  o.link.credit_update_ns = -1;
  CHECK_FALSE(cxl::Simulate(K4(), t, o).ok());
}
