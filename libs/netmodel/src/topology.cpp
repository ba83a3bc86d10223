#include "plexus/netmodel/topology.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::netmodel {
namespace json = plexus::base::json;
using json::Json;

namespace {

// Within the cost matrix's bounds, so that the matrices derived from a topology are valid.
absl::Status CheckLink(const std::string& path, double gbps, double latency_us) {
  if (!(gbps >= kMinBandwidthGbps && gbps <= kMaxBandwidthGbps)) {
    return json::Invalid(path, absl::StrCat("capacity must be in ", kMinBandwidthGbps, "..",
                                            kMaxBandwidthGbps, " Gbps, got ", gbps));
  }
  // A path crosses at most six links (host, rack and pod uplinks on each side) and a round
  // trip twice that: the sum stays within the matrix's bound.
  if (!(latency_us >= 0 && latency_us <= kMaxLatencyUs / 12)) {
    return json::Invalid(
        path, absl::StrCat("latency must be in 0..", kMaxLatencyUs / 12, " us, got ", latency_us));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<absl::flat_hash_map<std::string, int>> Names(const std::vector<T>& items,
                                                            const std::string& what) {
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string path = json::Index(what, i) + ".name";
    if (items[i].name.empty()) return json::Invalid(path, "must not be empty");
    if (!index.emplace(items[i].name, static_cast<int>(i)).second) {
      return json::Invalid(path, absl::StrCat("duplicate name '", items[i].name, "'"));
    }
  }
  return index;
}

}  // namespace

absl::Status Topology::Validate() {
  PLEXUS_ASSIGN_OR_RETURN(auto pod_index, Names(pods, "pods"));
  PLEXUS_ASSIGN_OR_RETURN(auto rack_index, Names(racks, "racks"));
  PLEXUS_ASSIGN_OR_RETURN(auto host_index, Names(hosts, "hosts"));
  (void)host_index;
  if (hosts.empty()) return json::Invalid("hosts", "must list at least one host");
  rack_pod_.assign(racks.size(), -1);
  host_rack_.assign(hosts.size(), -1);
  for (size_t i = 0; i < pods.size(); ++i) {
    PLEXUS_RETURN_IF_ERROR(
        CheckLink(json::Index("pods", i), pods[i].uplink_gbps, pods[i].uplink_latency_us));
  }
  for (size_t i = 0; i < racks.size(); ++i) {
    const std::string path = json::Index("racks", i);
    PLEXUS_RETURN_IF_ERROR(CheckLink(path, racks[i].uplink_gbps, racks[i].uplink_latency_us));
    auto it = pod_index.find(racks[i].pod);
    if (it == pod_index.end()) {
      return json::Invalid(path + ".pod", absl::StrCat("no pod named '", racks[i].pod, "'"));
    }
    rack_pod_[i] = it->second;
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string path = json::Index("hosts", i);
    PLEXUS_RETURN_IF_ERROR(CheckLink(path, hosts[i].nic_gbps, hosts[i].nic_latency_us));
    auto it = rack_index.find(hosts[i].rack);
    if (it == rack_index.end()) {
      return json::Invalid(path + ".rack", absl::StrCat("no rack named '", hosts[i].rack, "'"));
    }
    host_rack_[i] = it->second;
  }
  return absl::OkStatus();
}

std::vector<Topology::Link> Topology::Path(int a, int b) const {
  std::vector<Link> path;
  if (a == b) return path;
  path.push_back({LinkKind::kHost, a});
  path.push_back({LinkKind::kHost, b});
  const int ra = host_rack_[a];
  const int rb = host_rack_[b];
  if (ra == rb) return path;
  path.push_back({LinkKind::kRack, ra});
  path.push_back({LinkKind::kRack, rb});
  const int pa = rack_pod_[ra];
  const int pb = rack_pod_[rb];
  if (pa == pb) return path;
  path.push_back({LinkKind::kPod, pa});
  path.push_back({LinkKind::kPod, pb});
  return path;
}

double Topology::Capacity(const Link& link) const {
  switch (link.kind) {
    case LinkKind::kHost:
      return hosts[link.index].nic_gbps;
    case LinkKind::kRack:
      return racks[link.index].uplink_gbps;
    case LinkKind::kPod:
      return pods[link.index].uplink_gbps;
  }
  return 0;
}

double Topology::LatencyUs(int a, int b) const {
  double sum = 0;
  for (const Link& link : Path(a, b)) {
    switch (link.kind) {
      case LinkKind::kHost:
        sum += hosts[link.index].nic_latency_us;
        break;
      case LinkKind::kRack:
        sum += racks[link.index].uplink_latency_us;
        break;
      case LinkKind::kPod:
        sum += pods[link.index].uplink_latency_us;
        break;
    }
  }
  return sum;
}

absl::StatusOr<Topology> ParseTopology(std::string_view json_text, std::string_view what) {
  PLEXUS_ASSIGN_OR_RETURN(Json doc, json::ParseJsonText(json_text, what));
  auto in = [&](const absl::Status& s) { return base::Annotate(s, std::string(what)); };
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected a JSON object"));
  }
  if (auto s = json::CheckKeys(doc, "", {"pods", "racks", "hosts"}); !s.ok()) return in(s);
  Topology t;
  auto list = [&](std::string_view key) -> absl::StatusOr<const Json*> {
    return json::ArrayField(doc, "", key, true);
  };
  auto pods = list("pods");
  if (!pods.ok()) return in(pods.status());
  for (size_t i = 0; i < (*pods)->size(); ++i) {
    const Json& e = (**pods)[i];
    const std::string path = json::Index("pods", i);
    if (!e.is_object()) return in(json::Invalid(path, "expected an object"));
    if (auto s = json::CheckKeys(e, path, {"name", "uplink_gbps", "uplink_latency_us"}); !s.ok()) {
      return in(s);
    }
    Topology::Pod p;
    auto name = json::StringField(e, path, "name", true);
    auto gbps = json::NumberField(e, path, "uplink_gbps", true);
    auto lat = json::NumberField(e, path, "uplink_latency_us", false, 0);
    for (const absl::Status& s : {name.status(), gbps.status(), lat.status()}) {
      if (!s.ok()) return in(s);
    }
    p.name = *name;
    p.uplink_gbps = *gbps;
    p.uplink_latency_us = *lat;
    t.pods.push_back(std::move(p));
  }
  auto racks = list("racks");
  if (!racks.ok()) return in(racks.status());
  for (size_t i = 0; i < (*racks)->size(); ++i) {
    const Json& e = (**racks)[i];
    const std::string path = json::Index("racks", i);
    if (!e.is_object()) return in(json::Invalid(path, "expected an object"));
    if (auto s = json::CheckKeys(e, path, {"name", "pod", "uplink_gbps", "uplink_latency_us"});
        !s.ok()) {
      return in(s);
    }
    Topology::Rack r;
    auto name = json::StringField(e, path, "name", true);
    auto pod = json::StringField(e, path, "pod", true);
    auto gbps = json::NumberField(e, path, "uplink_gbps", true);
    auto lat = json::NumberField(e, path, "uplink_latency_us", false, 0);
    for (const absl::Status& s : {name.status(), pod.status(), gbps.status(), lat.status()}) {
      if (!s.ok()) return in(s);
    }
    r.name = *name;
    r.pod = *pod;
    r.uplink_gbps = *gbps;
    r.uplink_latency_us = *lat;
    t.racks.push_back(std::move(r));
  }
  auto hosts = list("hosts");
  if (!hosts.ok()) return in(hosts.status());
  for (size_t i = 0; i < (*hosts)->size(); ++i) {
    const Json& e = (**hosts)[i];
    const std::string path = json::Index("hosts", i);
    if (!e.is_object()) return in(json::Invalid(path, "expected an object"));
    if (auto s = json::CheckKeys(e, path, {"name", "rack", "nic_gbps", "nic_latency_us"});
        !s.ok()) {
      return in(s);
    }
    Topology::Host h;
    auto name = json::StringField(e, path, "name", true);
    auto rack = json::StringField(e, path, "rack", true);
    auto gbps = json::NumberField(e, path, "nic_gbps", true);
    auto lat = json::NumberField(e, path, "nic_latency_us", false, 0);
    for (const absl::Status& s : {name.status(), rack.status(), gbps.status(), lat.status()}) {
      if (!s.ok()) return in(s);
    }
    h.name = *name;
    h.rack = *rack;
    h.nic_gbps = *gbps;
    h.nic_latency_us = *lat;
    t.hosts.push_back(std::move(h));
  }
  if (auto s = t.Validate(); !s.ok()) return in(s);
  return t;
}

