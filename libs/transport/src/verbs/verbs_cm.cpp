// See verbs_cm.hpp.
#include "verbs/verbs_cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "verbs/verbs_loader.hpp"

namespace plexus::transport::verbs {

using base::net::ErrnoText;

// Work-request ids: the connection's handle in the device table (high half) and the
// descriptor's handle in the connection's protocol (low half), both generation-checked.
uint64_t MakeWrId(uint32_t connection, uint32_t descriptor) {
  return (uint64_t{connection} << 32) | descriptor;
}

absl::StatusOr<EventChannelPtr> CreateEventChannel() {
  EventChannelPtr channel(rdma_create_event_channel());
  if (!channel) {
    return absl::UnavailableError(
        absl::StrCat("rdma_create_event_channel failed: ", ErrnoText(errno),
                     " (is /dev/infiniband/rdma_cm present and accessible?)"));
  }
  PLEXUS_RETURN_IF_ERROR(
      base::Annotate(base::net::SetNonBlocking(channel->fd, true), "RDMA CM event channel"));
  return channel;
}

std::optional<CmEvent> TryGetCmEvent(rdma_event_channel* channel) {
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) return std::nullopt;  // EAGAIN: none pending
  CmEvent out;
  out.type = event->event;
  out.id = event->id;
  out.context = reinterpret_cast<uintptr_t>(event->id->context);
  out.status = event->status;
  const bool has_conn_param =
      event->event == RDMA_CM_EVENT_CONNECT_REQUEST || event->event == RDMA_CM_EVENT_ESTABLISHED ||
      event->event == RDMA_CM_EVENT_CONNECT_RESPONSE || event->event == RDMA_CM_EVENT_REJECTED;
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

std::string SockaddrHost(const sockaddr* addr) {
  if (addr == nullptr) return "";
  char host[INET6_ADDRSTRLEN] = "";
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, host, sizeof host);
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, host, sizeof host);
  }
  return host;
}

std::string SockaddrText(const sockaddr* addr) {
  const std::string host = SockaddrHost(addr);
  if (host.empty()) return "?";
  const uint16_t port = addr->sa_family == AF_INET
                            ? ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port)
                            : ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
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

absl::StatusOr<std::vector<GidEntry>> QueryGidTable(ibv_context* context) {
  // rdma-core returns -errno (the loader -1 with errno ENOSYS when the symbol is missing); the
  // call also fails while the buffer is smaller than the table, so it grows.
  int err = 0;
  for (size_t capacity : {size_t{256}, size_t{2048}, size_t{16384}}) {
    std::vector<ibv_gid_entry> raw(capacity);
    errno = 0;
    const ssize_t n = ibv_query_gid_table(context, raw.data(), raw.size(), 0);
    if (n < 0) {
      err = (n == -1 && errno == ENOSYS) ? ENOSYS : static_cast<int>(-n);
      if (err == ENOSYS) break;
      continue;
    }
    std::vector<GidEntry> out;
    for (ssize_t i = 0; i < n; ++i) {
      GidEntry e;
      e.index = raw[i].gid_index;
      e.port = raw[i].port_num;
      std::memcpy(e.gid.data(), raw[i].gid.raw, e.gid.size());
      e.type = raw[i].gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
               : raw[i].gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                         : GidType::kIb;
      out.push_back(e);
    }
    return out;
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot read the GID table of RDMA device ", ibv_get_device_name(context->device),
      " (ibv_query_gid_table: ", ErrnoText(err),
      "; it needs rdma-core 32 or newer), so a path's gid_index or flow_label cannot be set"));
}

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

}  // namespace plexus::transport::verbs
