// The verbs backend: RC queue pairs set up with librdmacm, one protection domain and one shared
// completion queue (with a completion channel, so the progress thread sleeps) per device. All
// protocol decisions live in protocol.hpp; this file only talks to libibverbs / librdmacm.
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
#include "plexus/base/status.hpp"
#include "region_registry.hpp"
#include "verbs/protocol.hpp"
#include "verbs/slot_table.hpp"
#include "verbs/verbs_loader.hpp"

namespace plexus::transport::internal {
namespace {

using verbs::Hello;
using verbs::Protocol;
using verbs::ProtocolConfig;

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// Work-request ids: the connection's handle in the device table (high half) and the
// descriptor's handle in the connection's protocol (low half), both generation-checked.
uint64_t MakeWrId(uint32_t connection, uint32_t descriptor) {
  return (uint64_t{connection} << 32) | descriptor;
}

// Sets O_NONBLOCK so that the progress loop can drain a channel without blocking in it.
absl::Status SetNonBlocking(int fd, const char* what) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(
        absl::StrCat("fcntl(O_NONBLOCK) on the ", what, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

struct EventChannelDeleter {
  void operator()(rdma_event_channel* channel) const { rdma_destroy_event_channel(channel); }
};
using EventChannelPtr = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;

absl::StatusOr<EventChannelPtr> CreateEventChannel() {
  EventChannelPtr channel(rdma_create_event_channel());
  if (!channel) {
    return absl::UnavailableError(
        absl::StrCat("rdma_create_event_channel failed: ", ErrnoText(errno),
                     " (is /dev/infiniband/rdma_cm present and accessible?)"));
  }
  PLEXUS_RETURN_IF_ERROR(SetNonBlocking(channel->fd, "RDMA CM event channel"));
  return channel;
}

// A CM event copied out and acknowledged at once, so that rdma_destroy_id never waits on it.
struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  rdma_cm_id* id = nullptr;
  uintptr_t context = 0;  // id->context, read before the ack lets another thread destroy the id
  int status = 0;
  std::vector<uint8_t> private_data;
};

std::optional<CmEvent> TryGetCmEvent(rdma_event_channel* channel) {
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) return std::nullopt;  // EAGAIN: none pending
  CmEvent out;
  out.type = event->event;
  out.id = event->id;
  out.context = reinterpret_cast<uintptr_t>(event->id->context);
  out.status = event->status;
  const bool has_conn_param = event->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
                              event->event == RDMA_CM_EVENT_ESTABLISHED ||
                              event->event == RDMA_CM_EVENT_REJECTED;
  if (has_conn_param && event->param.conn.private_data != nullptr) {
    const auto* p = static_cast<const uint8_t*>(event->param.conn.private_data);
    out.private_data.assign(p, p + event->param.conn.private_data_len);
  }
  rdma_ack_cm_event(event);
  return out;
}

// Waits for the next CM event on `channel` until `deadline`; nullopt on timeout.
std::optional<CmEvent> WaitCmEvent(rdma_event_channel* channel, absl::Time deadline) {
  for (;;) {
    if (std::optional<CmEvent> event = TryGetCmEvent(channel)) return event;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    pollfd pfd{channel->fd, POLLIN, 0};
    const int ms = left == absl::InfiniteDuration()
                       ? 1000
                       : static_cast<int>(std::min<int64_t>(
                             1000, std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    poll(&pfd, 1, ms);
  }
}

std::string SockaddrText(const sockaddr* addr) {
  if (addr == nullptr) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return verbs::FormatHostPort(host, port);
}

absl::StatusOr<sockaddr_storage> ResolveHostPort(const verbs::HostPort& hp) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", hp.host, "': ", gai_strerror(rc)));
  }
  sockaddr_storage out{};
  std::memcpy(&out, result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  return out;
}

const char* CmEventName(rdma_cm_event_type type) { return rdma_event_str(type); }

// The verbs status of a failed work completion, as a Status naming the peer.
absl::Status WorkCompletionError(const ibv_wc& wc, const std::string& peer) {
  const std::string text =
      absl::StrCat("verbs connection to ", peer, " failed: work completion error '",
                   ibv_wc_status_str(wc.status), "' (status ", static_cast<int>(wc.status),
                   ", vendor error 0x", absl::Hex(wc.vendor_err), ")");
  switch (wc.status) {
    case IBV_WC_WR_FLUSH_ERR:
      return absl::UnavailableError(absl::StrCat(
          text,
          ": the queue pair went to the error state (peer disconnected or an earlier error)"));
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return absl::UnavailableError(absl::StrCat(text, ": the peer stopped answering"));
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return absl::PermissionDeniedError(
          absl::StrCat(text, ": a memory region key or range was refused"));
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

// librdmacm's ACK timeout exponent: 4.096 us * 2^t per try, 8 tries (retry_count 7); the
// largest t whose total stays within half of op_timeout, so that a dead peer surfaces as
// IBV_WC_RETRY_EXC_ERR before the protocol's own op_timeout.
uint8_t AckTimeoutExponent(absl::Duration op_timeout) {
  const double budget_us = absl::ToDoubleMicroseconds(op_timeout) / 2 / 8;
  int t = static_cast<int>(std::floor(std::log2(std::max(budget_us / 4.096, 1.0))));
  return static_cast<uint8_t>(std::clamp(t, 10, 22));
}

// The first IP of the network interfaces of RDMA device `name` (RoCE netdev or IPoIB).
std::string DeviceIp(const std::string& name) {
  std::vector<std::string> netdevs;
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::path("/sys/class/infiniband") / name / "device" / "net";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    netdevs.push_back(entry.path().filename().string());
  }
  ifaddrs* list = nullptr;
  if (netdevs.empty() || getifaddrs(&list) != 0) return "";
  std::string v4, v6;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr ||
        std::find(netdevs.begin(), netdevs.end(), a->ifa_name) == netdevs.end()) {
      continue;
    }
    char host[INET6_ADDRSTRLEN] = "";
    if (a->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, host, sizeof host);
      v4 = host;
    } else if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const auto* in6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      v6 = host;
    }
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

class ConnState;

// What the device, its connections and its regions share; destroyed after the last of them.
class VerbsCore {
 public:
  ~VerbsCore() {
    if (cq) ibv_destroy_cq(cq);
    if (comp_channel) ibv_destroy_comp_channel(comp_channel);
    if (pd) ibv_dealloc_pd(pd);
    cm_channel.reset();
    if (devices) rdma_free_devices(devices);
  }

