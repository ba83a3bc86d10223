// The verbs backend's device: RC queue pairs set up with librdmacm, one protection domain and one
// shared completion queue (with a completion channel, so the progress thread sleeps) per device;
// its listener, the progress loop, and opening/probing a device. Connections and their queue
// pairs are in verbs_connection.cpp, CM helpers in verbs_cm.cpp; all protocol decisions live in
// protocol.hpp.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends.hpp"
#include "cuda_copy.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "region_registry.hpp"
#include "verbs/protocol.hpp"
#include "verbs/slot_table.hpp"
#include "verbs/verbs_connection.hpp"
#include "verbs/verbs_loader.hpp"

namespace plexus::transport::internal {
namespace {

using base::net::ErrnoText;
using verbs::AckTimeoutExponent;
using verbs::CmEvent;
using verbs::CmEventName;
using verbs::ConnParamStorage;
using verbs::ConnState;
using verbs::CreateEventChannel;
using verbs::DeviceIp;
using verbs::EventChannelPtr;
using verbs::FillConnParam;
using verbs::Hello;
using verbs::MakeWrId;
using verbs::NewConnection;
using verbs::Protocol;
using verbs::ProtocolConfig;
using verbs::ResolveHostPort;
using verbs::SockaddrText;
using verbs::TryGetCmEvent;
using verbs::VerbsConnection;
using verbs::VerbsCore;
using verbs::VerbsRegion;
using verbs::WaitCmEvent;
using verbs::WorkCompletionError;

class VerbsListener final : public Listener {
 public:
  VerbsListener(std::shared_ptr<VerbsCore> core, EventChannelPtr channel, rdma_cm_id* id,
                std::string address, PathBinding path)
      : core_(std::move(core)),
        channel_(std::move(channel)),
        id_(id),
        address_(std::move(address)),
        path_(std::move(path)) {}

  ~VerbsListener() override {
    for (CmEvent& request : backlog_) {
      rdma_reject(request.id, nullptr, 0);
      rdma_destroy_id(request.id);
    }
    rdma_destroy_id(id_);
  }

  std::string address() const override { return address_; }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(CompletionQueue* cq,
                                                     absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    std::lock_guard<std::mutex> lock(mu_);
    for (;;) {
      CmEvent request;
      if (!backlog_.empty()) {
        request = std::move(backlog_.front());
        backlog_.erase(backlog_.begin());
      } else {
        std::optional<CmEvent> event = WaitCmEvent(channel_.get(), deadline);
        if (!event) {
          return absl::DeadlineExceededError(absl::StrCat("no verbs connection arrived at ",
                                                          address_, " within ",
                                                          absl::FormatDuration(timeout)));
        }
        // Other events concern ids whose handshake already failed: nothing left to do.
        if (event->type != RDMA_CM_EVENT_CONNECT_REQUEST) continue;
        request = std::move(*event);
      }
      return AcceptOne(std::move(request), cq, deadline);
    }
  }

 private:
  absl::StatusOr<std::unique_ptr<Connection>> AcceptOne(CmEvent request, CompletionQueue* cq,
                                                        absl::Time deadline) {
    rdma_cm_id* id = request.id;
    const std::string peer = SockaddrText(rdma_get_peer_addr(id));
    absl::StatusOr<Hello> hello = verbs::DecodeHello(request.private_data);
    if (!hello.ok()) {
      rdma_reject(id, nullptr, 0);
      rdma_destroy_id(id);
      return absl::InvalidArgumentError(absl::StrCat("rejected the verbs connection from ", peer,
                                                     ": ", std::string(hello.status().message())));
    }
    absl::StatusOr<std::unique_ptr<VerbsConnection>> connection =
        NewConnection(core_, id, cq, path_);
    if (!connection.ok()) {
      return absl::Status(connection.status().code(),
                          absl::StrCat("accepting the verbs connection from ", peer, ": ",
                                       std::string(connection.status().message())));
    }
    ConnState& state = (*connection)->state();
    // The passive side learns the peer's receives from the request, before its queue pair is
    // live, so that it can answer as soon as the first message arrives.
    PLEXUS_RETURN_IF_ERROR(state.Connected(*hello));
    uint8_t ack_timeout = AckTimeoutExponent(core_->options.op_timeout);
    rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                    sizeof ack_timeout);  // best effort: older kernels keep their default
    ConnParamStorage param;
    FillConnParam(state.local_hello(), param);
    if (state.owns_queue_pair()) {
      // The binding's flow label and GID go in at RTR, which librdmacm would do in rdma_accept.
      if (absl::Status s = state.EnterRtrRts(); !s.ok()) {
        rdma_reject(id, nullptr, 0);  // the peer learns at once; the id goes with the connection
        return s;
      }
      param.param.qp_num = state.qp_num();
    }
    if (rdma_accept(id, &param.param) != 0) {
      return absl::UnavailableError(
          absl::StrCat("rdma_accept of the connection from ", peer, " failed: ", ErrnoText(errno)));
    }
    for (;;) {
      std::optional<CmEvent> event = WaitCmEvent(channel_.get(), deadline);
      if (!event) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the verbs handshake with ", peer, " did not complete before the Accept deadline"));
      }
      if (event->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        backlog_.push_back(std::move(*event));
        continue;
      }
      if (event->id != id) continue;
      if (event->type == RDMA_CM_EVENT_ESTABLISHED) break;
      return absl::UnavailableError(absl::StrCat("the verbs handshake with ", peer,
                                                 " failed: ", CmEventName(event->type), " (status ",
                                                 event->status, ")"));
    }
    // From now on its disconnect events reach the device's progress loop.
    if (rdma_migrate_id(id, core_->cm_channel.get()) != 0) {
      return absl::InternalError(
          absl::StrCat("rdma_migrate_id for the connection from ", peer, ": ", ErrnoText(errno)));
    }
    return std::unique_ptr<Connection>(std::move(*connection));
  }

