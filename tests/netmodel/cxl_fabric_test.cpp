// The CXL fabric's addressing and routing on the seed's k = 4 fat-tree (Figure 4.4): FAN-IDs,
// the two-level tables of switch 2:2:1, the baseline's single route, ECMP and spraying over the
// core, adaptive choices and the fabric manager's routes.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "plexus/netmodel/cxl_fabric.hpp"

namespace cxl = plexus::netmodel::cxl;

namespace {

cxl::FanId Id(const char* text) {
  auto id = cxl::ParseFanId(text);
  REQUIRE(id.ok());
  return *id;
}

std::string Name(const cxl::Fabric& f, int node) { return cxl::FormatFanId(f.node(node).id); }

std::vector<std::string> Names(const cxl::Fabric& f, const std::vector<int>& path) {
  std::vector<std::string> out;
  for (int n : path) out.push_back(Name(f, n));
  return out;
}

// The core switch a path crosses ("" when it stays in a pod).
std::string CoreOf(const cxl::Fabric& f, const std::vector<int>& path) {
  for (int n : path) {
    if (f.node(n).kind == cxl::NodeKind::kCore) return Name(f, n);
  }
  return "";
}

}  // namespace

TEST_CASE("cxl fabric: FAN-IDs parse, format and pack into 12 bits", "[netmodel][cxl]") {
  const cxl::FanId cpu = Id("2:0:2");
  CHECK(cpu.pod == 2);
  CHECK(cpu.sw == 0);
  CHECK(cpu.device == 2);
  CHECK(cpu.value() == 0x202);
  CHECK(cxl::FormatFanId(cxl::FanId::FromValue(0xa3f)) == "a:3:f");
  CHECK(Id("A:3:F") == cxl::FanId{10, 3, 15});
  for (const char* bad : {"2:0", "2:0:g", "20:0:2", "2-0-2", ""}) {
    const auto parsed = cxl::ParseFanId(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(std::string(parsed.status().message()).find("pod:switch:device") != std::string::npos);
  }
  CHECK_FALSE(cxl::Fabric::FatTree(5).ok());
  CHECK_FALSE(cxl::Fabric::FatTree(16).ok());
}

TEST_CASE("cxl fabric: the k = 4 fat-tree and its two-level tables", "[netmodel][cxl]") {
  auto f = cxl::Fabric::FatTree(4);
  REQUIRE(f.ok());
  CHECK(f->devices().size() == 16);  // the seed's 16 nodes
  CHECK(f->nodes() == 16 + 20);
  // The seed's CPU 2:0:2 hangs off edge switch 2:0:1, port 0.
  auto cpu = f->NodeOf(Id("2:0:2"));
  REQUIRE(cpu.ok());
  CHECK(Name(*f, f->node(*cpu).ports[0].peer) == "2:0:1");
  CHECK(f->node(*cpu).ports[0].peer_port == 0);
  CHECK_FALSE(f->NodeOf(Id("2:0:4")).ok());

  // Switch 2:2:1 (Figure 4.4): the prefix table sends pod 2's switches down to 2:0:1 and
  // 2:1:1, the suffix table sends the rest up to cores 4:1:1 and 4:1:2 by device field.
  const int agg = f->NodeOf(Id("2:2:1")).value();
  REQUIRE(f->prefix_table(agg).size() == 2);
  REQUIRE(f->suffix_table(agg).size() == 2);
  const auto via = [&](int sw, const char* dst) {
    auto port = f->TwoLevelPort(sw, Id(dst));
    REQUIRE(port.ok());
    return Name(*f, f->node(sw).ports[*port].peer);
  };
  CHECK(via(agg, "2:0:2") == "2:0:1");
  CHECK(via(agg, "2:1:3") == "2:1:1");
  CHECK(via(agg, "0:0:2") == "4:1:1");  // suffix 2
  CHECK(via(agg, "3:1:3") == "4:1:2");  // suffix 3
  // Edge 2:0:1: its own devices by whole-ID prefix; the rest up by suffix, rotated by switch.
  const int edge = f->NodeOf(Id("2:0:1")).value();
  CHECK(via(edge, "2:0:3") == "2:0:3");
  CHECK(via(edge, "0:0:2") == "2:2:1");
  CHECK(via(edge, "0:0:3") == "2:3:1");
  const int edge1 = f->NodeOf(Id("2:1:1")).value();
  CHECK(via(edge1, "0:0:2") == "2:3:1");
  // A core sends by pod prefix.
  CHECK(via(f->NodeOf(Id("4:2:1")).value(), "1:1:3") == "1:3:1");
  // The baseline's port-ID table holds the same choice, one entry per device.
  CHECK(f->PortIdPort(agg, Id("0:0:2")) == f->TwoLevelPort(agg, Id("0:0:2")).value());
  CHECK(f->PortIdPort(agg, Id("4:1:1")) == -1);  // switches are not addressable under PBR

  std::mt19937_64 rng(1);
  auto walk = f->Walk({Id("2:0:2"), Id("0:1:3")}, cxl::RoutingPolicy::kPortId, 1, rng);
  REQUIRE(walk.ok());
  CHECK(Names(*f, *walk) ==
        std::vector<std::string>{"2:0:2", "2:0:1", "2:3:1", "4:2:1", "0:3:1", "0:1:1", "0:1:3"});
}

TEST_CASE("cxl fabric: the baseline takes one route, ECMP and spraying spread over the core",
          "[netmodel][cxl]") {
  auto f = cxl::Fabric::FatTree(4);
  REQUIRE(f.ok());
  std::mt19937_64 rng(7);
  const std::vector<std::string> pod0 = {"0:0:2", "0:0:3", "0:1:2", "0:1:3"};
  const std::vector<std::string> pod1 = {"1:0:2", "1:0:3", "1:1:2", "1:1:3"};
  std::map<std::string, int> ecmp_cores;
  for (const auto& s : pod0) {
    for (const auto& d : pod1) {
      std::set<std::string> baseline_paths;
      for (int c = 0; c < cxl::kMessageClasses; ++c) {
        const auto cls = static_cast<cxl::MessageClass>(c);
        const cxl::FlowKey flow{Id(s.c_str()), Id(d.c_str()), cxl::ProtocolOf(cls), cls};
        for (int packet = 0; packet < 4; ++packet) {
          auto base = f->Walk(flow, cxl::RoutingPolicy::kPortId, 1, rng);
          REQUIRE(base.ok());
          baseline_paths.insert(CoreOf(*f, *base));
        }
        auto ecmp = f->Walk(flow, cxl::RoutingPolicy::kEcmp, 1, rng);
        REQUIRE(ecmp.ok());
        ++ecmp_cores[CoreOf(*f, *ecmp)];
        // Per flow: every packet of one flow takes the flow's path.
        CHECK(f->Walk(flow, cxl::RoutingPolicy::kEcmp, 1, rng).value() == *ecmp);
      }
      CHECK(baseline_paths.size() == 1);  // one route per device pair, whatever the class
    }
  }
  // 80 flows from pod 0 to pod 1 over the 4 cores: every core carries some, none most.
  REQUIRE(ecmp_cores.size() == 4);
  for (const auto& [core, flows] : ecmp_cores) {
    INFO(core);
    CHECK(flows >= 10);
    CHECK(flows <= 30);
  }
  // Spraying: the packets of one flow cross every core.
  const cxl::FlowKey one{Id("0:0:2"), Id("1:0:2")};
  std::set<std::string> sprayed;
  for (int packet = 0; packet < 64; ++packet) {
    sprayed.insert(CoreOf(*f, f->Walk(one, cxl::RoutingPolicy::kSpray, 1, rng).value()));
  }
  CHECK(sprayed.size() == 4);
}

TEST_CASE("cxl fabric: adaptive picks the less backpressured of two ports", "[netmodel][cxl]") {
  auto f = cxl::Fabric::FatTree(4);
  REQUIRE(f.ok());
  const int edge = f->NodeOf(Id("0:0:1")).value();
  const cxl::FlowKey flow{Id("0:0:2"), Id("3:1:2")};
  std::mt19937_64 rng(3);
  std::vector<int> levels(4, 0);
  levels[2] = 3;  // the suffix table's port (2:2:1 direction) is backpressured
  for (int i = 0; i < 50; ++i) {
    CHECK(f->SelectPort(edge, flow, cxl::RoutingPolicy::kAdaptive, 1, rng, levels) == 3);
  }
  levels[2] = 0;
  levels[3] = 2;
  for (int i = 0; i < 50; ++i) {
    CHECK(f->SelectPort(edge, flow, cxl::RoutingPolicy::kAdaptive, 1, rng, levels) == 2);
  }
  // Downward there is one port whatever the levels.
  levels = {3, 3, 0, 0};
  CHECK(f->SelectPort(edge, {Id("3:1:2"), Id("0:0:3")}, cxl::RoutingPolicy::kAdaptive, 1, rng,
                      levels) == 1);
}

TEST_CASE("cxl fabric: the fabric manager's routes override every policy", "[netmodel][cxl]") {
  auto f = cxl::Fabric::FatTree(4);
  REQUIRE(f.ok());
  std::mt19937_64 rng(1);
  const cxl::FlowKey flow{Id("2:0:2"), Id("0:0:2")};
  CHECK(f->Walk(flow, cxl::RoutingPolicy::kPortId, 1, rng).value()[2] ==
        f->NodeOf(Id("2:2:1")).value());
  REQUIRE(f->InsertRoute(Id("2:0:1"), Id("0:0:2"), {3}).ok());
  for (auto policy : {cxl::RoutingPolicy::kPortId, cxl::RoutingPolicy::kTwoLevel,
                      cxl::RoutingPolicy::kEcmp, cxl::RoutingPolicy::kSpray}) {
    auto walk = f->Walk(flow, policy, 1, rng);
    REQUIRE(walk.ok());
    CHECK(Name(*f, (*walk)[2]) == "2:3:1");
    CHECK(Name(*f, walk->back()) == "0:0:2");
  }
  REQUIRE(f->RemoveRoute(Id("2:0:1"), Id("0:0:2")).ok());
  CHECK(Name(*f, f->Walk(flow, cxl::RoutingPolicy::kPortId, 1, rng).value()[2]) == "2:2:1");
  CHECK(absl::IsNotFound(f->RemoveRoute(Id("2:0:1"), Id("0:0:2"))));
  const auto bad_node = f->InsertRoute(Id("2:0:2"), Id("0:0:2"), {0});
  CHECK(std::string(bad_node.message()).find("2:0:2 is not a switch") != std::string::npos);
  CHECK(absl::IsInvalidArgument(f->InsertRoute(Id("2:0:1"), Id("0:0:2"), {4})));
  CHECK(absl::IsInvalidArgument(f->InsertRoute(Id("2:0:1"), Id("0:0:2"), {})));
  // Routes that bounce traffic between 2:0:1 and 2:2:1 loop: the walk says so.
  REQUIRE(f->InsertRoute(Id("2:0:1"), Id("0:0:2"), {2}).ok());
  REQUIRE(f->InsertRoute(Id("2:2:1"), Id("0:0:2"), {0}).ok());
  const auto looped = f->Walk(flow, cxl::RoutingPolicy::kPortId, 1, rng);
  REQUIRE(absl::IsInternal(looped.status()));
  CHECK(std::string(looped.status().message()).find("loops") != std::string::npos);
  CHECK(cxl::ParseRoutingPolicy("Spray").value() == cxl::RoutingPolicy::kSpray);
  CHECK(cxl::RoutingPolicyName(cxl::RoutingPolicy::kPortId) == "port_id");
  CHECK(absl::IsInvalidArgument(cxl::ParseRoutingPolicy("random").status()));
}