  // Adds a connection; its work requests then carry the returned handle.
  absl::StatusOr<uint32_t> Add(std::shared_ptr<ConnState> state, uint32_t cq_entries) {
    std::lock_guard<std::mutex> lock(mu);
    if (cq_reserved + cq_entries > static_cast<uint32_t>(cq_capacity)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("RDMA device ", name, ": the shared completion queue (", cq_capacity,
                       " entries) has no room for another connection; close some connections"));
    }
    std::optional<uint32_t> handle = connections.Insert(std::move(state));
    if (!handle) return absl::ResourceExhaustedError("too many verbs connections on this device");
    cq_reserved += cq_entries;
    return *handle;
  }
  void Remove(uint32_t handle, uint32_t cq_entries) {
    std::lock_guard<std::mutex> lock(mu);
    if (connections.Take(handle)) cq_reserved -= cq_entries;
  }
  std::shared_ptr<ConnState> Find(uint32_t handle) {
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<ConnState>* state = connections.Find(handle);
    return state ? *state : nullptr;
  }
  std::vector<std::shared_ptr<ConnState>> All() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::shared_ptr<ConnState>> out;
    connections.ForEach([&](uint32_t, std::shared_ptr<ConnState>& s) { out.push_back(s); });
    return out;
  }

  DeviceOptions options;
  ibv_context** devices = nullptr;  // rdma_get_devices(); owns nothing but the array
  ibv_context* ctx = nullptr;
  std::string name;
  std::string ip;           // where peers reach this device ("" when unknown)
  bool bind_to_ip = false;  // local_address named an IP: bind outgoing connections to it
  ibv_device_attr attr{};
  ibv_pd* pd = nullptr;
  ibv_comp_channel* comp_channel = nullptr;
  ibv_cq* cq = nullptr;
  int cq_capacity = 0;
  EventChannelPtr cm_channel;  // CM events of established connections
  std::atomic<uint64_t> next_region_id{1};
  ProtocolConfig protocol;

