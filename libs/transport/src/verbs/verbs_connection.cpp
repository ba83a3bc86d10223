// See verbs_connection.hpp.
#include "verbs/verbs_connection.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "region_registry.hpp"
#include "verbs/verbs_loader.hpp"

namespace plexus::transport::verbs {

using base::net::ErrnoText;
using internal::CheckLocalRange;

absl::Status ConnState::Setup(const std::shared_ptr<ConnState>& self, uint64_t connection_id,
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
    return absl::ResourceExhaustedError(
        absl::StrCat("ibv_reg_mr of ", total, " bytes of bounce buffers failed: ", ErrnoText(errno),
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
  if (own_qp_) {
    PLEXUS_RETURN_IF_ERROR(CreateOwnQueuePair(attr));
  } else {
    if (rdma_create_qp(id_, core_->pd, &attr) != 0) {
      attr.cap.max_inline_data = 0;  // some devices have no inline sends
      if (rdma_create_qp(id_, core_->pd, &attr) != 0) {
        return absl::ResourceExhaustedError(absl::StrCat("rdma_create_qp on ", core_->name,
                                                         " for the connection to ", peer_,
                                                         " failed: ", ErrnoText(errno)));
      }
    }
    qp_ = id_->qp;
  }
  max_inline_ = attr.cap.max_inline_data;

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

namespace {

const char* QpStateName(int state) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return state >= 0 && state <= IBV_QPS_ERR ? kNames[state] : "?";
}

}  // namespace

std::string ConnState::PathName() const {
  return absl::StrCat("verbs path from ", SockaddrText(rdma_get_local_addr(id_)), " to ", peer_);
}

absl::Status ConnState::CreateOwnQueuePair(ibv_qp_init_attr& attr) {
  if (id_->verbs->device->transport_type != IBV_TRANSPORT_IB) {
    return absl::FailedPreconditionError(absl::StrCat(
        PathName(), ": RDMA device ", core_->name,
        " is not InfiniBand or RoCE (iWARP runs over TCP: no GID index or flow label applies); ",
        "leave gid_index -1 and flow_label 0"));
  }
  // The binding's source GID, checked against the port's table before anything is created.
  PLEXUS_ASSIGN_OR_RETURN(std::vector<GidEntry> table, QueryGidTable(id_->verbs));
  PLEXUS_ASSIGN_OR_RETURN(
      sgid_index_, SelectSourceGid(table, id_->port_num, SockaddrHost(rdma_get_local_addr(id_)),
                                   path_.gid_index, PathName()));
  infiniband_ = std::none_of(table.begin(), table.end(), [&](const GidEntry& e) {
    return e.port == id_->port_num && e.type != GidType::kIb;
  });
  ibv_qp* qp = ibv_create_qp(core_->pd, &attr);
  if (qp == nullptr) {
    attr.cap.max_inline_data = 0;  // some devices have no inline sends
    qp = ibv_create_qp(core_->pd, &attr);
  }
  if (qp == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("ibv_create_qp on ", core_->name, " for the ",
                                                     PathName(), " failed: ", ErrnoText(errno)));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    qp_ = qp;
  }
  // INIT with the port, P_Key and access flags rdma_cm chose for the id (as rdma_create_qp).
  return ModifyWithCmAttributes(IBV_QPS_INIT);
}

absl::Status ConnState::ModifyWithCmAttributes(int state) {
  ibv_qp_attr attr{};
  attr.qp_state = static_cast<ibv_qp_state>(state);
  int mask = 0;
  if (rdma_init_qp_attr(id_, &attr, &mask) != 0) {
    return absl::UnavailableError(absl::StrCat("rdma_init_qp_attr (", QpStateName(state),
                                               ") for the ", PathName(), ": ", ErrnoText(errno)));
  }
  if (state == IBV_QPS_RTR) {
    // As librdmacm's RTR: the connection parameters offer no RDMA READ resources, and on
    // InfiniBand the mask loses bits 21-23, which old rdma_ucm kernels reported for RoCE only.
    attr.max_dest_rd_atomic = 0;
    if (infiniband_) mask &= ~0xe00000;
    if (!attr.ah_attr.is_global) {
      return absl::FailedPreconditionError(absl::StrCat(
          PathName(), ": the route has no GRH (InfiniBand within one subnet), so neither ",
          "gid_index nor flow_label can apply; leave them -1 and 0 on this fabric"));
    }
    if (path_.flow_label != 0) attr.ah_attr.grh.flow_label = path_.flow_label;
    if (sgid_index_) attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(*sgid_index_);
  }
  if (state == IBV_QPS_RTS) attr.max_rd_atomic = 0;  // no RDMA READ is ever issued
  if (const int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "ibv_modify_qp to ", QpStateName(state), " for the ", PathName(), " (flow_label ",
        path_.flow_label, ", gid_index ", path_.gid_index, "): ", ErrnoText(rc)));
  }
  return absl::OkStatus();
}

