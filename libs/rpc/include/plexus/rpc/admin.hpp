// The operator's view of a process's rpc datapaths, on the generic admin endpoint
// (plexus/base/admin.hpp): list Servers, Channels, their connections and engines; attach,
// detach, configure and upgrade engines while calls flow; dump metrics. `plexus-rpc-ctl` drives
// it. Off unless the application creates one (or sets PLEXUS_RPC_ADMIN for RpcAdmin::FromEnv).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/base/admin.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/policy.hpp"
#include "plexus/rpc/schema.hpp"
#include "plexus/rpc/server.hpp"

namespace plexus::rpc {

// Builds a policy of a kind from its JSON configuration; `services` resolve typed fields (ACL).
using PolicyFactory = std::function<absl::StatusOr<std::shared_ptr<Policy>>(
    const std::string& name, std::string_view json_config,
    const std::vector<const ServiceDesc*>& services)>;

// The shipped kinds: "metrics" ({}), "rate_limit" ({"rate": n or "inf", "burst": n, "scope":
// "connection"|"method", "over_limit": "fail"|"wait"}), "acl" ({"rules": [{"name", "method",
// "field", "deny": [..]}]}), "admission", "balance", "qos" (QosPolicy::Configure's fields,
// plexus/rpc/qos.hpp). InvalidArgument naming the field, NotFound for an unknown kind.
absl::StatusOr<std::shared_ptr<Policy>> MakePolicy(std::string_view kind, const std::string& name,
                                                   std::string_view json_config,
                                                   const std::vector<const ServiceDesc*>& services);

class RpcAdmin {
 public:
  // Adds the rpc commands (list, engines, attach, detach, configure, upgrade, metrics) to
  // `endpoint`, which must outlive this object.
  explicit RpcAdmin(base::admin::AdminServer* endpoint);
  // An endpoint of its own from PLEXUS_RPC_ADMIN (a loopback "host:port"; empty: off, the
  // default) and PLEXUS_RPC_ADMIN_TOKEN (required when on): null when off.
  static absl::StatusOr<std::unique_ptr<RpcAdmin>> FromEnv();
  // PLEXUS_RPC_ADMIN and PLEXUS_RPC_ADMIN_TOKEN as set (for plexus-rpc-ctl's defaults).
  static absl::StatusOr<std::pair<std::string, std::string>> EnvSettings();
  ~RpcAdmin();

  // Makes a Server or Channel manageable under `name` (targets of the commands). The Server must
  // outlive its registration (Remove it before destroying it); a Channel is held weakly.
  // `services` resolve ACL fields. AlreadyExists for a taken name.
  absl::Status AddServer(std::string name, Server* server,
                         std::vector<const ServiceDesc*> services);
  absl::Status AddChannel(std::string name, std::shared_ptr<Channel> channel,
                          std::vector<const ServiceDesc*> services);
  void Remove(std::string_view name);
  // A further policy kind for attach/upgrade (replaces one of the same kind).
  void RegisterKind(std::string kind, PolicyFactory factory);
  std::string address() const;

  struct Target;

 private:
  absl::Status AddTarget(std::shared_ptr<Target> target);
  absl::StatusOr<std::shared_ptr<Target>> Find(const base::admin::AdminRequest& r) const;
  absl::StatusOr<std::string> List(const base::admin::AdminRequest& r) const;
  absl::StatusOr<std::string> Engines(const base::admin::AdminRequest& r) const;
  absl::StatusOr<std::string> Attach(const base::admin::AdminRequest& r);
  absl::StatusOr<std::string> Detach(const base::admin::AdminRequest& r);
  absl::StatusOr<std::string> Configure(const base::admin::AdminRequest& r);
  absl::StatusOr<std::string> Upgrade(const base::admin::AdminRequest& r);
  absl::StatusOr<std::string> Metrics(const base::admin::AdminRequest& r) const;
  absl::StatusOr<std::shared_ptr<Policy>> Make(const std::string& kind, const std::string& name,
                                               std::string_view config, const Target& t) const;

  std::unique_ptr<base::admin::AdminServer> owned_;
  base::admin::AdminServer* endpoint_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Target>, std::less<>> targets_;
  std::map<std::string, PolicyFactory, std::less<>> kinds_;
};

}  // namespace plexus::rpc
