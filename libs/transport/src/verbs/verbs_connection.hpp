// The verbs backend's shared device core, registered regions, and connections: one RC queue pair
// with its bounce pools and protocol (ConnState) behind the user's Connection. The device, its
// listener and the progress loop are in verbs_device.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/memory.hpp"
#include "verbs/protocol.hpp"
#include "verbs/slot_table.hpp"
#include "verbs/verbs_cm.hpp"
#include "verbs_path_info.hpp"

namespace plexus::transport::verbs {

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
  // `path`: the GID index and flow label of the queue pair (its local_address is already the
  // id's source). With either set, the connection owns its queue pair and the caller moves it
  // to RTR and RTS (EnterRtrRts) instead of librdmacm, so that the address vector can change.
  ConnState(std::shared_ptr<VerbsCore> core, rdma_cm_id* id, PathBinding path)
      : core_(std::move(core)),
        id_(id),
        config_(core_->protocol),
        path_(std::move(path)),
        own_qp_(path_.gid_index != -1 || path_.flow_label != 0) {}

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
                     CompletionQueue* cq);

  absl::Status Connected(const Hello& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return protocol_->Connected(peer, absl::Now());
  }

  rdma_cm_id* id() const { return id_; }

  // Whether the caller transitions the queue pair (a PathBinding with a GID or flow label): then
  // rdma_connect / rdma_accept carry qp_num() and the caller calls EnterRtrRts before
  // rdma_accept (passive) or after the connect response, before rdma_establish (active).
  bool owns_queue_pair() const { return own_qp_; }
  uint32_t qp_num() const { return qp_ ? qp_->qp_num : 0; }
  // As librdmacm would: INIT again with the connection's attributes, RTR with rdma_cm's
  // attributes plus the binding's flow label and source GID, then RTS.
  absl::Status EnterRtrRts();
  // ibv_query_qp of the queue pair.
  absl::StatusOr<internal::VerbsPathInfo> Describe();

  // Leaves the device table and destroys the queue pair; the bounce pools stay until the last
  // reference goes, and the hardware no longer touches them once the queue pair is destroyed.
  void Detach() {
    if (registered_.exchange(false)) core_->Remove(handle_, cq_entries());
    DestroyQueuePair();
  }

  void OnWorkCompletion(const ibv_wc& wc);

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
  absl::Status PostRecv(uint32_t wr_handle, uint32_t slot) override;

  absl::Status PostSendSlot(uint32_t wr_handle, uint32_t slot, uint32_t bytes) override;

  absl::Status PostWrite(uint32_t wr_handle, const verbs::WriteSegment& segment) override;

  void Abort(const absl::Status&) override;

 private:
  absl::Status PostSendWr(ibv_send_wr& wr);
  // "verbs path from <source> to <peer>", for errors.
  std::string PathName() const;
  // ibv_create_qp on the device's PD and CQ, then INIT (owns_queue_pair()).
  absl::Status CreateOwnQueuePair(ibv_qp_init_attr& attr);
  // ibv_modify_qp to `state` with rdma_init_qp_attr's attributes; RTR adds the binding's.
  absl::Status ModifyWithCmAttributes(int state);

  void DestroyQueuePair();

  const std::shared_ptr<VerbsCore> core_;
  rdma_cm_id* id_;
  const ProtocolConfig config_;
  const PathBinding path_;
  const bool own_qp_;
  std::optional<uint32_t> sgid_index_;  // the binding's source GID, when it overrides rdma_cm's
  bool infiniband_ = false;             // the port has IB GIDs only (no RoCE)
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
  const std::shared_ptr<ConnState>& shared_state() const { return state_; }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    return state_->WithProtocol(
        [&](Protocol& p) { return p.PostSend(buffers, wr_id, absl::Now()); });
  }

  absl::StatusOr<std::optional<size_t>> PeekNext(MutableBuffer head) override {
    return state_->WithProtocol(
        [&](Protocol& p) -> absl::StatusOr<std::optional<size_t>> { return p.PeekNext(head); });
  }
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    return state_->WithProtocol([&](Protocol& p) { return p.PostRecv(buffer, wr_id); });
  }
  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id) override {
    return state_->WithProtocol([&](Protocol& p) {
      return p.PostSendProduced(length, std::move(producer), wr_id, absl::Now());
    });
  }
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) override {
    return state_->WithProtocol(
        [&](Protocol& p) { return p.PostRecvConsumed(max_length, std::move(consumer), wr_id); });
  }

  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override;

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
// `path` sets the queue pair's GID index and flow label (ConnState).
absl::StatusOr<std::unique_ptr<VerbsConnection>> NewConnection(
    const std::shared_ptr<VerbsCore>& core, rdma_cm_id* id, CompletionQueue* cq,
    const PathBinding& path);

}  // namespace plexus::transport::verbs