absl::Status ConnState::EnterRtrRts() {
  if (!own_qp_ || qp_ == nullptr) {
    return absl::FailedPreconditionError("EnterRtrRts: librdmacm transitions this queue pair");
  }
  // The order of librdmacm's own transitions (ucma_modify_qp_rtr, _rts): INIT again first, with
  // the attributes the connection now has (the access flags that allow the peer's RDMA WRITEs
  // are known only once the CM exchange began), then RTR and RTS.
  PLEXUS_RETURN_IF_ERROR(ModifyWithCmAttributes(IBV_QPS_INIT));
  PLEXUS_RETURN_IF_ERROR(ModifyWithCmAttributes(IBV_QPS_RTR));
  return ModifyWithCmAttributes(IBV_QPS_RTS);
}

absl::StatusOr<internal::VerbsPathInfo> ConnState::Describe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (qp_ == nullptr || id_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("the queue pair to ", peer_, " is destroyed"));
  }
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc = ibv_query_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PORT, &init);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_query_qp on the connection to ", peer_, ": ", ErrnoText(rc)));
  }
  internal::VerbsPathInfo info;
  info.qp_num = qp_->qp_num;
  info.state = QpStateName(attr.qp_state);
  info.is_global = attr.ah_attr.is_global != 0;
  info.sgid_index = attr.ah_attr.grh.sgid_index;
  info.flow_label = attr.ah_attr.grh.flow_label;
  info.port = attr.port_num != 0 ? attr.port_num : id_->port_num;
  info.local_address = SockaddrText(rdma_get_local_addr(id_));
  return info;
}

void ConnState::OnWorkCompletion(const ibv_wc& wc) {
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

absl::Status ConnState::PostRecv(uint32_t wr_handle, uint32_t slot) {
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

absl::Status ConnState::PostSendSlot(uint32_t wr_handle, uint32_t slot, uint32_t bytes) {
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

absl::Status ConnState::PostWrite(uint32_t wr_handle, const verbs::WriteSegment& segment) {
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

void ConnState::Abort(const absl::Status&) {
  // Moves the queue pair to the error state (flushing every posted request) and tells the
  // peer, whose outstanding operations then fail too. librdmacm moves only the queue pairs it
  // created (rdma_create_qp); an own one is moved here.
  if (id_ != nullptr && qp_ != nullptr && !disconnect_sent_) {
    disconnect_sent_ = true;
    if (own_qp_) {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
    }
    rdma_disconnect(id_);
  }
}

absl::Status ConnState::PostSendWr(ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    return absl::InternalError(
        absl::StrCat("ibv_post_send on the connection to ", peer_, ": ", ErrnoText(rc)));
  }
  return absl::OkStatus();
}

void ConnState::DestroyQueuePair() {
  rdma_cm_id* id = nullptr;
  ibv_qp* qp = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(id, id_);
    std::swap(qp, qp_);
  }
  if (own_qp_ && qp != nullptr) ibv_destroy_qp(qp);
  if (id == nullptr) return;
  if (id->qp) rdma_destroy_qp(id);
  rdma_destroy_id(id);
}

absl::Status VerbsConnection::PostWrite(const MemoryRegion& local, size_t local_offset,
                                        size_t length, const RegionHandle& remote,
                                        size_t remote_offset, std::optional<uint32_t> immediate,
                                        uint64_t wr_id) {
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

// Wraps an id that is ready for a queue pair (route resolved, or a connect request) into a
// connection with its queue pair, bounce buffers and posted receives. On error the half-built
// connection is destroyed, which destroys the id as well.
absl::StatusOr<std::unique_ptr<VerbsConnection>> NewConnection(
    const std::shared_ptr<VerbsCore>& core, rdma_cm_id* id, CompletionQueue* cq,
    const PathBinding& path) {
  auto state = std::make_shared<ConnState>(core, id, path);
  auto connection = std::make_unique<VerbsConnection>(state, core.get());
  PLEXUS_RETURN_IF_ERROR(state->Setup(state, connection->id(), cq));
  return connection;
}

}  // namespace plexus::transport::verbs

namespace plexus::transport::internal {

absl::StatusOr<VerbsPathInfo> DescribeVerbsPath(const Connection& connection) {
  const auto* verbs = dynamic_cast<const verbs::VerbsConnection*>(&connection);
  if (verbs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("DescribeVerbsPath: the connection to ",
                                                   connection.peer_address(),
                                                   " is not a verbs connection"));
  }
  return verbs->shared_state()->Describe();
}

}  // namespace plexus::transport::internal
