#include "plexus/netmodel/cxl_fabric.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/names.hpp"
#include "plexus/netmodel/flow_assign.hpp"

namespace plexus::netmodel::cxl {
namespace {

constexpr std::string_view kPolicyNames[] = {"port_id", "two_level", "ecmp", "spray", "adaptive"};
constexpr std::string_view kClassNames[] = {"m2s_req", "m2s_rwd", "s2m_drs", "s2m_ndr", "uio"};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string FormatFanId(FanId id) {
  constexpr char kHex[] = "0123456789abcdef";
  return std::string{kHex[id.pod & 0xf], ':', kHex[id.sw & 0xf], ':', kHex[id.device & 0xf]};
}

absl::StatusOr<FanId> ParseFanId(std::string_view text) {
  if (text.size() == 5 && text[1] == ':' && text[3] == ':') {
    const int a = HexDigit(text[0]), b = HexDigit(text[2]), c = HexDigit(text[4]);
    if (a >= 0 && b >= 0 && c >= 0) return FanId{a, b, c};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("FAN-ID '", absl::string_view(text.data(), text.size()),
                   "': expected pod:switch:device, one hex digit each (e.g. 2:0:2)"));
}

std::string_view MessageClassName(MessageClass c) {
  return base::NameAt(static_cast<size_t>(c), kClassNames);
}

Protocol ProtocolOf(MessageClass c) {
  return c == MessageClass::kUio ? Protocol::kIo : Protocol::kMem;
}

uint64_t FlowKey::Pack() const {
  return uint64_t{src.value()} << 32 | uint64_t{dst.value()} << 16 |
         uint64_t{static_cast<uint8_t>(protocol)} << 8 | static_cast<uint8_t>(message_class);
}

std::string_view RoutingPolicyName(RoutingPolicy p) {
  return base::NameAt(static_cast<size_t>(p), kPolicyNames);
}

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  return base::ParseName<RoutingPolicy>(name, kPolicyNames, "routing policy");
}

int Fabric::AddNode(FanId id, NodeKind kind, int ports) {
  const int n = static_cast<int>(nodes_.size());
  nodes_.push_back({id, kind, std::vector<Port>(ports)});
  index_of_[id.value()] = n;
  if (kind == NodeKind::kDevice) devices_.push_back(n);
  return n;
}

void Fabric::Connect(int a, int pa, int b, int pb) {
  nodes_[a].ports[pa] = {b, pb, true};  // a is the lower node
  nodes_[b].ports[pb] = {a, pa, false};
}

absl::StatusOr<Fabric> Fabric::FatTree(int k) {
  if (k < 2 || k > 14 || k % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fat-tree: k must be even and in [2, 14] (4-bit FAN-ID fields), got ", k));
  }
  const int h = k / 2;
  Fabric f;
  f.k_ = k;
  f.index_of_.assign(1 << 12, -1);
  std::vector<std::vector<int>> edge(k, std::vector<int>(h)), agg(k, std::vector<int>(h));
  for (int p = 0; p < k; ++p) {
    for (int s = 0; s < h; ++s) edge[p][s] = f.AddNode({p, s, 1}, NodeKind::kEdge, k);
    for (int a = 0; a < h; ++a) agg[p][a] = f.AddNode({p, h + a, 1}, NodeKind::kAggregation, k);
  }
  std::vector<std::vector<int>> core(h, std::vector<int>(h));
  for (int j = 0; j < h; ++j) {
    for (int i = 0; i < h; ++i) core[j][i] = f.AddNode({k, j + 1, i + 1}, NodeKind::kCore, k);
  }
  for (int p = 0; p < k; ++p) {
    for (int s = 0; s < h; ++s) {
      for (int d = 0; d < h; ++d) {
        const int dev = f.AddNode({p, s, d + 2}, NodeKind::kDevice, 1);
        f.Connect(dev, 0, edge[p][s], d);
      }
      for (int a = 0; a < h; ++a) f.Connect(edge[p][s], h + a, agg[p][a], s);
    }
    for (int a = 0; a < h; ++a) {
      for (int i = 0; i < h; ++i) f.Connect(agg[p][a], h + i, core[a][i], p);
    }
  }
  // Links in node order, ports in port order.
  for (int n = 0; n < f.nodes(); ++n) {
    f.port_base_.push_back(f.links());
    for (int p = 0; p < static_cast<int>(f.nodes_[n].ports.size()); ++p) {
      f.link_node_.push_back(n);
      f.link_port_.push_back(p);
    }
  }
  // Two-level tables: edge switch s sends its own devices down (whole-ID prefixes) and the rest
  // up by suffix, port h + (d - 2 + s) mod h; aggregation switch a sends pod:switch prefixes of
  // its pod down and the rest up by suffix, port h + (d - 2 + a) mod h; a core sends pod p down
  // port p.
  f.prefix_.resize(f.nodes());
  f.suffix_.resize(f.nodes());
  f.manager_.resize(f.nodes());
  for (int n = 0; n < f.nodes(); ++n) {
    const Node& node = f.nodes_[n];
    const FanId id = node.id;
    switch (node.kind) {
      case NodeKind::kDevice:
        break;
      case NodeKind::kEdge:
      case NodeKind::kAggregation: {
        const bool is_edge = node.kind == NodeKind::kEdge;
        const int z = is_edge ? id.sw : id.sw - h;
        for (int x = 0; x < h; ++x) {
          f.prefix_[n].push_back(is_edge ? PrefixRoute{{id.pod, id.sw, x + 2}, 3, x}
                                         : PrefixRoute{{id.pod, x, 0}, 2, x});
        }
        for (int d = 2; d < h + 2; ++d) f.suffix_[n].push_back({d, h + (d - 2 + z) % h});
        break;
      }
      case NodeKind::kCore:
        for (int p = 0; p < k; ++p) f.prefix_[n].push_back({{p, 0, 0}, 1, p});
        break;
    }
  }
  f.port_id_.resize(f.nodes());
  for (int n = 0; n < f.nodes(); ++n) {
    if (f.nodes_[n].kind == NodeKind::kDevice) continue;
    f.port_id_[n].assign(1 << 12, -1);
    for (int dev : f.devices_) {
      const FanId dst = f.nodes_[dev].id;
      auto port = f.TwoLevelPort(n, dst);
      if (port.ok()) f.port_id_[n][dst.value()] = static_cast<int16_t>(*port);
    }
  }
  return f;
}

absl::StatusOr<int> Fabric::NodeOf(FanId id) const {
  const int n = index_of_.empty() ? -1 : index_of_[id.value() & 0xfff];
  if (n < 0) return absl::NotFoundError(absl::StrCat("no node with FAN-ID ", FormatFanId(id)));
  return n;
}

absl::StatusOr<int> Fabric::TwoLevelPort(int sw, FanId dst) const {
  int best = -1, best_fields = 0;
  for (const PrefixRoute& r : prefix_[sw]) {
    const bool match = r.prefix.pod == dst.pod && (r.fields < 2 || r.prefix.sw == dst.sw) &&
                       (r.fields < 3 || r.prefix.device == dst.device);
    if (match && r.fields > best_fields) {
      best = r.port;
      best_fields = r.fields;
    }
  }
  if (best >= 0) return best;
  for (const SuffixRoute& r : suffix_[sw]) {
    if (r.device == dst.device) return r.port;
  }
  return absl::NotFoundError(absl::StrCat("switch ", FormatFanId(nodes_[sw].id),
                                          ": no prefix or suffix route to ", FormatFanId(dst)));
}

int Fabric::PortIdPort(int sw, FanId dst) const {
  return port_id_[sw].empty() ? -1 : port_id_[sw][dst.value() & 0xfff];
}

std::vector<int> Fabric::EqualCostPorts(int sw, FanId dst) const {
  auto first = TwoLevelPort(sw, dst);
  if (!first.ok()) return {};
  const std::vector<Port>& ports = nodes_[sw].ports;
  if (!ports[*first].up) return {*first};
  std::vector<int> out{*first};
  for (int p = 0; p < static_cast<int>(ports.size()); ++p) {
    if (ports[p].up && p != *first) out.push_back(p);
  }
  return out;
}

absl::Status Fabric::InsertRoute(FanId sw, FanId dst, std::vector<int> ports) {
  auto n = NodeOf(sw);
  if (!n.ok() || nodes_[*n].kind == NodeKind::kDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric manager: ", FormatFanId(sw), " is not a switch"));
  }
  if (ports.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("fabric manager: route at ", FormatFanId(sw),
                                                   " to ", FormatFanId(dst), " has no port"));
  }
  for (int p : ports) {
    if (p < 0 || p >= static_cast<int>(nodes_[*n].ports.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("fabric manager: switch ", FormatFanId(sw), " has no port ", p));
    }
  }
  manager_[*n][dst.value()] = std::move(ports);
  return absl::OkStatus();
}

