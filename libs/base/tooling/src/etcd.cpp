#include "plexus/tooling/etcd.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "plexus/base/file.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"

namespace plexus::tooling {

namespace net = base::net;

bool EtcdServer::Installed() { return access(kBinary, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(absl::Duration timeout) {
  if (!Installed()) {
    return absl::NotFoundError(
        absl::StrCat(kBinary, " is not installed (apt-get install etcd-server)"));
  }
  PLEXUS_ASSIGN_OR_RETURN(uint16_t client, net::ReserveLoopbackPort());
  PLEXUS_ASSIGN_OR_RETURN(uint16_t peer, net::ReserveLoopbackPort());
  std::unique_ptr<EtcdServer> server(new EtcdServer());
  server->address_ = absl::StrCat("127.0.0.1:", client);
  char dir_template[] = "/tmp/plexus-etcd-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a data directory for etcd: ", net::ErrnoText(errno)));
  }
  server->dir_ = dir_template;
  const std::string data = server->dir_ + "/data";
  const std::string log = server->dir_ + "/etcd.log";
  const std::string client_url = absl::StrCat("http://", server->address_);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
  const std::string cluster = absl::StrCat("plexus=", peer_url);
  server->pid_ = fork();
  if (server->pid_ < 0) {
    return absl::UnavailableError(absl::StrCat("fork: ", net::ErrnoText(errno)));
  }
  if (server->pid_ == 0) {
    if (std::freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) _exit(126);
    execl(kBinary, "etcd", "--name", "plexus", "--data-dir", data.c_str(), "--listen-client-urls",
          client_url.c_str(), "--advertise-client-urls", client_url.c_str(), "--listen-peer-urls",
          peer_url.c_str(), "--initial-advertise-peer-urls", peer_url.c_str(), "--initial-cluster",
          cluster.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Up once its client port accepts connections (etcd opens it when it is ready to serve).
  PLEXUS_ASSIGN_OR_RETURN(net::SocketAddress at, net::ResolveFirst(server->address_, "etcd"));
  const absl::Time deadline = absl::Now() + timeout;
  bool up = false;
  base::PollUntil(deadline, absl::Milliseconds(20), [&] {
    bool retryable = false;
    auto fd = net::ConnectTcp(at, absl::Now() + absl::Milliseconds(200), &retryable);
    if (fd.ok()) {
      close(*fd);
      up = true;
    }
    return up || waitpid(server->pid_, nullptr, WNOHANG) == server->pid_;
  });
  if (!up) {
    std::string tail;
    if (auto text = base::ReadFile(log); text.ok()) {
      tail = text->substr(text->size() > 600 ? text->size() - 600 : 0);
    }
    return absl::UnavailableError(absl::StrCat("etcd did not come up on ", server->address_,
                                               " within ", absl::FormatDuration(timeout),
                                               "; its log ends: ", tail));
  }
  return server;
}

EtcdServer::~EtcdServer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace plexus::tooling