std::string TopologyToJson(const Topology& t) {
  Json doc = {{"pods", Json::array()}, {"racks", Json::array()}, {"hosts", Json::array()}};
  for (const auto& p : t.pods) {
    doc["pods"].push_back({{"name", p.name},
                           {"uplink_gbps", p.uplink_gbps},
                           {"uplink_latency_us", p.uplink_latency_us}});
  }
  for (const auto& r : t.racks) {
    doc["racks"].push_back({{"name", r.name},
                            {"pod", r.pod},
                            {"uplink_gbps", r.uplink_gbps},
                            {"uplink_latency_us", r.uplink_latency_us}});
  }
  for (const auto& h : t.hosts) {
    doc["hosts"].push_back({{"name", h.name},
                            {"rack", h.rack},
                            {"nic_gbps", h.nic_gbps},
                            {"nic_latency_us", h.nic_latency_us}});
  }
  return doc.dump(1);
}

absl::Status CheckFabricSize(const FabricSpec& spec) {
  if (spec.pods < 1 || spec.racks_per_pod < 1 || spec.hosts_per_rack < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric: pods, racks_per_pod and hosts_per_rack must be >= 1, got ", spec.pods,
                     ", ", spec.racks_per_pod, ", ", spec.hosts_per_rack));
  }
  const int64_t hosts = int64_t{spec.pods} * spec.racks_per_pod * spec.hosts_per_rack;
  if (hosts > kMaxFabricHosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric: ", spec.pods, " pods x ", spec.racks_per_pod, " racks x ",
                     spec.hosts_per_rack, " hosts = ", hosts, " hosts; at most ", kMaxFabricHosts,
                     " are supported (the latency matrix has hosts^2 entries: ", hosts * hosts,
                     " here, ", kMaxFabricHosts * kMaxFabricHosts, " at the limit)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Topology> GenerateFabric(const FabricSpec& spec) {
  PLEXUS_RETURN_IF_ERROR(CheckFabricSize(spec));
  if (!(spec.rack_oversubscription > 0) || !(spec.pod_oversubscription > 0)) {
    return absl::InvalidArgumentError("fabric: oversubscription factors must be > 0");
  }
  Topology t;
  const double rack_gbps = spec.hosts_per_rack * spec.nic_gbps / spec.rack_oversubscription;
  const double pod_gbps = spec.racks_per_pod * rack_gbps / spec.pod_oversubscription;
  for (int p = 0; p < spec.pods; ++p) {
    const std::string pod = absl::StrCat("p", p);
    t.pods.push_back({pod, pod_gbps, spec.pod_latency_us});
    for (int r = 0; r < spec.racks_per_pod; ++r) {
      const std::string rack = absl::StrCat(pod, "r", r);
      t.racks.push_back({rack, pod, rack_gbps, spec.rack_latency_us});
      for (int h = 0; h < spec.hosts_per_rack; ++h) {
        t.hosts.push_back({absl::StrCat(rack, "h", h), rack, spec.nic_gbps, spec.nic_latency_us});
      }
    }
  }
  PLEXUS_RETURN_IF_ERROR(t.Validate());
  return t;
}

