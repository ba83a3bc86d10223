// Device buffers device to device (device_peers.hpp). Each call: every rank waits for its own
// device work (so its buffers hold what the caller wrote), publishes its buffers to every peer
// over the mailboxes (which also makes it the call's first barrier), maps the peers' buffers,
// and then
//   AllReduce: reduces its slice (count / n elements) of every rank's input with one kernel into
//              its own output, waits, barrier; copies every other slice from its owner's output,
//              waits, barrier;
//   Broadcast: copies the root's buffer, waits, barrier;
//   AllGather: copies every rank's block, waits, barrier.
// The last barrier keeps every buffer untouched until no peer reads it any more. Every result is
// the same bits on every rank: each slice is reduced once, by one rank, its inputs in rank order.
#include "device_peers.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "communicator_impl.hpp"
#include "cuda_staging.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::collectives::internal {
namespace {

constexpr size_t kMaxMappings = 64;

// This process among the host's: a random token (a pid may repeat across pid namespaces).
uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(getpid());
  }();
  return token;
}

// Other processes' allocations mapped into this one, by IPC handle.
class IpcMappings {
 public:
  static IpcMappings& Get() {
    static auto* mappings = new IpcMappings;  // never destroyed: mappings end with the process
    return *mappings;
  }

  absl::StatusOr<uint8_t*> Map(const base::cuda::IpcHandle& handle) {
    const std::string key(reinterpret_cast<const char*>(handle.bytes), sizeof(handle.bytes));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(key);
    if (it != mapped_.end()) {
      it->second.last_use = ++uses_;
      return it->second.base;
    }
    PLEXUS_ASSIGN_OR_RETURN(void* base, base::cuda::OpenIpc(handle));
    if (mapped_.size() >= kMaxMappings) {
      auto oldest = std::min_element(
          mapped_.begin(), mapped_.end(),
          [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
      base::cuda::CloseIpc(oldest->second.base).IgnoreError();
      mapped_.erase(oldest);
    }
    mapped_[key] = {static_cast<uint8_t*>(base), ++uses_};
    return static_cast<uint8_t*>(base);
  }

 private:
  struct Mapping {
    uint8_t* base = nullptr;
    uint64_t last_use = 0;
  };
  std::mutex mu_;
  std::map<std::string, Mapping> mapped_;
  uint64_t uses_ = 0;
};

}  // namespace

absl::Status DescribeDeviceBuffers(const void* send, const void* recv, DeviceBufferRecord* record) {
  record->process = ProcessToken();
  record->send = reinterpret_cast<uint64_t>(send);
  record->recv = reinterpret_cast<uint64_t>(recv);
  size_t offset = 0;
  if (send != nullptr) {
    PLEXUS_ASSIGN_OR_RETURN(record->send_handle, base::cuda::ExportIpc(send, &offset));
    record->send_offset = offset;
  }
  PLEXUS_ASSIGN_OR_RETURN(record->recv_handle, base::cuda::ExportIpc(recv, &offset));
  record->recv_offset = offset;
  return absl::OkStatus();
}

absl::StatusOr<PeerBuffers> MapDeviceBuffers(const DeviceBufferRecord& record) {
  PeerBuffers out;
  if (record.process == ProcessToken()) {
    out.send = reinterpret_cast<const uint8_t*>(record.send);
    out.recv = reinterpret_cast<uint8_t*>(record.recv);
    return out;
  }
  if (record.send != 0) {
    PLEXUS_ASSIGN_OR_RETURN(uint8_t * base, IpcMappings::Get().Map(record.send_handle));
    out.send = base + record.send_offset;
  }
  PLEXUS_ASSIGN_OR_RETURN(uint8_t * base, IpcMappings::Get().Map(record.recv_handle));
  out.recv = base + record.recv_offset;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The calls

bool CommunicatorImpl::UsesDevicePeers(const void* send, const void* recv,
                                       const CallOptions& call) const {
  if (!call.device_peer_access || layout_.n < 2 || layout_.n > kernels::kMaxDeviceReduceInputs ||
      !conns_.mailboxes_ready || recv == nullptr || !IsDevicePointer(recv)) {
    return false;
  }
  return send == nullptr || send == recv || IsDevicePointer(send);
}

absl::Status CommunicatorImpl::DeviceFailure(const CallHeader& header, const absl::Status& s,
                                             const char* what) {
  return Abort(header, Failure::Own(base::Annotate(
                           s, absl::StrCat("rank ", layout_.rank, ": ", what,
                                           " (CallOptions::device_peer_access = false stages "
                                           "device buffers through host memory instead)"))));
}

absl::Status CommunicatorImpl::DeviceBarrier(const CallHeader& header) {
  const int n = layout_.n, me = layout_.rank;
  uint8_t token = 0;
  for (int k = 1; k < n; ++k) {
    const MailInbound in{(me + n - k) % n, &token, /*reduce=*/false, /*src_first=*/false};
    PLEXUS_RETURN_IF_ERROR(
        MailExchange((me + k) % n, &token, in, 0, DataType::kU8, ReduceOp::kSum, header));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PeerBuffers>> CommunicatorImpl::ShareDeviceBuffers(
    const CallHeader& header, const void* send, const void* recv) {
  const int n = layout_.n, me = layout_.rank;
  // The caller's work on its buffers, on any stream of its context, is done before peers read.
  if (absl::Status s = base::cuda::Synchronize(); !s.ok()) {
    return DeviceFailure(header, s, "waiting for this rank's device work");
  }
  std::vector<DeviceBufferRecord> records(n);
  if (absl::Status s = DescribeDeviceBuffers(send, recv, &records[me]); !s.ok()) {
    return DeviceFailure(header, s, "sharing this rank's device buffers (CUDA IPC)");
  }
  for (int k = 1; k < n; ++k) {
    const int from = (me + n - k) % n;
    const MailInbound in{from, reinterpret_cast<uint8_t*>(&records[from]), false, false};
    PLEXUS_RETURN_IF_ERROR(
        MailExchange((me + k) % n, reinterpret_cast<const uint8_t*>(&records[me]), in,
                     sizeof(DeviceBufferRecord), DataType::kU8, ReduceOp::kSum, header));
  }
  std::vector<PeerBuffers> peers(n);
  for (int p = 0; p < n; ++p) {
    if (records[p].magic != DeviceBufferRecord::kMagic) {
      return DeviceFailure(header, absl::DataLossError("not a device buffer record"),
                           absl::StrCat("rank ", p, "'s device buffers").c_str());
    }
    absl::StatusOr<PeerBuffers> mapped = MapDeviceBuffers(records[p]);
    if (!mapped.ok()) {
      return DeviceFailure(header, mapped.status(),
                           absl::StrCat("mapping rank ", p, "'s device buffers").c_str());
    }
    peers[p] = *mapped;
  }
  return peers;
}

absl::Status CommunicatorImpl::DevicePeerAllReduce(const void* send, void* recv, size_t count,
                                                   DataType dtype, ReduceOp op,
                                                   const CallHeader& header) {
  const int n = layout_.n, me = layout_.rank;
  const size_t esize = DataTypeSize(dtype);
  PLEXUS_ASSIGN_OR_RETURN(std::vector<PeerBuffers> peers, ShareDeviceBuffers(header, send, recv));
  auto first = [&](int p) { return count * static_cast<size_t>(p) / static_cast<size_t>(n); };
  const size_t lo = first(me), len = first(me + 1) - lo;
  auto* out = static_cast<uint8_t*>(recv);
  if (len > 0) {
    std::vector<const void*> inputs(n);
    for (int p = 0; p < n; ++p) inputs[p] = peers[p].send + lo * esize;
    absl::Status s = kernels::ReduceOnDevice(dtype, op, out + lo * esize, inputs.data(), n, len);
    if (s.ok() && op == ReduceOp::kAvg)
      s = kernels::DivideOnDevice(dtype, out + lo * esize, len, n);
    if (s.ok()) s = base::cuda::Synchronize();
    if (!s.ok()) return DeviceFailure(header, s, "reducing this rank's slice on the device");
  }
  PLEXUS_RETURN_IF_ERROR(DeviceBarrier(header));
  for (int p = 0; p < n; ++p) {
    const size_t at = first(p) * esize, bytes = (first(p + 1) - first(p)) * esize;
    if (p == me || bytes == 0) continue;
    if (absl::Status s =
            base::cuda::Copy(out + at, peers[p].recv + at, bytes, "copying a peer's reduced slice");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading rank ", p, "'s slice").c_str());
    }
  }
  if (absl::Status s = base::cuda::Synchronize(); !s.ok()) {
    return DeviceFailure(header, s, "waiting for the copies of the peers' slices");
  }
  return DeviceBarrier(header);
}

absl::Status CommunicatorImpl::DevicePeerBroadcast(const void* send, void* recv, size_t count,
                                                   DataType dtype, int root,
                                                   const CallHeader& header) {
  const bool is_root = root == layout_.rank;
  const size_t bytes = count * DataTypeSize(dtype);
  PLEXUS_ASSIGN_OR_RETURN(std::vector<PeerBuffers> peers,
                          ShareDeviceBuffers(header, is_root ? send : nullptr, recv));
  const uint8_t* source = peers[root].send != nullptr ? peers[root].send : peers[root].recv;
  if (source != recv) {
    if (absl::Status s = base::cuda::Copy(recv, source, bytes, "copying the root's buffer");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading root ", root, "'s buffer").c_str());
    }
  }
  if (absl::Status s = base::cuda::Synchronize(); !s.ok()) {
    return DeviceFailure(header, s, "waiting for the copy of the root's buffer");
  }
  return DeviceBarrier(header);
}

absl::Status CommunicatorImpl::DevicePeerAllGather(const void* send, void* recv, size_t count,
                                                   DataType dtype, const CallHeader& header) {
  const int n = layout_.n;
  const size_t block = count * DataTypeSize(dtype);
  PLEXUS_ASSIGN_OR_RETURN(std::vector<PeerBuffers> peers, ShareDeviceBuffers(header, send, recv));
  auto* out = static_cast<uint8_t*>(recv);
  for (int p = 0; p < n; ++p) {
    uint8_t* dst = out + static_cast<size_t>(p) * block;
    if (peers[p].send == dst) continue;  // this rank's own block, in place
    if (absl::Status s = base::cuda::Copy(dst, peers[p].send, block, "copying a peer's block");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading rank ", p, "'s block").c_str());
    }
  }
  if (absl::Status s = base::cuda::Synchronize(); !s.ok()) {
    return DeviceFailure(header, s, "waiting for the copies of the peers' blocks");
  }
  return DeviceBarrier(header);
}

}  // namespace plexus::collectives::internal