absl::Status Fabric::RemoveRoute(FanId sw, FanId dst) {
  auto n = NodeOf(sw);
  if (!n.ok() || manager_[*n].erase(dst.value()) == 0) {
    return absl::NotFoundError(
        absl::StrCat("fabric manager: no route at ", FormatFanId(sw), " to ", FormatFanId(dst)));
  }
  return absl::OkStatus();
}

const std::vector<int>* Fabric::ManagerRoute(int sw, FanId dst) const {
  auto it = manager_[sw].find(dst.value());
  return it == manager_[sw].end() ? nullptr : &it->second;
}

int Fabric::SelectPort(int sw, const FlowKey& flow, RoutingPolicy policy, uint64_t seed,
                       std::mt19937_64& rng, std::span<const int> levels) const {
  std::vector<int> candidates;
  if (const std::vector<int>* m = ManagerRoute(sw, flow.dst)) {
    candidates = *m;
  } else if (policy == RoutingPolicy::kPortId) {
    return PortIdPort(sw, flow.dst);
  } else if (policy == RoutingPolicy::kTwoLevel) {
    auto p = TwoLevelPort(sw, flow.dst);
    return p.ok() ? *p : -1;
  } else {
    candidates = EqualCostPorts(sw, flow.dst);
  }
  const int n = static_cast<int>(candidates.size());
  if (n == 0) return -1;
  if (n == 1) return candidates[0];
  switch (policy) {
    case RoutingPolicy::kPortId:
    case RoutingPolicy::kTwoLevel:
      return candidates[0];
    case RoutingPolicy::kEcmp:
      return candidates[EcmpHash(flow.Pack(), seed ^ (uint64_t{nodes_[sw].id.value()} << 48)) % n];
    case RoutingPolicy::kSpray:
      return candidates[rng() % n];
    case RoutingPolicy::kAdaptive: {
      const int a = static_cast<int>(rng() % n);
      int b = static_cast<int>(rng() % (n - 1));
      if (b >= a) ++b;
      const auto level = [&](int i) {
        const int port = candidates[i];
        return port < static_cast<int>(levels.size()) ? levels[port] : 0;
      };
      return level(b) < level(a) ? candidates[b] : candidates[a];
    }
  }
  return -1;
}