absl::Status CostMatrix::Validate() const {
  if (n < 1)
    return absl::InvalidArgumentError(absl::StrCat("cost matrix: n must be >= 1, got ", n));
  const size_t cells = static_cast<size_t>(n) * n;
  if (labels.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost matrix: ", labels.size(), " labels for ", n, " nodes"));
  }
  if (latency_us.size() != cells) {
    return absl::InvalidArgumentError(absl::StrCat("cost matrix: latency_us has ",
                                                   latency_us.size(), " cells, expected ", cells));
  }
  if (!bandwidth_gbps.empty() && bandwidth_gbps.size() != cells) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost matrix: bandwidth_gbps has ", bandwidth_gbps.size(), " cells, expected ", cells));
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i) * n + j;
      const double v = latency_us[k];
      if (!(v >= 0 && v <= kMaxLatencyUs)) {
        return absl::InvalidArgumentError(absl::StrCat("cost matrix: latency_us[", i, "][", j,
                                                       "] must be in 0..", kMaxLatencyUs,
                                                       " (microseconds), got ", v));
      }
      if (i == j && v != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("cost matrix: latency_us[", i, "][", i, "] must be 0, got ", v));
      }
      if (!bandwidth_gbps.empty() && i != j &&
          !(bandwidth_gbps[k] >= kMinBandwidthGbps && bandwidth_gbps[k] <= kMaxBandwidthGbps)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost matrix: bandwidth_gbps[", i, "][", j, "] must be in ", kMinBandwidthGbps, "..",
            kMaxBandwidthGbps, " (Gbit/s), got ", bandwidth_gbps[k]));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::vector<double>> ReadSquare(const Json& doc, std::string_view key, int n) {
  const std::string name(key);
  PLEXUS_ASSIGN_OR_RETURN(const Json* rows, json::ArrayField(doc, "", key, true));
  if (rows->size() != static_cast<size_t>(n)) {
    return json::Invalid(name,
                         absl::StrCat("expected ", n, " rows (one per label), got ", rows->size()));
  }
  std::vector<double> cells;
  cells.reserve(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    const Json& row = (*rows)[i];
    const std::string path = json::Index(name, i);
    if (!row.is_array() || row.size() != static_cast<size_t>(n)) {
      return json::Invalid(path, absl::StrCat("expected an array of ", n, " numbers"));
    }
    for (int j = 0; j < n; ++j) {
      if (!row[j].is_number()) {
        return json::Invalid(json::Index(path, j),
                             absl::StrCat("expected a number, got ", row[j].dump()));
      }
      cells.push_back(row[j].get<double>());
    }
  }
  return cells;
}

}  // namespace

