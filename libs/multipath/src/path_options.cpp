// Per-path bindings of a MultipathDevice (device.hpp): the default flow labels, the bindings of
// one connection and the options' validation. Pure functions, unit-tested without a device.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device_wire.hpp"
#include "plexus/base/status.hpp"
#include "plexus/multipath/device.hpp"

namespace plexus::multipath {
namespace {

namespace pt = ::plexus::transport;

// splitmix64: well-mixed bits from consecutive inputs.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<uint32_t> DefaultFlowLabels(int paths, uint64_t seed) {
  std::vector<uint32_t> labels;
  std::set<uint16_t> ports;  // RoCE v2 UDP source ports taken (16384 exist, far more than paths)
  uint64_t state = seed;
  while (static_cast<int>(labels.size()) < paths) {
    state = Mix(state);
    const auto label = static_cast<uint32_t>(state & pt::kMaxFlowLabel);
    if (label == 0 || !ports.insert(pt::RoceV2SourcePort(label)).second) continue;
    labels.push_back(label);
  }
  return labels;
}

std::vector<pt::PathBinding> PathBindings(const MultipathDeviceOptions& options,
                                          const std::vector<uint32_t>& default_labels) {
  const bool verbs = options.device.backend == pt::Backend::kVerbs;
  std::vector<pt::PathBinding> out;
  for (size_t k = 0; k < options.local_addresses.size(); ++k) {
    pt::PathBinding b;
    b.local_address = options.local_addresses[k];
    if (verbs) {
      const PathOptions p =
          k < options.path_options.size() ? options.path_options[k] : PathOptions{};
      b.gid_index = p.gid_index;
      b.flow_label = p.flow_label.has_value()    ? *p.flow_label
                     : k < default_labels.size() ? default_labels[k]
                                                 : 0;
    }
    out.push_back(b);
  }
  return out;
}

namespace internal {

absl::Status ValidatePathOptions(const MultipathDeviceOptions& options) {
  const size_t paths = options.local_addresses.size();
  if (!options.path_options.empty() && options.path_options.size() != paths) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultipathDeviceOptions.path_options has ", options.path_options.size(),
                     " entries for ", paths, " local_addresses: give none or one per path"));
  }
  const bool verbs = options.device.backend == pt::Backend::kVerbs;
  for (size_t k = 0; k < options.path_options.size(); ++k) {
    const PathOptions& p = options.path_options[k];
    const std::string what = absl::StrCat("MultipathDeviceOptions.path_options[", k, "]");
    if (!verbs && (p.gid_index != -1 || p.flow_label.has_value())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " sets ", p.gid_index != -1 ? "gid_index" : "flow_label",
                       ", which only the verbs backend has (device.backend is ",
                       std::string(pt::BackendName(options.device.backend)), ")"));
    }
    pt::PathBinding b;
    b.gid_index = p.gid_index;
    b.flow_label = p.flow_label.value_or(0);
    PLEXUS_RETURN_IF_ERROR(pt::ValidatePathBinding(b, what));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace plexus::multipath
