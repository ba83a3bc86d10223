#include "peer_transport.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives::internal {
namespace {

// Drives `cq` until the completion on connection `conn_id` (set-up runs nothing else).
absl::Status AwaitSetup(transport::CompletionQueue* cq, uint64_t conn_id, absl::Time deadline,
                        const std::string& what) {
  for (;;) {
    absl::StatusOr<transport::Completion> c =
        cq->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!c.ok()) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    if (c->connection_id != conn_id) continue;
    if (!c->status.ok()) {
      return absl::UnavailableError(absl::StrCat(what, ": ", std::string(c->status.message())));
    }
    return absl::OkStatus();
  }
}

}  // namespace

transport::Backend PairBackend(TransportPolicy policy, transport::Backend base,
                               std::string_view host_a, std::string_view host_b) {
  if (policy == TransportPolicy::kUniform || base == transport::Backend::kInproc) return base;
  if (host_a == host_b) return transport::Backend::kShm;
  return base == transport::Backend::kShm ? transport::Backend::kTcp : base;
}

absl::StatusOr<TransportPolicy> ParseTransportPolicy(std::string_view text) {
  if (text == "per_peer") return TransportPolicy::kPerPeer;
  if (text == "uniform") return TransportPolicy::kUniform;
  return absl::InvalidArgumentError(
      absl::StrCat("transport policy '", std::string(text), "' is not per_peer or uniform"));
}