absl::StatusOr<CostMatrix> ParseCostMatrix(std::string_view json_text, std::string_view what) {
  auto in = [&](const absl::Status& s) { return base::Annotate(s, std::string(what)); };
  PLEXUS_ASSIGN_OR_RETURN(Json doc, json::ParseJsonText(json_text, what));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected a JSON object"));
  }
  if (auto s = json::CheckKeys(doc, "", {"labels", "latency_us", "bandwidth_gbps"}); !s.ok()) {
    return in(s);
  }
  CostMatrix m;
  auto labels = json::ArrayField(doc, "", "labels", true);
  if (!labels.ok()) return in(labels.status());
  for (size_t i = 0; i < (*labels)->size(); ++i) {
    const Json& l = (**labels)[i];
    if (!l.is_string() || l.get<std::string>().empty()) {
      return in(json::Invalid(json::Index("labels", i), "expected a non-empty string"));
    }
    m.labels.push_back(l.get<std::string>());
  }
  m.n = static_cast<int>(m.labels.size());
  auto lat = ReadSquare(doc, "latency_us", m.n);
  if (!lat.ok()) return in(lat.status());
  m.latency_us = std::move(*lat);
  if (doc.contains("bandwidth_gbps")) {
    auto bw = ReadSquare(doc, "bandwidth_gbps", m.n);
    if (!bw.ok()) return in(bw.status());
    m.bandwidth_gbps = std::move(*bw);
  }
  if (auto s = m.Validate(); !s.ok()) return in(s);
  return m;
}

std::string CostMatrixToJson(const CostMatrix& m) {
  Json doc = {{"labels", m.labels}, {"latency_us", Json::array()}};
  for (int i = 0; i < m.n; ++i) {
    doc["latency_us"].push_back(std::vector<double>(m.latency_us.begin() + size_t(i) * m.n,
                                                    m.latency_us.begin() + size_t(i + 1) * m.n));
  }
  if (!m.bandwidth_gbps.empty()) {
    doc["bandwidth_gbps"] = Json::array();
    for (int i = 0; i < m.n; ++i) {
      doc["bandwidth_gbps"].push_back(
          std::vector<double>(m.bandwidth_gbps.begin() + size_t(i) * m.n,
                              m.bandwidth_gbps.begin() + size_t(i + 1) * m.n));
    }
  }
  return doc.dump();
}

CostMatrix LatencyFromTopology(const Topology& t, const LatencyNoise& noise) {
  CostMatrix m;
  m.n = static_cast<int>(t.hosts.size());
  for (const auto& h : t.hosts) m.labels.push_back(h.name);
  m.latency_us.assign(static_cast<size_t>(m.n) * m.n, 0);
  std::mt19937_64 rng(noise.seed);
  std::normal_distribution<double> gauss(0, 1);
  std::bernoulli_distribution tenant(std::clamp(noise.tenant_fraction, 0.0, 1.0));
  std::vector<double> extra(m.n, 0);
  for (int i = 0; i < m.n; ++i) extra[i] = tenant(rng) ? noise.tenant_extra_us : 0;
  for (int i = 0; i < m.n; ++i) {
    for (int j = i + 1; j < m.n; ++j) {
      const double rtt = 2 * t.LatencyUs(i, j) * std::exp(noise.noise * gauss(rng));
      const double v = rtt + extra[i] + extra[j];
      m.latency_us[static_cast<size_t>(i) * m.n + j] = v;
      m.latency_us[static_cast<size_t>(j) * m.n + i] = v;
    }
  }
  return m;
}

}  // namespace plexus::netmodel
