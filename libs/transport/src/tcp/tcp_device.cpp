// tcp: non-blocking sockets driven by epoll, writev/readv straight from and into the caller's
// buffers, TCP_NODELAY, optional several sockets per connection with large operations striped
// across them, and binding to a chosen local address so that a multipath layer can pick the path.
//
// The engine (epoll, sockets, backpressure) is tcp::TcpCore (tcp/core.hpp); here it becomes a
// Device, its Connections and Listeners.
#include <unistd.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "tcp/core.hpp"
#include "tcp/listener.hpp"
#include "tcp/sockets.hpp"

namespace plexus::transport::internal {

namespace {

using tcp::TcpCore;

class TcpConnection final : public Connection {
 public:
  TcpConnection(std::shared_ptr<TcpCore> core, std::string peer)
      : core_(std::move(core)), peer_(std::move(peer)) {}
  ~TcpConnection() override { Close(); }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    return core_->PostSend(id(), buffers, wr_id);
  }
  absl::StatusOr<bool> SendNowOrPost(absl::Span<const ConstBuffer> buffers,
                                     uint64_t wr_id) override {
    bool sent_now = false;
    absl::Status posted = core_->PostSend(id(), buffers, wr_id, &sent_now);
    if (!posted.ok()) return posted;
    return sent_now;
  }
  absl::StatusOr<std::optional<size_t>> PeekNext(MutableBuffer head) override {
    return core_->PeekNext(id(), head);
  }
  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id) override {
    return core_->PostSendProduced(id(), length, std::move(producer), wr_id);
  }
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) override {
    return core_->PostRecvConsumed(id(), max_length, std::move(consumer), wr_id);
  }
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    return core_->PostRecv(id(), buffer, wr_id);
  }
  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    return core_->PostWrite(id(), local, local_offset, length, remote, remote_offset, immediate,
                            wr_id);
  }
  void Close() override { core_->Close(id()); }
  absl::Status status() const override { return core_->Status(id()); }
  std::optional<absl::Time> ReceivingSince() const override { return core_->ReceivingSince(id()); }
  std::string peer_address() const override { return peer_; }

 private:
  std::shared_ptr<TcpCore> core_;
  std::string peer_;
};

// Accepts tcp connections: the HelloAcceptor (tcp/listener.hpp) assembles each connection's
// socket group from the clients' hellos, then the core takes the sockets over.
class TcpListener final : public Listener {
 public:
  TcpListener(std::shared_ptr<TcpCore> core, int fd, std::string address)
      : core_(std::move(core)),
        acceptor_(fd, std::move(address), core_->options().connect_timeout) {}
  std::string address() const override { return acceptor_.address(); }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(CompletionQueue* cq,
                                                     absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    PLEXUS_ASSIGN_OR_RETURN(tcp::SocketGroup group, acceptor_.Next(timeout));
    auto conn = std::make_unique<TcpConnection>(core_, group.peer);
    if (absl::Status s = core_->AddConnection(conn->id(), group.fds, cq, group.peer); !s.ok()) {
      tcp::CloseSocketGroup(group);
      return s;
    }
    return conn;
  }

 private:
  std::shared_ptr<TcpCore> core_;
  tcp::HelloAcceptor acceptor_;
};

class TcpDevice final : public Device {
 public:
  TcpDevice(const DeviceOptions& options, std::shared_ptr<TcpCore> core)
      : Device(options), core_(std::move(core)) {}
  ~TcpDevice() override { core_->Shutdown(); }

  Backend backend() const override { return Backend::kTcp; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes,
                                                         MemoryKind kind) override {
    return core_->registry().Register(data, bytes, kind);
  }

  // `address`: see tcp::OpenListeningSocket.
  absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) override {
    PLEXUS_ASSIGN_OR_RETURN(tcp::ListeningSocket listening,
                            tcp::OpenListeningSocket(address, options()));
    return std::make_unique<TcpListener>(core_, listening.fd, std::move(listening.address));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    PLEXUS_ASSIGN_OR_RETURN(std::vector<int> fds, tcp::DialConnection(address, options()));
    return Adopt(std::move(fds), std::string(address), cq);
  }

  // The sockets bind to path.local_address.
  absl::StatusOr<std::unique_ptr<Connection>> ConnectOnPath(const PathBinding& path,
                                                            std::string_view address,
                                                            CompletionQueue* cq) override {
    PLEXUS_RETURN_IF_ERROR(RequireAddressOnly(path, Backend::kTcp));
    if (path.local_address.empty() || path.local_address == options().local_address) {
      return Connect(address, cq);
    }
    if (cq == nullptr) return absl::InvalidArgumentError("ConnectOnPath: null completion queue");
    DeviceOptions from = options();
    from.local_address = path.local_address;
    PLEXUS_ASSIGN_OR_RETURN(std::vector<int> fds, tcp::DialConnection(address, from));
    return Adopt(std::move(fds), std::string(address), cq);
  }

  void Wake() override { core_->Wake(); }

 protected:
  void DriveProgress(absl::Duration max_block) override { core_->Drive(max_block); }

 private:
  // Hands the dialed sockets of a connection to `peer` to the core (closing them when it refuses).
  absl::StatusOr<std::unique_ptr<Connection>> Adopt(std::vector<int> fds, std::string peer,
                                                    CompletionQueue* cq) {
    auto conn = std::make_unique<TcpConnection>(core_, peer);
    if (absl::Status s = core_->AddConnection(conn->id(), fds, cq, peer); !s.ok()) {
      for (int fd : fds) close(fd);
      return s;
    }
    return conn;
  }

  std::shared_ptr<TcpCore> core_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Device>> CreateTcpDevice(const DeviceOptions& options) {
  auto core = std::make_shared<TcpCore>(options);
  PLEXUS_RETURN_IF_ERROR(core->Init());
  return std::make_shared<TcpDevice>(options, std::move(core));
}

}  // namespace plexus::transport::internal
