// The verbs backend's connection-manager and kernel helpers: CM event channels and events,
// addresses, work-completion errors, the ACK timeout, and the IP of an RDMA device. They only
// talk to librdmacm and libibverbs (loaded at run time, verbs_loader.hpp); every protocol decision
// lives in protocol.hpp.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "verbs/path_gid.hpp"
#include "verbs/protocol.hpp"

namespace plexus::transport::verbs {

// Work-request ids: the connection's handle in the device table (high half) and the
// descriptor's handle in the connection's protocol (low half), both generation-checked.
uint64_t MakeWrId(uint32_t connection, uint32_t descriptor);

struct EventChannelDeleter {
  void operator()(rdma_event_channel* channel) const { rdma_destroy_event_channel(channel); }
};
using EventChannelPtr = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;

absl::StatusOr<EventChannelPtr> CreateEventChannel();

// A CM event copied out and acknowledged at once, so that rdma_destroy_id never waits on it.
struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  rdma_cm_id* id = nullptr;
  uintptr_t context = 0;  // id->context, read before the ack lets another thread destroy the id
  int status = 0;
  std::vector<uint8_t> private_data;
};

std::optional<CmEvent> TryGetCmEvent(rdma_event_channel* channel);

// Waits for the next CM event on `channel` until `deadline`; nullopt on timeout.
std::optional<CmEvent> WaitCmEvent(rdma_event_channel* channel, absl::Time deadline);

std::string SockaddrText(const sockaddr* addr);
// The IP of a socket address from librdmacm, without the port ("" when null or another family).
std::string SockaddrHost(const sockaddr* addr);

// "ip:port" of a socket address from librdmacm ("?" when null or of another family).
absl::StatusOr<sockaddr_storage> ResolveHostPort(const HostPort& hp);

const char* CmEventName(rdma_cm_event_type type);

// The verbs status of a failed work completion, as a Status naming the peer.
absl::Status WorkCompletionError(const ibv_wc& wc, const std::string& peer);

// librdmacm's ACK timeout exponent: 4.096 us * 2^t per try, 8 tries (retry_count 7); the
// largest t whose total stays within half of op_timeout, so that a dead peer surfaces as
// IBV_WC_RETRY_EXC_ERR before the protocol's own op_timeout.
uint8_t AckTimeoutExponent(absl::Duration op_timeout);

// The first IP of the network interfaces of RDMA device `name` (RoCE netdev or IPoIB).
std::string DeviceIp(const std::string& name);

// Every valid GID entry of the device (ibv_query_gid_table), as path_gid.hpp's entries;
// Unavailable naming the device when the table cannot be read (rdma-core older than 32).
absl::StatusOr<std::vector<GidEntry>> QueryGidTable(ibv_context* context);

// The connection parameters that carry the Hello in the CM private data.
struct ConnParamStorage {
  std::array<uint8_t, kHelloBytes> hello;
  rdma_conn_param param{};
};

void FillConnParam(const Hello& hello, ConnParamStorage& out);

}  // namespace plexus::transport::verbs
