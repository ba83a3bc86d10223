// What a verbs connection's queue pair reports about its path (ibv_query_qp), for tests and
// diagnostics: the source GID index and flow label a PathBinding set, and the state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "plexus/transport/connection.hpp"

namespace plexus::transport::internal {

struct VerbsPathInfo {
  uint32_t qp_num = 0;
  std::string state;        // "RTS", "ERR", ...
  bool is_global = false;   // the address vector has a GRH (RoCE, routed IB)
  uint32_t sgid_index = 0;  // meaningful when is_global
  uint32_t flow_label = 0;  // meaningful when is_global
  uint32_t port = 0;
  std::string local_address;  // the rdma_cm id's source, "ip:port"
};

// InvalidArgument for a connection that is not a verbs connection; Unavailable when Plexus was
// built without verbs or the queue pair is gone.
absl::StatusOr<VerbsPathInfo> DescribeVerbsPath(const Connection& connection);

}  // namespace plexus::transport::internal