  std::shared_ptr<VerbsCore> core_;
  EventChannelPtr channel_;
  rdma_cm_id* id_;
  std::string address_;
  const PathBinding path_;  // the GID index and flow label of accepted connections
  std::mutex mu_;
  std::vector<CmEvent> backlog_;  // connect requests seen while finishing another handshake
};

class VerbsDevice final : public Device {
 public:
  VerbsDevice(const DeviceOptions& options, std::shared_ptr<VerbsCore> core, int wake_fd)
      : Device(options), core_(std::move(core)), wake_fd_(wake_fd) {
    if (options.progress == ProgressMode::kThread) {
      thread_ = std::thread([this] {
        while (!stop_.load(std::memory_order_acquire)) ProgressOnce(absl::Milliseconds(100));
      });
    }
  }

  ~VerbsDevice() override {
    stop_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0) {
      // The thread still stops on its next 100 ms wake-up.
    }
    if (thread_.joinable()) thread_.join();
    close(wake_fd_);
  }

  Backend backend() const override { return Backend::kVerbs; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes,
                                                         MemoryKind kind) override {
    if (data == nullptr || bytes == 0) {
      return absl::InvalidArgumentError("Register: verbs needs a non-null, non-empty range");
    }
    if (kind == MemoryKind::kCuda) {
      PLEXUS_RETURN_IF_ERROR(CheckCudaPointer(data));
    }
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    // CUDA device memory is registered directly: GPUDirect RDMA, through nvidia-peermem.
    ibv_mr* mr = ibv_reg_mr(core_->pd, data, bytes, access);
    if (mr == nullptr) {
      const int err = errno;
      if (kind == MemoryKind::kCuda) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RDMA device ", core_->name, " refused to register ", bytes,
            " bytes of CUDA device memory: ", ErrnoText(err),
            ". GPUDirect RDMA needs the nvidia-peermem kernel module (modprobe nvidia-peermem) "
            "and a NIC and GPU that support it; otherwise register host memory and stage"));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "ibv_reg_mr of ", bytes, " bytes on ", core_->name, " failed: ", ErrnoText(err),
          err == ENOMEM || err == EPERM ? " (locked-memory limit too low? raise `ulimit -l`)"
                                        : ""));
    }
    RegionHandle handle;
    handle.id = core_->next_region_id.fetch_add(1, std::memory_order_relaxed);
    handle.address = reinterpret_cast<uintptr_t>(data);
    handle.length = bytes;
    handle.rkey = mr->rkey;
    handle.backend = Backend::kVerbs;
    handle.kind = kind;
    return std::unique_ptr<MemoryRegion>(
        std::make_unique<VerbsRegion>(core_, mr, data, bytes, kind, handle));
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) override {
    return ListenOnPath(PathBinding{}, address);
  }

  absl::StatusOr<std::unique_ptr<Listener>> ListenOnPath(const PathBinding& path,
                                                         std::string_view address) override {
    PLEXUS_RETURN_IF_ERROR(ValidatePathBinding(path, "ListenOnPath"));
    verbs::HostPort where;
    if (address.empty() && !path.local_address.empty()) {
      where.host = path.local_address;
    } else if (address.empty()) {
      if (core_->ip.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot tell which IP address reaches RDMA device ", core_->name,
            " (no address on its network interface); set DeviceOptions.local_address to that IP "
            "or pass ip:port to Listen"));
      }
      where.host = core_->ip;
    } else {
      PLEXUS_ASSIGN_OR_RETURN(verbs::HostPort parsed, verbs::ParseHostPort(address));
      where = parsed;
    }
    PLEXUS_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveHostPort(where));
    PLEXUS_ASSIGN_OR_RETURN(EventChannelPtr channel, CreateEventChannel());
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(channel.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
      return absl::UnavailableError(absl::StrCat("rdma_create_id: ", ErrnoText(errno)));
    }
    auto fail = [&](absl::Status s) {
      rdma_destroy_id(id);
      return s;
    };
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) != 0) {
      const int err = errno;
      return fail(absl::UnavailableError(
          absl::StrCat("cannot bind a verbs listener to ",
                       verbs::FormatHostPort(where.host, where.port), ": ", ErrnoText(err),
                       err == EADDRINUSE ? "" : " (is it an IP of an RDMA-capable interface?)")));
    }
    if (id->verbs != nullptr && id->verbs != core_->ctx) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(where.host, " belongs to RDMA device ",
                       ibv_get_device_name(id->verbs->device), ", not this device's ", core_->name,
                       "; create the device with local_address set to that device")));
    }
    if (rdma_listen(id, 128) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("rdma_listen: ", ErrnoText(errno))));
    }
    const uint16_t port = ntohs(rdma_get_src_port(id));
    std::string host = where.host;
    if ((host == "0.0.0.0" || host == "::") && !core_->ip.empty()) host = core_->ip;
    return std::unique_ptr<Listener>(std::make_unique<VerbsListener>(
        core_, std::move(channel), id, verbs::FormatHostPort(host, port), path));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    return ConnectOnPath(PathBinding{}, address, cq);
  }

  absl::StatusOr<std::unique_ptr<Connection>> ConnectOnPath(const PathBinding& path,
                                                            std::string_view address,
                                                            CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    PLEXUS_RETURN_IF_ERROR(ValidatePathBinding(path, "ConnectOnPath"));
    PLEXUS_ASSIGN_OR_RETURN(verbs::HostPort where, verbs::ParseHostPort(address));
    if (where.port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Connect: '", std::string(address), "' has port 0"));
    }
    const std::string target = verbs::FormatHostPort(where.host, where.port);
    PLEXUS_ASSIGN_OR_RETURN(sockaddr_storage dst, ResolveHostPort(where));
    std::optional<sockaddr_storage> src;
    if (!path.local_address.empty()) {
      absl::StatusOr<sockaddr_storage> s = ResolveHostPort({path.local_address, 0});
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("verbs connect to ", target, ": local_address ", s.status().message()));
      }
      src = *s;
    } else if (core_->bind_to_ip) {
      PLEXUS_ASSIGN_OR_RETURN(sockaddr_storage s, ResolveHostPort({core_->ip, 0}));
      src = s;
    }
    const absl::Duration timeout = options().connect_timeout;
    const absl::Time deadline = absl::Now() + timeout;
    const int timeout_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 1, 1 << 30));

    // A private channel makes the handshake synchronous; the id moves to the device's channel
    // once established. The channel outlives the id (see the cleanup order below).
    PLEXUS_ASSIGN_OR_RETURN(EventChannelPtr channel, CreateEventChannel());
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(channel.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
      return absl::UnavailableError(absl::StrCat("rdma_create_id: ", ErrnoText(errno)));
    }
    std::unique_ptr<VerbsConnection> connection;  // owns `id` once created
    auto fail = [&](absl::Status s) {
      if (connection) {
        connection.reset();
      } else {
        rdma_destroy_id(id);
      }
      return absl::Status(
          s.code(), absl::StrCat("verbs connect to ", target, ": ", std::string(s.message())));
    };
    auto expect = [&](rdma_cm_event_type wanted) -> absl::StatusOr<CmEvent> {
      std::optional<CmEvent> event = WaitCmEvent(channel.get(), deadline);
      if (!event) {
        return absl::DeadlineExceededError(
            absl::StrCat("no answer within connect_timeout (", absl::FormatDuration(timeout), ")"));
      }
      if (event->type == wanted) return *event;
      switch (event->type) {
        case RDMA_CM_EVENT_ADDR_ERROR:
          return absl::UnavailableError(absl::StrCat("address resolution failed (status ",
                                                     event->status,
                                                     "): no RDMA-capable interface routes to it"));
        case RDMA_CM_EVENT_ROUTE_ERROR:
          return absl::UnavailableError(
              absl::StrCat("route resolution failed (status ", event->status, ")"));
        case RDMA_CM_EVENT_REJECTED:
          return absl::UnavailableError(
              absl::StrCat("connection refused (rejected, status ", event->status,
                           "): no verbs listener at that address, or it rejected the handshake"));
        case RDMA_CM_EVENT_UNREACHABLE:
          return absl::UnavailableError(
              absl::StrCat("peer unreachable (status ", event->status, ")"));
        default:
          return absl::UnavailableError(absl::StrCat("unexpected event ", CmEventName(event->type),
                                                     " (status ", event->status, ")"));
      }
    };

    if (rdma_resolve_addr(id, src ? reinterpret_cast<sockaddr*>(&*src) : nullptr,
                          reinterpret_cast<sockaddr*>(&dst), timeout_ms) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("rdma_resolve_addr: ", ErrnoText(errno))));
    }
    if (absl::StatusOr<CmEvent> e = expect(RDMA_CM_EVENT_ADDR_RESOLVED); !e.ok()) {
      return fail(e.status());
    }
    uint8_t ack_timeout = AckTimeoutExponent(options().op_timeout);
    rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                    sizeof ack_timeout);  // best effort: older kernels keep their default
    if (rdma_resolve_route(id, timeout_ms) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("rdma_resolve_route: ", ErrnoText(errno))));
    }
    if (absl::StatusOr<CmEvent> e = expect(RDMA_CM_EVENT_ROUTE_RESOLVED); !e.ok()) {
      return fail(e.status());
    }
    absl::StatusOr<std::unique_ptr<VerbsConnection>> created = NewConnection(core_, id, cq, path);
    if (!created.ok()) return fail(created.status());
    connection = std::move(*created);
    ConnState& state = connection->state();
    ConnParamStorage param;
    FillConnParam(state.local_hello(), param);
    if (state.owns_queue_pair()) param.param.qp_num = state.qp_num();
    if (rdma_connect(id, &param.param) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("rdma_connect: ", ErrnoText(errno))));
    }
    // With its own queue pair (a binding's flow label or GID) librdmacm reports the peer's
    // answer as CONNECT_RESPONSE and leaves RTR and RTS to us; rdma_establish then completes.
    absl::StatusOr<CmEvent> answer = expect(state.owns_queue_pair() ? RDMA_CM_EVENT_CONNECT_RESPONSE
                                                                    : RDMA_CM_EVENT_ESTABLISHED);
    if (!answer.ok()) return fail(answer.status());
    absl::StatusOr<Hello> hello = verbs::DecodeHello(answer->private_data);
    if (!hello.ok()) return fail(hello.status());
    if (absl::Status s = state.Connected(*hello); !s.ok()) return fail(s);
    if (state.owns_queue_pair()) {
      if (absl::Status s = state.EnterRtrRts(); !s.ok()) return fail(s);
      if (rdma_establish(id) != 0) {
        return fail(absl::UnavailableError(absl::StrCat("rdma_establish: ", ErrnoText(errno))));
      }
    }
    if (rdma_migrate_id(id, core_->cm_channel.get()) != 0) {
      return fail(absl::InternalError(absl::StrCat("rdma_migrate_id: ", ErrnoText(errno))));
    }
    return std::unique_ptr<Connection>(std::move(connection));
  }

 protected:
  void DriveProgress(absl::Duration max_block) override { ProgressOnce(max_block); }

 private:
  // Moves every available work completion to its connection; returns how many.
  int PollCq() {
    ibv_wc wcs[32];
    int total = 0;
    for (;;) {
      const int n = ibv_poll_cq(core_->cq, 32, wcs);
      if (n <= 0) return total;
      for (int i = 0; i < n; ++i) {
        if (std::shared_ptr<ConnState> state =
                core_->Find(static_cast<uint32_t>(wcs[i].wr_id >> 32))) {
          state->OnWorkCompletion(wcs[i]);
        }
      }
      total += n;
    }
  }

  // Disconnects and device removal fail the connections concerned.
  int HandleCmEvents() {
    int handled = 0;
    while (std::optional<CmEvent> event = TryGetCmEvent(core_->cm_channel.get())) {
      ++handled;
      if (event->type != RDMA_CM_EVENT_DISCONNECTED &&
          event->type != RDMA_CM_EVENT_DEVICE_REMOVAL) {
        continue;
      }
      // Completions that arrived before the disconnect still count: deliver them first.
      PollCq();
      const auto handle = static_cast<uint32_t>(event->context);
      if (event->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        for (const auto& state : core_->All()) {
          state->FailWith(absl::UnavailableError(absl::StrCat("verbs connection to ", state->peer(),
                                                              " failed: RDMA device ", core_->name,
                                                              " was removed")));
        }
      } else if (std::shared_ptr<ConnState> state = core_->Find(handle)) {
        state->FailWith(absl::UnavailableError(
            absl::StrCat("verbs connection to ", state->peer(), ": the peer disconnected")));
      }
    }
    return handled;
  }

  void CheckTimeouts(absl::Time now) {
    for (const auto& state : core_->All()) state->CheckTimeout(now);
  }

  void ProgressOnce(absl::Duration max_block) {
    std::unique_lock<std::mutex> lock(progress_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      // Another thread is making progress for everyone; wait for it a little.
      base::WaitPolicy::AwaitOthersProgress(max_block);
      return;
    }
    int done = PollCq();
    const absl::Time now = absl::Now();
    // CM events and timeouts are rare: look at them at most once a millisecond, so that a
    // caller spinning on Poll pays for ibv_poll_cq (no system call) only.
    const bool slow =
        max_block > absl::ZeroDuration() || now - last_slow_check_ >= absl::Milliseconds(1);
    if (slow) {
      last_slow_check_ = now;
      done += HandleCmEvents();
      CheckTimeouts(now);
    }
    if (done > 0 || max_block <= absl::ZeroDuration()) return;

    // Nothing to do: sleep on the completion channel (armed first, then re-checked, so that a
    // completion landing in between is not slept through), the CM channel and the wake fd.
    ibv_req_notify_cq(core_->cq, 0);
    if (PollCq() > 0) return;
    pollfd fds[3] = {{core_->comp_channel->fd, POLLIN, 0},
                     {core_->cm_channel->fd, POLLIN, 0},
                     {wake_fd_, POLLIN, 0}};
    const timespec ts = absl::ToTimespec(std::min(max_block, absl::Milliseconds(100)));
    if (ppoll(fds, 3, &ts, nullptr) <= 0) return;
    if (fds[0].revents & POLLIN) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      unsigned events = 0;
      while (ibv_get_cq_event(core_->comp_channel, &cq, &context) == 0) ++events;
      if (events > 0) ibv_ack_cq_events(core_->cq, events);
      PollCq();
    }
    if (fds[1].revents & POLLIN) HandleCmEvents();
    if (fds[2].revents & POLLIN) {
      uint64_t value;
      if (read(wake_fd_, &value, sizeof value) < 0) {
        // Nothing to do: the fd is only a doorbell.
      }
    }
  }

  const std::shared_ptr<VerbsCore> core_;
  const int wake_fd_;
  std::mutex progress_mu_;
  absl::Time last_slow_check_ = absl::InfinitePast();
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Lists the RDMA devices; false with the reason when there is none or they cannot be opened.
bool ProbeVerbs(std::string* why_not) {
  if (!VerbsLibrariesLoaded(why_not)) return false;
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    const int err = errno;
    if (why_not) {
      *why_not = absl::StrCat(
          "no RDMA device: ibv_get_device_list failed: ", ErrnoText(err),
          err == ENOSYS ? " (the kernel has no RDMA support, or the ib_uverbs module is not loaded)"
                        : "");
    }
    return false;
  }
  std::string reason;
  if (count == 0) {
    reason =
        "no RDMA device found: ibv_get_device_list returned 0 devices (no InfiniBand, RoCE or "
        "iWARP NIC, or its kernel driver is not loaded; see `ibv_devices`)";
  } else {
    ibv_context* ctx = ibv_open_device(list[0]);
    if (ctx == nullptr) {
      reason = absl::StrCat("RDMA device ", ibv_get_device_name(list[0]),
                            " cannot be opened: ", ErrnoText(errno),
                            " (permissions on /dev/infiniband/uverbs*?)");
    } else {
      ibv_close_device(ctx);
    }
  }
  ibv_free_device_list(list);
  if (!reason.empty()) {
    if (why_not) *why_not = reason;
    return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<VerbsCore>> OpenCore(const DeviceOptions& options) {
  auto core = std::make_shared<VerbsCore>();
  core->options = options;
  int count = 0;
  core->devices = rdma_get_devices(&count);
  if (core->devices == nullptr || count == 0) {
    return absl::UnavailableError(
        absl::StrCat("librdmacm sees no RDMA device (rdma_get_devices: ", ErrnoText(errno),
                     "); is /dev/infiniband/rdma_cm present and the rdma_ucm module loaded?"));
  }
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back(ibv_get_device_name(core->devices[i]->device));
  const std::string& want = options.local_address;
  if (want.empty()) {
    core->ctx = core->devices[0];
  } else {
    for (int i = 0; i < count; ++i) {
      if (names[i] == want) core->ctx = core->devices[i];
    }
    if (core->ctx == nullptr) {
      // An IP: bind an id to it and see which device librdmacm attaches it to.
      absl::StatusOr<sockaddr_storage> addr = ResolveHostPort({want, 0});
      PLEXUS_ASSIGN_OR_RETURN(EventChannelPtr channel, CreateEventChannel());
      rdma_cm_id* id = nullptr;
      if (addr.ok() && rdma_create_id(channel.get(), &id, nullptr, RDMA_PS_TCP) == 0) {
        if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*addr)) == 0) core->ctx = id->verbs;
        rdma_destroy_id(id);
      }
      if (core->ctx == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("DeviceOptions.local_address '", want,
                         "' is neither an RDMA device name nor a local IP of one (devices: ",
                         absl::StrJoin(names, ", "), ")"));
      }
      core->ip = want;
      core->bind_to_ip = true;
    }
  }
  core->name = ibv_get_device_name(core->ctx->device);
  if (core->ip.empty()) core->ip = DeviceIp(core->name);
  if (ibv_query_device(core->ctx, &core->attr) != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_query_device on ", core->name, ": ", ErrnoText(errno)));
  }
  core->pd = ibv_alloc_pd(core->ctx);
  if (core->pd == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ibv_alloc_pd on ", core->name, ": ", ErrnoText(errno)));
  }
  core->comp_channel = ibv_create_comp_channel(core->ctx);
  if (core->comp_channel == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ibv_create_comp_channel on ", core->name, ": ", ErrnoText(errno)));
  }
  PLEXUS_RETURN_IF_ERROR(base::Annotate(base::net::SetNonBlocking(core->comp_channel->fd, true),
                                        "completion channel"));
  core->cq_capacity = std::min(core->attr.max_cqe, 65536);
  core->cq = ibv_create_cq(core->ctx, core->cq_capacity, nullptr, core->comp_channel, 0);
  if (core->cq == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_create_cq of ", core->cq_capacity,
                                               " entries on ", core->name, ": ", ErrnoText(errno)));
  }
  core->cq_capacity = core->cq->cqe;
  PLEXUS_ASSIGN_OR_RETURN(EventChannelPtr cm, CreateEventChannel());
  core->cm_channel = std::move(cm);

  ProtocolConfig& p = core->protocol;
  p.max_send_wr = std::min<uint32_t>(p.max_send_wr, static_cast<uint32_t>(core->attr.max_qp_wr));
  p.recv_slots = std::min<uint32_t>(p.recv_slots, static_cast<uint32_t>(core->attr.max_qp_wr));
  p.send_slots = std::min(p.send_slots, p.max_send_wr);
  p.max_message_bytes = options.max_message_bytes;
  p.op_timeout = options.op_timeout;
  PLEXUS_ASSIGN_OR_RETURN(HoldLimits held, ResolveHoldLimits(options));
  p.held_bytes_per_connection = held.per_connection;
  p.held_budget = std::make_shared<HoldBudget>(held.per_device);
  PLEXUS_RETURN_IF_ERROR(verbs::ValidateConfig(p));
  return core;
}

}  // namespace

bool VerbsAvailable(std::string* why_not) { return ProbeVerbs(why_not); }

absl::StatusOr<std::shared_ptr<Device>> CreateVerbsDevice(const DeviceOptions& options) {
  std::string why;
  if (!ProbeVerbs(&why)) return absl::UnavailableError(why);
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<VerbsCore> core, OpenCore(options));
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", ErrnoText(errno)));
  }
  return std::shared_ptr<Device>(std::make_shared<VerbsDevice>(options, std::move(core), wake_fd));
}

}  // namespace plexus::transport::internal