 private:
  std::mutex mu;
  uint32_t cq_reserved = 0;
  verbs::SlotTable<std::shared_ptr<ConnState>> connections{1 << 16};
};

class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(std::shared_ptr<VerbsCore> core, ibv_mr* mr, void* data, size_t size, MemoryKind kind,
              RegionHandle handle)
      : MemoryRegion(data, size, kind, handle, mr->lkey), core_(std::move(core)), mr_(mr) {}
  ~VerbsRegion() override { ibv_dereg_mr(mr_); }
  const VerbsCore* core() const { return core_.get(); }

 private:
  std::shared_ptr<VerbsCore> core_;
  ibv_mr* mr_;
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// One queue pair and its protocol. Shared by the user's Connection and, while it dispatches a
// completion, the progress loop; every member below `mu` is guarded by it.
class ConnState final : public verbs::Wire {
 public:
  ConnState(std::shared_ptr<VerbsCore> core, rdma_cm_id* id)
      : core_(std::move(core)), id_(id), config_(core_->protocol) {}

  ~ConnState() override {
    DestroyQueuePair();
    if (send_mr_) ibv_dereg_mr(send_mr_);
    if (recv_mr_) ibv_dereg_mr(recv_mr_);
  }

  uint32_t cq_entries() const { return config_.recv_slots + config_.max_send_wr; }
  const std::string& peer() const { return peer_; }
  Hello local_hello() const { return {config_.recv_slots, config_.slot_bytes}; }

