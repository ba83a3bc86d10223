// A CXL fabric after Aurelia (seed 003, ch. 4.3): FAN-ID addressing of devices and switches,
// Al-Fares' two-level prefix/suffix routing tables on a k-ary fat-tree, the specification's
// port-ID-based routing as the baseline, and multipath policies (per-flow ECMP, per-packet
// spraying, adaptive power-of-two choices over possibly stale egress backpressure). The
// fabric manager may insert or override routes at any time. The flit-level simulator that runs
// traffic over it is plexus/netmodel/cxl_sim.hpp.
//
//   auto fabric = cxl::Fabric::FatTree(4);            // 16 devices, 20 switches
//   auto cpu = cxl::ParseFanId("2:0:2");               // pod 2, edge switch 0, third node
//   int port = fabric->TwoLevelPort(fabric->NodeOf(*cpu).value(), *dst).value();
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::netmodel::cxl {

// A 12-bit fabric node ID, three 4-bit fields `pod:switch:device`. In a fat-tree a switch is
// `pod:switch:1` and its devices `pod:switch:2..k/2+1`; core switches are `k:j:i`, j and i in
// 1..k/2 (Al-Fares' addressing, 10.pod.switch.id, in 4-bit fields).
struct FanId {
  int pod = 0;
  int sw = 0;
  int device = 0;

  uint16_t value() const { return static_cast<uint16_t>(pod << 8 | sw << 4 | device); }
  static FanId FromValue(uint16_t v) { return {v >> 8 & 0xf, v >> 4 & 0xf, v & 0xf}; }
  friend bool operator==(const FanId& a, const FanId& b) { return a.value() == b.value(); }
};

// "2:0:2": each field one lowercase hex digit.
std::string FormatFanId(FanId id);
// Three hex digits (either case) separated by ':'; InvalidArgument quoting the text otherwise.
absl::StatusOr<FanId> ParseFanId(std::string_view text);

// CXL protocols and the message classes a flow is made of (ch. 4.3.1). The classes are the ones
// the simulator moves: CXL.mem's M2S request (a read), M2S request with data (a write), S2M
// data response (read data) and S2M no-data response (a write's completion), and CXL.io's
// unordered I/O (a peer-to-peer write).
enum class Protocol : uint8_t { kIo, kCache, kMem };
enum class MessageClass : uint8_t { kM2SReq, kM2SRwD, kS2MDrs, kS2MNdr, kUio };
inline constexpr int kMessageClasses = 5;
std::string_view MessageClassName(MessageClass c);
Protocol ProtocolOf(MessageClass c);

// A flow: the quadruple (source, destination, protocol, message class).
struct FlowKey {
  FanId src;
  FanId dst;
  Protocol protocol = Protocol::kMem;
  MessageClass message_class = MessageClass::kM2SRwD;
  uint64_t Pack() const;
};

enum class NodeKind : uint8_t { kDevice, kEdge, kAggregation, kCore };

// One port of a node: the node and port at the other end of its cable; `up` toward the core.
struct Port {
  int peer = -1;
  int peer_port = -1;
  bool up = false;
};

struct Node {
  FanId id;
  NodeKind kind = NodeKind::kDevice;
  std::vector<Port> ports;
};

// Two-level table entries (Al-Fares): a prefix of `fields` leading fields of the destination
// (1: pod, 2: pod:switch, 3: the whole ID) sends it down `port`; otherwise the destination's
// device field picks an upward port.
struct PrefixRoute {
  FanId prefix;
  int fields = 0;
  int port = -1;
};
struct SuffixRoute {
  int device = 0;
  int port = -1;
};

// How a switch picks its egress port (ch. 4.3.2):
//  kPortId: the specification's port-ID-based routing: one fabric-manager entry per destination
//    device, one route per device, no multipath (the baseline, "vanilla CXL");
//  kTwoLevel: Aurelia's prefix/suffix tables alone (one route, spread over the core by FAN-ID);
//  kEcmp: among the equal-cost ports, a hash of the flow quadruple (per-flow);
//  kSpray: among the equal-cost ports, a random one per packet;
//  kAdaptive: two random equal-cost ports, the one with the lower egress backpressure level
//    (from a possibly stale snapshot; power of two choices).
enum class RoutingPolicy : uint8_t { kPortId, kTwoLevel, kEcmp, kSpray, kAdaptive };
std::string_view RoutingPolicyName(RoutingPolicy p);
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name);

