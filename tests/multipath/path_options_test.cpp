// MultipathDevice's per-path bindings without hardware: the default flow labels (distinct,
// non-zero, 20 bits, distinct RoCE v2 UDP source ports), each path's transport::PathBinding, and
// the options' validation naming the path and field.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/multipath/device.hpp"
#include "plexus/transport/device.hpp"

namespace pm = plexus::multipath;
namespace pt = plexus::transport;

namespace {

pm::MultipathDeviceOptions VerbsOptions(int paths) {
  pm::MultipathDeviceOptions o;
  for (int k = 0; k < paths; ++k) o.local_addresses.push_back("10.0." + std::to_string(k) + ".1");
  o.device.backend = pt::Backend::kVerbs;
  return o;
}

}  // namespace

TEST_CASE("default flow labels: distinct source ports, non-zero, 20 bits, per seed",
          "[multipath][paths]") {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (int paths : {1, 2, 4, 16, 256}) {
      const std::vector<uint32_t> labels = pm::DefaultFlowLabels(paths, seed);
      REQUIRE(static_cast<int>(labels.size()) == paths);
      std::set<uint16_t> ports;
      for (uint32_t label : labels) {
        CHECK(label != 0);
        CHECK(label <= pt::kMaxFlowLabel);
        ports.insert(pt::RoceV2SourcePort(label));
      }
      CHECK(static_cast<int>(ports.size()) == paths);       // ECMP sees K different flows
      CHECK(pm::DefaultFlowLabels(paths, seed) == labels);  // a pure function
    }
  }
  // Another seed (another connection) draws other labels.
  CHECK(pm::DefaultFlowLabels(4, 1) != pm::DefaultFlowLabels(4, 2));
  // A prefix is stable: the first K labels do not depend on how many follow.
  const std::vector<uint32_t> four = pm::DefaultFlowLabels(4, 9);
  const std::vector<uint32_t> two = pm::DefaultFlowLabels(2, 9);
  CHECK(std::vector<uint32_t>(four.begin(), four.begin() + 2) == two);
}

TEST_CASE("path bindings: addresses, explicit and default labels, GID indices",
          "[multipath][paths]") {
  pm::MultipathDeviceOptions o = VerbsOptions(3);
  o.path_options.resize(3);
  o.path_options[1].flow_label = 0x777;
  o.path_options[1].gid_index = 3;
  o.path_options[2].flow_label = 0;  // the NIC's own choice
  const std::vector<uint32_t> defaults = {11, 22, 33};
  const std::vector<pt::PathBinding> b = pm::PathBindings(o, defaults);
  REQUIRE(b.size() == 3);
  CHECK(b[0].local_address == "10.0.0.1");
  CHECK(b[0].flow_label == 11);
  CHECK(b[0].gid_index == -1);
  CHECK(b[1].local_address == "10.0.1.1");
  CHECK(b[1].flow_label == 0x777);
  CHECK(b[1].gid_index == 3);
  CHECK(b[2].flow_label == 0);
  // No path_options: every path takes its default label.
  o.path_options.clear();
  const std::vector<pt::PathBinding> d = pm::PathBindings(o, defaults);
  CHECK(d[2].flow_label == 33);
  // tcp: the address alone, whatever the defaults.
  o.device.backend = pt::Backend::kTcp;
  for (const pt::PathBinding& t : pm::PathBindings(o, defaults)) {
    CHECK(t.flow_label == 0);
    CHECK(t.gid_index == -1);
  }
}

TEST_CASE("multipath device: path_options are validated, naming the path and field",
          "[multipath][paths]") {
  auto message = [](const pm::MultipathDeviceOptions& o) {
    auto d = pm::MultipathDevice::Create(o);
    REQUIRE(absl::IsInvalidArgument(d.status()));
    return std::string(d.status().message());
  };
  pm::MultipathDeviceOptions o = VerbsOptions(2);
  o.path_options.resize(3);
  CHECK(absl::StrContains(message(o), "path_options has 3 entries for 2 local_addresses"));
  o.path_options.resize(2);
  o.path_options[1].flow_label = pt::kMaxFlowLabel + 1;
  CHECK(absl::StrContains(message(o),
                          "path_options[1]: flow_label 1048576 (0x100000) does not "
                          "fit the GRH's 20 bits"));
  o.path_options[1].flow_label.reset();
  o.path_options[0].gid_index = -5;
  CHECK(absl::StrContains(message(o), "path_options[0]: gid_index -5"));
  // tcp has neither.
  pm::MultipathDeviceOptions t = VerbsOptions(2);
  t.device.backend = pt::Backend::kTcp;
  t.path_options.resize(2);
  t.path_options[1].flow_label = 9;
  CHECK(absl::StrContains(message(t),
                          "path_options[1] sets flow_label, which only the verbs "
                          "backend has (device.backend is tcp)"));
  t.path_options[1].flow_label.reset();
  t.path_options[0].gid_index = 1;
  CHECK(absl::StrContains(message(t), "path_options[0] sets gid_index"));
  // Defaults on tcp are fine (the device is created on loopback addresses).
  pm::MultipathDeviceOptions fine;
  fine.local_addresses = {"127.0.0.1", "127.0.0.2"};
  fine.path_options.resize(2);
  auto device = pm::MultipathDevice::Create(fine);
  REQUIRE(device.ok());
  CHECK((*device)->backend() == pt::Backend::kTcp);
  // Other backends are refused by name.
  pm::MultipathDeviceOptions shm = fine;
  shm.device.backend = pt::Backend::kShm;
  CHECK(absl::StrContains(message(shm), "must be tcp or verbs, got shm"));
}

TEST_CASE("multipath device: ConnectOnPath / ListenOnPath take no binding of their own",
          "[multipath][paths]") {
  pm::MultipathDeviceOptions o;
  o.local_addresses = {"127.0.0.1", "127.0.0.2"};
  auto device = pm::MultipathDevice::Create(o);
  REQUIRE(device.ok());
  pt::CompletionQueue cq;
  pt::PathBinding labelled;
  labelled.flow_label = 3;
  auto refused = (*device)->ConnectOnPath(labelled, "mp:127.0.0.1:1,127.0.0.2", &cq);
  REQUIRE(absl::IsInvalidArgument(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "binds each of its paths itself"));
  pt::PathBinding from;
  from.local_address = "127.0.0.1";
  CHECK(absl::IsInvalidArgument((*device)->ListenOnPath(from, "").status()));
  // An empty binding is plain Listen.
  auto listener = (*device)->ListenOnPath(pt::PathBinding{}, "");
  REQUIRE(listener.ok());
  CHECK(absl::StartsWith((*listener)->address(), "mp:127.0.0.1:"));
}