  // Registers the bounce pools, creates the queue pair, enters the device table and posts the
  // receives. `id` must have its route (active side) or be a connect request (passive side).
  absl::Status Setup(const std::shared_ptr<ConnState>& self, uint64_t connection_id,
                     CompletionQueue* cq) {
    peer_ = SockaddrText(rdma_get_peer_addr(id_));
    if (id_->verbs != core_->ctx) {
      return absl::InvalidArgumentError(absl::StrCat(
          "peer ", peer_, " is reached through RDMA device ",
          id_->verbs ? ibv_get_device_name(id_->verbs->device) : "?", ", not this device's ",
          core_->name, "; choose the device with DeviceOptions.local_address"));
    }
    const size_t send_bytes = size_t{config_.send_slots} * config_.slot_bytes;
    const size_t recv_bytes = size_t{config_.recv_slots} * config_.slot_bytes;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t total = (send_bytes + recv_bytes + page - 1) / page * page;
    pool_.reset(static_cast<uint8_t*>(std::aligned_alloc(page, total)));
    if (!pool_) return absl::ResourceExhaustedError("cannot allocate verbs bounce buffers");
    std::memset(pool_.get(), 0, total);
    const int access = IBV_ACCESS_LOCAL_WRITE;
    send_mr_ = ibv_reg_mr(core_->pd, pool_.get(), send_bytes, access);
    recv_mr_ =
        send_mr_ ? ibv_reg_mr(core_->pd, pool_.get() + send_bytes, recv_bytes, access) : nullptr;
    if (!send_mr_ || !recv_mr_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ibv_reg_mr of ", total, " bytes of bounce buffers failed: ", ErrnoText(errno),
          " (locked-memory limit too low? check `ulimit -l`)"));
    }

    ibv_qp_init_attr attr{};
    attr.send_cq = core_->cq;
    attr.recv_cq = core_->cq;
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = config_.max_send_wr;
    attr.cap.max_recv_wr = config_.recv_slots;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = 64;
    if (rdma_create_qp(id_, core_->pd, &attr) != 0) {
      attr.cap.max_inline_data = 0;  // some devices have no inline sends
      if (rdma_create_qp(id_, core_->pd, &attr) != 0) {
        return absl::ResourceExhaustedError(absl::StrCat("rdma_create_qp on ", core_->name,
                                                         " for the connection to ", peer_,
                                                         " failed: ", ErrnoText(errno)));
      }
    }
    max_inline_ = attr.cap.max_inline_data;
    qp_ = id_->qp;

    PLEXUS_ASSIGN_OR_RETURN(uint32_t handle, core_->Add(self, cq_entries()));
    handle_ = handle;
    registered_ = true;
    id_->context = reinterpret_cast<void*>(static_cast<uintptr_t>(handle_));

    std::lock_guard<std::mutex> lock(mu_);
    protocol_.emplace(config_, absl::MakeSpan(pool_.get(), send_bytes),
                      absl::MakeSpan(pool_.get() + send_bytes, recv_bytes), this, cq, connection_id,
                      peer_);
    return protocol_->Start();
  }

  absl::Status Connected(const Hello& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return protocol_->Connected(peer, absl::Now());
  }

  rdma_cm_id* id() const { return id_; }

  // Leaves the device table and destroys the queue pair; the bounce pools stay until the last
  // reference goes, and the hardware no longer touches them once the queue pair is destroyed.
  void Detach() {
    if (registered_.exchange(false)) core_->Remove(handle_, cq_entries());
    DestroyQueuePair();
  }

  void OnWorkCompletion(const ibv_wc& wc) {
    verbs::WireCompletion c;
    if (wc.status != IBV_WC_SUCCESS) {
      c.status = WorkCompletionError(wc, peer_);
    } else {
      c.byte_len = wc.byte_len;
      if (wc.wc_flags & IBV_WC_WITH_IMM) c.immediate = verbs::ImmediateFromWire(wc.imm_data);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (protocol_) protocol_->OnCompletion(static_cast<uint32_t>(wc.wr_id), c, absl::Now());
  }

  void FailWith(const absl::Status& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (protocol_) protocol_->Fail(reason);
  }

  void CheckTimeout(absl::Time now) {
    std::lock_guard<std::mutex> lock(mu_);
    if (protocol_) protocol_->CheckTimeout(now);
  }

  template <typename Fn>
  auto WithProtocol(Fn&& fn) -> decltype(fn(std::declval<Protocol&>())) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!protocol_) return absl::FailedPreconditionError("verbs connection is not set up");
    return fn(*protocol_);
  }

  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return protocol_ ? protocol_->status() : absl::FailedPreconditionError("not connected");
  }

  // verbs::Wire, called by the protocol with mu_ held.
  absl::Status PostRecv(uint32_t wr_handle, uint32_t slot) override {
    if (qp_ == nullptr) return absl::CancelledError("the queue pair is destroyed");
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(recv_mr_->addr) + uint64_t{slot} * config_.slot_bytes;
    sge.length = config_.slot_bytes;
    sge.lkey = recv_mr_->lkey;
    ibv_recv_wr wr{};
    wr.wr_id = MakeWrId(handle_, wr_handle);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
      return absl::InternalError(
          absl::StrCat("ibv_post_recv on the connection to ", peer_, ": ", ErrnoText(rc)));
    }
    return absl::OkStatus();
  }

  absl::Status PostSendSlot(uint32_t wr_handle, uint32_t slot, uint32_t bytes) override {
    if (qp_ == nullptr) return absl::CancelledError("the queue pair is destroyed");
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(send_mr_->addr) + uint64_t{slot} * config_.slot_bytes;
    sge.length = bytes;
    sge.lkey = send_mr_->lkey;
    ibv_send_wr wr{};
    wr.wr_id = MakeWrId(handle_, wr_handle);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | (bytes <= max_inline_ ? IBV_SEND_INLINE : 0);
    return PostSendWr(wr);
  }

  absl::Status PostWrite(uint32_t wr_handle, const verbs::WriteSegment& segment) override {
    if (qp_ == nullptr) return absl::CancelledError("the queue pair is destroyed");
    ibv_sge sge{};
    sge.addr = segment.local_addr;
    sge.length = segment.length;
    sge.lkey = segment.lkey;
    ibv_send_wr wr{};
    wr.wr_id = MakeWrId(handle_, wr_handle);
    wr.sg_list = segment.length > 0 ? &sge : nullptr;
    wr.num_sge = segment.length > 0 ? 1 : 0;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = segment.remote_addr;
    wr.wr.rdma.rkey = segment.rkey;
    if (segment.immediate) {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = verbs::ImmediateToWire(*segment.immediate);
    } else {
      wr.opcode = IBV_WR_RDMA_WRITE;
    }
    return PostSendWr(wr);
  }

  void Abort(const absl::Status&) override {
    // Moves the queue pair to the error state (flushing every posted request) and tells the
    // peer, whose outstanding operations then fail too.
    if (id_ != nullptr && qp_ != nullptr && !disconnect_sent_) {
      disconnect_sent_ = true;
      rdma_disconnect(id_);
    }
  }

 private:
  absl::Status PostSendWr(ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      return absl::InternalError(
          absl::StrCat("ibv_post_send on the connection to ", peer_, ": ", ErrnoText(rc)));
    }
    return absl::OkStatus();
  }

  void DestroyQueuePair() {
    rdma_cm_id* id = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::swap(id, id_);
      qp_ = nullptr;
    }
    if (id == nullptr) return;
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }

  const std::shared_ptr<VerbsCore> core_;
  rdma_cm_id* id_;
  const ProtocolConfig config_;
  std::string peer_;
  std::unique_ptr<uint8_t, FreeDeleter> pool_;
  ibv_mr* send_mr_ = nullptr;
  ibv_mr* recv_mr_ = nullptr;
  uint32_t max_inline_ = 0;
  uint32_t handle_ = 0;
  std::atomic<bool> registered_{false};

  std::mutex mu_;
  ibv_qp* qp_ = nullptr;
  bool disconnect_sent_ = false;
  std::optional<Protocol> protocol_;
};