class Fabric {
 public:
  // Al-Fares' k-ary fat-tree (k even, 2..14): k pods of k/2 edge and k/2 aggregation switches,
  // (k/2)^2 core switches, k^3/4 devices (k = 4: 16 devices, 20 switches, the seed's fabric).
  // Fills the two-level tables of every switch and the port-ID table (every device's route
  // along the two-level tables).
  static absl::StatusOr<Fabric> FatTree(int k);

  int k() const { return k_; }
  int nodes() const { return static_cast<int>(nodes_.size()); }
  const Node& node(int n) const { return nodes_[n]; }
  // Devices in FAN-ID order (node indices).
  const std::vector<int>& devices() const { return devices_; }
  // The node with that FAN-ID; NotFound naming it otherwise.
  absl::StatusOr<int> NodeOf(FanId id) const;

  // Directed links: one per (node, port), from that port to its peer.
  int links() const { return static_cast<int>(link_node_.size()); }
  int LinkOf(int node, int port) const { return port_base_[node] + port; }
  int LinkSource(int link) const { return link_node_[link]; }
  int LinkSourcePort(int link) const { return link_port_[link]; }

  const std::vector<PrefixRoute>& prefix_table(int sw) const { return prefix_[sw]; }
  const std::vector<SuffixRoute>& suffix_table(int sw) const { return suffix_[sw]; }
  // The two-level lookup at switch `sw`: longest matching prefix, else the device suffix.
  // NotFound naming the switch and destination when neither matches.
  absl::StatusOr<int> TwoLevelPort(int sw, FanId dst) const;
  // The port-ID table's port for a destination device (-1: none).
  int PortIdPort(int sw, FanId dst) const;
  // Equal-cost egress ports toward `dst`: the one down port when dst is below, else every up
  // port, the two-level table's choice first. Empty when dst is unknown.
  std::vector<int> EqualCostPorts(int sw, FanId dst) const;

  // The fabric manager's routes: `ports` of switch `sw` toward `dst`, ahead of every table and
  // policy (a policy that takes one route takes the first). InvalidArgument for a node that is
  // not a switch, an empty list or a port out of range; the error names the switch.
  absl::Status InsertRoute(FanId sw, FanId dst, std::vector<int> ports);
  absl::Status RemoveRoute(FanId sw, FanId dst);
  // The fabric manager's ports at `sw` toward `dst`, or nullptr.
  const std::vector<int>* ManagerRoute(int sw, FanId dst) const;

  // The egress port switch `sw` takes for a packet of `flow` under `policy`. `rng` draws the
  // spray and adaptive choices; `levels` (adaptive only) holds the switch's per-port
  // backpressure levels as last sampled. -1 when the switch has no route.
  int SelectPort(int sw, const FlowKey& flow, RoutingPolicy policy, uint64_t seed,
                 std::mt19937_64& rng, std::span<const int> levels) const;

  // The nodes a packet of `flow` visits from its source device to its destination device, both
  // included, taking SelectPort at every switch with all levels 0. InvalidArgument when an end
  // is not a device; Internal when the walk loops or dead-ends (a bad manager route).
  absl::StatusOr<std::vector<int>> Walk(const FlowKey& flow, RoutingPolicy policy, uint64_t seed,
                                        std::mt19937_64& rng) const;

 private:
  int AddNode(FanId id, NodeKind kind, int ports);
  void Connect(int a, int pa, int b, int pb);

  int k_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> devices_;
  std::vector<int> index_of_;  // FAN-ID value -> node, -1
  std::vector<int> port_base_;
  std::vector<int> link_node_;
  std::vector<int> link_port_;
  std::vector<std::vector<PrefixRoute>> prefix_;
  std::vector<std::vector<SuffixRoute>> suffix_;
  std::vector<std::vector<int16_t>> port_id_;  // per switch: FAN-ID value -> port, -1
  std::vector<absl::flat_hash_map<uint16_t, std::vector<int>>> manager_;
};

}  // namespace plexus::netmodel::cxl