absl::StatusOr<std::vector<int>> Fabric::Walk(const FlowKey& flow, RoutingPolicy policy,
                                              uint64_t seed, std::mt19937_64& rng) const {
  auto src = NodeOf(flow.src);
  auto dst = NodeOf(flow.dst);
  if (!src.ok() || !dst.ok() || nodes_[*src].kind != NodeKind::kDevice ||
      nodes_[*dst].kind != NodeKind::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat("walk ", FormatFanId(flow.src), " -> ",
                                                   FormatFanId(flow.dst),
                                                   ": both ends must be devices of the fabric"));
  }
  std::vector<int> path{*src};
  int at = nodes_[*src].ports[0].peer;
  const std::vector<int> zeros(2 * k_, 0);
  while (at != *dst) {
    path.push_back(at);
    if (nodes_[at].kind == NodeKind::kDevice || path.size() > 16) {
      return absl::InternalError(absl::StrCat("walk ", FormatFanId(flow.src), " -> ",
                                              FormatFanId(flow.dst), ": loops or dead-ends at ",
                                              FormatFanId(nodes_[at].id)));
    }
    const int port = SelectPort(at, flow, policy, seed, rng, zeros);
    if (port < 0) {
      return absl::InternalError(absl::StrCat("walk ", FormatFanId(flow.src), " -> ",
                                              FormatFanId(flow.dst), ": switch ",
                                              FormatFanId(nodes_[at].id), " has no route"));
    }
    at = nodes_[at].ports[port].peer;
  }
  path.push_back(at);
  return path;
}

}  // namespace plexus::netmodel::cxl