class VerbsConnection final : public Connection {
 public:
  VerbsConnection(std::shared_ptr<ConnState> state, const VerbsCore* core)
      : state_(std::move(state)), core_(core) {}
  ~VerbsConnection() override { Close(); }

  ConnState& state() { return *state_; }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    return state_->WithProtocol(
        [&](Protocol& p) { return p.PostSend(buffers, wr_id, absl::Now()); });
  }

  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    return state_->WithProtocol([&](Protocol& p) { return p.PostRecv(buffer, wr_id); });
  }

  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    const auto* region = dynamic_cast<const VerbsRegion*>(&local);
    if (region == nullptr || region->core() != core_) {
      return absl::InvalidArgumentError(
          "PostWrite: the local region was not registered with this verbs device");
    }
    PLEXUS_RETURN_IF_ERROR(CheckLocalRange(local, local_offset, length));
    if (remote.backend != Backend::kVerbs) {
      return absl::InvalidArgumentError(
          absl::StrCat("PostWrite: the remote region handle belongs to the ",
                       std::string(BackendName(remote.backend)), " backend, not verbs"));
    }
    if (remote_offset > remote.length || length > remote.length - remote_offset) {
      return absl::OutOfRangeError(absl::StrCat("PostWrite: ", length, " bytes at offset ",
                                                remote_offset, " exceed the remote region of ",
                                                remote.length, " bytes"));
    }
    verbs::WriteRequest request;
    request.local_addr = reinterpret_cast<uintptr_t>(local.data()) + local_offset;
    request.lkey = local.lkey();
    request.remote_addr = remote.address + remote_offset;
    request.rkey = remote.rkey;
    request.length = length;
    request.immediate = immediate;
    return state_->WithProtocol(
        [&](Protocol& p) { return p.PostWrite(request, wr_id, absl::Now()); });
  }

  void Close() override {
    state_->FailWith(absl::CancelledError(
        absl::StrCat("the verbs connection to ", state_->peer(), " was closed")));
    state_->Detach();
  }

  absl::Status status() const override { return state_->status(); }
  std::string peer_address() const override { return state_->peer(); }

 private:
  std::shared_ptr<ConnState> state_;
  const VerbsCore* core_;
};

