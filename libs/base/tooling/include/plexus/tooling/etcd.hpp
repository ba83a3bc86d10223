// A private etcd member on 127.0.0.1 for the tests and benchmarks of the etcd store: started in a
// fresh data directory on two free ports, killed (by PID) and removed when destroyed.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::tooling {

class EtcdServer {
 public:
  // The etcd binary this looks for (Debian's etcd-server).
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static bool Installed();
  // Starts etcd and waits until it answers on its client port: NotFound when etcd is not
  // installed, Unavailable (with the end of its log) when it does not come up within `timeout`.
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start(absl::Duration timeout);
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // "127.0.0.1:port" of the client endpoint.
  const std::string& address() const { return address_; }

 private:
  EtcdServer() = default;
  pid_t pid_ = -1;
  std::string address_;
  std::string dir_;
};

}  // namespace plexus::tooling
