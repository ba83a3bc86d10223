// The collectives' admin commands (plexus/collectives/admin.hpp).
#include "plexus/collectives/admin.hpp"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/reconfiguration.hpp"

namespace plexus::collectives {
namespace {

using base::admin::AdminRequest;
using Json = nlohmann::json;

constexpr const char* kList = "coll-list";
constexpr const char* kReconfigure = "coll-reconfigure";

using base::admin::CheckArgs;

Json Describe(const std::string& name, const Communicator& comm) {
  const ActiveConfiguration c = comm.configuration();
  Json overrides = Json::object();
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const Algorithm a = c.algorithms.by_collective[k];
    if (a == Algorithm::kAuto) continue;
    overrides[std::string(CollectiveName(static_cast<CollectiveKind>(k)))] =
        std::string(AlgorithmName(a));
  }
  const absl::Status health = comm.health();
  std::vector<std::string> peer_backends;
  for (transport::Backend b : c.peer_backends) {
    peer_backends.emplace_back(transport::BackendName(b));
  }
  return Json{{"name", name},
              {"rank", comm.rank()},
              {"size", comm.size()},
              {"ring_order", c.ring_order},
              {"channels", c.channels},
              {"connected_channels", c.connected_channels},
              {"algorithms", overrides},
              {"transport", TransportChoiceText(c.transport)},
              {"peer_backends", peer_backends},
              {"epoch", c.epoch},
              {"since_sequence", c.since_sequence},
              {"sequence", comm.collective_sequence()},
              {"health", health.ok() ? "ok" : health.ToString()}};
}

}  // namespace

CollectivesAdmin::CollectivesAdmin(base::admin::AdminServer* endpoint) : endpoint_(endpoint) {
  endpoint_->Handle(kList, "every communicator: rank, size, ring order, epoch, sequence",
                    [this](const AdminRequest& r) { return List(r); });
  endpoint_->Handle(kReconfigure,
                    "name=COMM [ring_order=0,2,1,3] [algorithms=allreduce:ring] [channels=N] "
                    "[transport=shm|tcp|tcp/per_peer]: "
                    "a live reconfiguration (lands on the same collective on every rank)",
                    [this](const AdminRequest& r) { return Reconfigure(r); });
}

CollectivesAdmin::~CollectivesAdmin() {
  endpoint_->Remove(kList);
  endpoint_->Remove(kReconfigure);
}

absl::Status CollectivesAdmin::Add(std::string name, Communicator* comm) {
  if (comm == nullptr)
    return absl::InvalidArgumentError("CollectivesAdmin::Add: null communicator");
  if (name.empty() || name.size() > 128 ||
      name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./") !=
          std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectivesAdmin::Add: name '", name, "' must be 1-128 of [A-Za-z0-9-_./]"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!comms_.emplace(name, comm).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("CollectivesAdmin::Add: a communicator named '", name, "' exists"));
  }
  return absl::OkStatus();
}

void CollectivesAdmin::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.erase(name);
}

absl::StatusOr<std::string> CollectivesAdmin::List(const AdminRequest& r) const {
  PLEXUS_RETURN_IF_ERROR(CheckArgs(r, {}));
  Json out = Json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, comm] : comms_) out.push_back(Describe(name, *comm));
  return out.dump();
}

absl::StatusOr<std::string> CollectivesAdmin::Reconfigure(const AdminRequest& r) {
  PLEXUS_RETURN_IF_ERROR(
      CheckArgs(r, {"name", "ring_order", "algorithms", "channels", "transport"}));
  auto arg = [&](const char* key) -> const std::string* {
    auto it = r.args.find(key);
    return it == r.args.end() ? nullptr : &it->second;
  };
  const std::string* name = arg("name");
  if (name == nullptr || name->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin command '", r.command, "': missing argument 'name'"));
  }
  Reconfiguration change;
  if (const std::string* order = arg("ring_order")) {
    PLEXUS_ASSIGN_OR_RETURN(change.ring_order, ParseRingOrder(*order));
  }
  if (const std::string* algorithms = arg("algorithms")) {
    PLEXUS_ASSIGN_OR_RETURN(change.algorithms, AlgorithmOverrides::Parse(*algorithms));
  }
  if (const std::string* channels = arg("channels")) {
    int n = 0;
    if (!absl::SimpleAtoi(*channels, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("admin command '", r.command, "': channels '",
                                                     *channels, "' is not a number"));
    }
    change.channels = n;
  }
  if (const std::string* transport = arg("transport")) {
    PLEXUS_ASSIGN_OR_RETURN(change.transport, ParseTransportChoice(*transport));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(*name);
  if (it == comms_.end()) {
    return absl::NotFoundError(
        absl::StrCat("admin command '", r.command, "': no communicator named '", *name, "'"));
  }
  PLEXUS_ASSIGN_OR_RETURN(const uint64_t epoch, it->second->RequestReconfiguration(change));
  return Json{{"name", *name}, {"epoch", epoch}, {"requested_on_rank", it->second->rank()}}.dump();
}

}  // namespace plexus::collectives