// Wraps an id that is ready for a queue pair (route resolved, or a connect request) into a
// connection with its queue pair, bounce buffers and posted receives. On error the half-built
// connection is destroyed, which destroys the id as well.
absl::StatusOr<std::unique_ptr<VerbsConnection>> NewConnection(
    const std::shared_ptr<VerbsCore>& core, rdma_cm_id* id, CompletionQueue* cq) {
  auto state = std::make_shared<ConnState>(core, id);
  auto connection = std::make_unique<VerbsConnection>(state, core.get());
  PLEXUS_RETURN_IF_ERROR(state->Setup(state, connection->id(), cq));
  return connection;
}

struct ConnParamStorage {
  std::array<uint8_t, verbs::kHelloBytes> hello;
  rdma_conn_param param{};
};

void FillConnParam(const Hello& hello, ConnParamStorage& out) {
  out.hello = verbs::EncodeHello(hello);
  out.param = rdma_conn_param{};
  out.param.private_data = out.hello.data();
  out.param.private_data_len = static_cast<uint8_t>(out.hello.size());
  out.param.responder_resources = 0;  // no RDMA READ or atomics are ever issued
  out.param.initiator_depth = 0;
  out.param.retry_count = 7;
  out.param.rnr_retry_count = 7;  // infinite: a safety net under the credit flow control
}

class VerbsListener final : public Listener {
 public:
  VerbsListener(std::shared_ptr<VerbsCore> core, EventChannelPtr channel, rdma_cm_id* id,
                std::string address)
      : core_(std::move(core)),
        channel_(std::move(channel)),
        id_(id),
        address_(std::move(address)) {}

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
    absl::StatusOr<std::unique_ptr<VerbsConnection>> connection = NewConnection(core_, id, cq);
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
    verbs::HostPort where;
    if (address.empty()) {
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
        core_, std::move(channel), id, verbs::FormatHostPort(host, port)));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    PLEXUS_ASSIGN_OR_RETURN(verbs::HostPort where, verbs::ParseHostPort(address));
    if (where.port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Connect: '", std::string(address), "' has port 0"));
    }
    const std::string target = verbs::FormatHostPort(where.host, where.port);
    PLEXUS_ASSIGN_OR_RETURN(sockaddr_storage dst, ResolveHostPort(where));
    std::optional<sockaddr_storage> src;
    if (core_->bind_to_ip) {
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
    absl::StatusOr<std::unique_ptr<VerbsConnection>> created = NewConnection(core_, id, cq);
    if (!created.ok()) return fail(created.status());
    connection = std::move(*created);
    ConnParamStorage param;
    FillConnParam(connection->state().local_hello(), param);
    if (rdma_connect(id, &param.param) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("rdma_connect: ", ErrnoText(errno))));
    }
    absl::StatusOr<CmEvent> established = expect(RDMA_CM_EVENT_ESTABLISHED);
    if (!established.ok()) return fail(established.status());
    absl::StatusOr<Hello> hello = verbs::DecodeHello(established->private_data);
    if (!hello.ok()) return fail(hello.status());
    if (absl::Status s = connection->state().Connected(*hello); !s.ok()) return fail(s);
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
      if (max_block > absl::ZeroDuration()) {
        std::this_thread::sleep_for(
            absl::ToChronoNanoseconds(std::min(max_block, absl::Microseconds(50))));
      }
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
  PLEXUS_RETURN_IF_ERROR(SetNonBlocking(core->comp_channel->fd, "completion channel"));
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