absl::StatusOr<PeerListeners> ListenForPeers(int rank,
                                             absl::Span<transport::Device* const> device_of,
                                             std::string_view local_address) {
  const int size = static_cast<int>(device_of.size());
  PeerListeners out;
  // One listener per distinct device; the published record is "backend=address;...".
  std::vector<std::string> published;
  for (int r = 0; r < size; ++r) {
    transport::Device* d = device_of[r];
    if (r == rank || d == nullptr) continue;  // this rank, or a pair left alone
    auto it = std::find(out.devices.begin(), out.devices.end(), d);
    size_t i = it - out.devices.begin();
    if (it == out.devices.end()) {
      out.devices.push_back(d);
      const bool bind = !local_address.empty() && d->backend() == transport::Backend::kTcp;
      absl::StatusOr<std::unique_ptr<transport::Listener>> listening =
          d->Listen(bind ? base::net::JoinHostPort(local_address, 0) : std::string());
      if (!listening.ok()) {
        return absl::Status(
            listening.status().code(),
            absl::StrCat("rank ", rank, " listening",
                         bind ? absl::StrCat(" on ", std::string(local_address)) : "", ": ",
                         std::string(listening.status().message())));
      }
      std::unique_ptr<transport::Listener> listener = *std::move(listening);
      published.push_back(absl::StrCat(std::string(transport::BackendName(d->backend())), "=",
                                       listener->address()));
      out.listeners.push_back(std::move(listener));
      out.expected.push_back(0);
    }
    if (r > rank) ++out.expected[i];
  }
  out.record = absl::StrJoin(published, ";");
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<transport::Connection>>> ConnectListening(
    int rank, PeerListeners& listening, absl::Span<const std::string> records,
    absl::Span<transport::Device* const> device_of, transport::CompletionQueue* cq,
    absl::Time deadline, std::string_view local_address) {
  const int size = static_cast<int>(device_of.size());
  std::vector<std::unique_ptr<transport::Connection>> conns(size);
  if (size == 1) return conns;
  const std::vector<transport::Device*>& devices = listening.devices;
  std::vector<std::unique_ptr<transport::Listener>>& listeners = listening.listeners;
  std::vector<int>& expected = listening.expected;

  // Connect to every lower rank over its device and introduce ourselves.
  const uint32_t me = static_cast<uint32_t>(rank);
  for (int peer = 0; peer < rank; ++peer) {
    transport::Device* d = device_of[peer];
    if (d == nullptr) continue;  // a pair left alone
    const std::string backend(transport::BackendName(d->backend()));
    std::string address;
    for (absl::string_view entry : absl::StrSplit(records[peer], ';', absl::SkipEmpty())) {
      const std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
      if (kv.first == backend) address = kv.second;
    }
    if (address.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " reaches rank ", peer, " over ", backend, " but rank ", peer,
                       " listens on [", records[peer],
                       "] (ranks disagree on the transport policy or host identities)"));
    }
    const bool bind = !local_address.empty() && d->backend() == transport::Backend::kTcp;
    absl::StatusOr<std::unique_ptr<transport::Connection>> c =
        bind ? d->ConnectFrom(local_address, address, cq) : d->Connect(address, cq);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrCat("rank ", rank, " connecting to rank ", peer, " over ", backend,
                       bind ? absl::StrCat(" from ", std::string(local_address)) : "", ": ",
                       std::string(c.status().message())));
    }
    PLEXUS_RETURN_IF_ERROR((*c)->PostSend(transport::ConstBuffer{&me, sizeof me}, 0));
    PLEXUS_RETURN_IF_ERROR(AwaitSetup(cq, (*c)->id(), deadline,
                                      absl::StrCat("introducing rank ", rank, " to rank ", peer)));
    conns[peer] = *std::move(c);
  }
  // Accept every higher rank, polling the listeners in turn; each peer says who it is.
  int left = 0;
  for (int r = rank + 1; r < size; ++r) left += device_of[r] != nullptr ? 1 : 0;
  auto missing = [&] {  // the higher ranks not connected yet, named in errors
    std::vector<int> out;
    for (int r = rank + 1; r < size; ++r) {
      if (conns[r] == nullptr && device_of[r] != nullptr) out.push_back(r);
    }
    return absl::StrCat("rank", out.size() == 1 ? " " : "s ", absl::StrJoin(out, ", "));
  };
  while (left > 0) {
    bool accepted = false;
    for (size_t i = 0; i < listeners.size(); ++i) {
      if (expected[i] == 0) continue;
      const absl::Duration wait =
          listeners.size() == 1 ? deadline - absl::Now() : absl::Milliseconds(5);
      absl::StatusOr<std::unique_ptr<transport::Connection>> c =
          listeners[i]->Accept(cq, std::max(wait, absl::ZeroDuration()));
      if (!c.ok()) {
        if (absl::IsDeadlineExceeded(c.status()) && absl::Now() < deadline) continue;
        return absl::Status(c.status().code(),
                            absl::StrCat("rank ", rank, " waiting for ", missing(),
                                         " to connect: ", std::string(c.status().message())));
      }
      uint32_t who = UINT32_MAX;
      PLEXUS_RETURN_IF_ERROR((*c)->PostRecv({&who, sizeof who}, 0));
      PLEXUS_RETURN_IF_ERROR(AwaitSetup(cq, (*c)->id(), deadline, "waiting for a peer's rank"));
      if (who <= me || who >= static_cast<uint32_t>(size) || conns[who] != nullptr ||
          device_of[who] != devices[i]) {
        return absl::DataLossError(absl::StrCat(
            "rank ", rank, " connection set-up: unexpected ", "peer rank ", who, " on its ",
            std::string(transport::BackendName(devices[i]->backend())), " listener"));
      }
      conns[who] = *std::move(c);
      --expected[i];
      --left;
      accepted = true;
    }
    if (!accepted && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank, " waiting for ", missing(), " to connect: timed out"));
    }
  }
  return conns;
}

void MultiDeviceDriver::Progress(absl::Duration max_block) {
  if (devices_.size() == 1) {  // the device's own progress, as its own queue would drive it
    devices_[0]->Progress(max_block);
    return;
  }
  for (size_t i = 0; i + 1 < devices_.size(); ++i) devices_[i]->Progress(absl::ZeroDuration());
  if (!devices_.empty()) {
    devices_.back()->Progress(std::min(max_block, absl::Microseconds(200)));
  }
}

void MultiDeviceDriver::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  for (transport::Device* d : devices_) d->Wake();
}

void MultiDeviceDriver::SetDevices(std::vector<transport::Device*> devices) {
  std::lock_guard<std::mutex> lock(mu_);
  devices_ = std::move(devices);
}

}  // namespace plexus::collectives::internal
