// Device buffers device to device (device_peers.hpp). Each call, in the context of its recv
// buffer (made current by the task): every rank publishes its buffers to every peer over the
// mailboxes, maps the peers' buffers, waits for its own device work (so that its buffers hold
// what the caller wrote) and votes: unless every rank could map every peer's buffers and found
// its own usable, every rank stages the call through the host instead (the same decision
// everywhere). Then, when every rank's buffers are on one GPU, one rank does all the device work
// and the others wait at the barrier: kernels of several processes on one GPU take turns by time
// slices, and each switch between them costs hundreds of microseconds, far more than the work.
//   AllReduce: rank 0 reduces every rank's input with one kernel into every rank's output
//              (average: into its own, divided, then copied to the others), waits, barrier;
//   Broadcast: the root copies its buffer into every rank's (one kernel reading it once where
//              there are several), waits, barrier;
//   AllGather: rank 0 writes every rank's block into every rank's output with one kernel that
//              reads each block once, waits, barrier.
// On several GPUs each rank works on its own GPU, in parallel:
//   AllReduce: reduces its slice (count / n elements) of every rank's input with one kernel into
//              its own output, waits, barrier; copies every other slice from its owner's output,
//              waits, barrier;
//   Broadcast: copies the root's buffer, waits, barrier;
//   AllGather: copies every rank's block, waits, barrier.
// The last barrier keeps every buffer untouched until no peer reads it any more. Every result is
// the same bits on every rank: each element is reduced once, by one rank, its inputs in rank
// order.
#include "device_peers.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "communicator_impl.hpp"
#include "cuda_staging.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::collectives::internal {
namespace {

constexpr size_t kMaxMappings = 64;

std::atomic<bool> one_gpu_leader{true};

// This process among the host's: a random token (a pid may repeat across pid namespaces).
uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(getpid());
  }();
  return token;
}

}  // namespace

bool SetOneGpuLeaderForTesting(bool allowed) { return one_gpu_leader.exchange(allowed); }

DeviceBufferRecord DescribeDeviceBuffers(const void* send, const void* recv) {
  DeviceBufferRecord record;
  record.process = ProcessToken();
  record.send = reinterpret_cast<uint64_t>(send);
  record.recv = reinterpret_cast<uint64_t>(recv);
  size_t offset = 0;
  if (send != nullptr) {
    absl::StatusOr<base::cuda::IpcHandle> h = base::cuda::ExportIpc(send, &offset);
    if (h.ok()) {
      record.send_handle = *h;
      record.send_offset = offset;
      record.send_exported = 1;
    }
  }
  absl::StatusOr<base::cuda::IpcHandle> h = base::cuda::ExportIpc(recv, &offset);
  if (h.ok()) {
    record.recv_handle = *h;
    record.recv_offset = offset;
    record.recv_exported = 1;
  }
  if (absl::StatusOr<base::cuda::DeviceUuid> gpu = base::cuda::CurrentDeviceUuid(); gpu.ok()) {
    record.gpu = *gpu;
    record.gpu_known = 1;
  }
  return record;
}

DevicePeerMaps::~DevicePeerMaps() {
  for (auto& [key, mapping] : mapped_) base::cuda::CloseIpc(mapping.base).IgnoreError();
}

absl::StatusOr<uint8_t*> DevicePeerMaps::Open(const base::cuda::IpcHandle& handle) {
  // A mapping belongs to the context that opened it: the current one.
  const uintptr_t context = base::cuda::CurrentContextId();
  std::string key(reinterpret_cast<const char*>(&context), sizeof(context));
  key.append(reinterpret_cast<const char*>(handle.bytes), sizeof(handle.bytes));
  auto it = mapped_.find(key);
  if (it != mapped_.end()) {
    it->second.last_use = ++uses_;
    return it->second.base;
  }
  PLEXUS_ASSIGN_OR_RETURN(void* base, base::cuda::OpenIpc(handle));
  // One call maps at most 2 allocations per rank (32 with 16 ranks): what this call mapped is
  // among the most recent and is never the one closed here.
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

absl::StatusOr<PeerBuffers> DevicePeerMaps::Map(const DeviceBufferRecord& record) {
  PeerBuffers out;
  if (record.magic != DeviceBufferRecord::kMagic) {
    return absl::DataLossError("not a device buffer record");
  }
  if (record.process == ProcessToken()) {
    out.send = reinterpret_cast<const uint8_t*>(record.send);
    out.recv = reinterpret_cast<uint8_t*>(record.recv);
    if (out.send != nullptr) PLEXUS_RETURN_IF_ERROR(base::cuda::EnablePeerAccess(out.send));
    PLEXUS_RETURN_IF_ERROR(base::cuda::EnablePeerAccess(out.recv));
    return out;
  }
  if (record.send != 0) {
    if (record.send_exported == 0) {
      return absl::FailedPreconditionError("its send buffer cannot be shared by CUDA IPC");
    }
    PLEXUS_ASSIGN_OR_RETURN(uint8_t * base, Open(record.send_handle));
    out.send = base + record.send_offset;
  }
  if (record.recv_exported == 0) {
    return absl::FailedPreconditionError("its recv buffer cannot be shared by CUDA IPC");
  }
  PLEXUS_ASSIGN_OR_RETURN(uint8_t * base, Open(record.recv_handle));
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
                                             const std::string& what) {
  return Abort(header, Failure::Own(base::Annotate(
                           s, absl::StrCat("rank ", layout_.rank, ": ", what,
                                           " (CallOptions::device_peer_access = false stages "
                                           "device buffers through host memory instead)"))));
}

absl::Status CommunicatorImpl::DeviceExchange(const CallHeader& header, const void* mine, void* all,
                                              size_t bytes) {
  const int n = layout_.n, me = layout_.rank;
  auto* out = static_cast<uint8_t*>(all);
  for (int k = 1; k < n; ++k) {
    const int from = (me + n - k) % n;
    const MailInbound in{from, out + static_cast<size_t>(from) * bytes, false, false};
    PLEXUS_RETURN_IF_ERROR(MailExchange((me + k) % n, static_cast<const uint8_t*>(mine), in, bytes,
                                        DataType::kU8, ReduceOp::kSum, header));
  }
  return absl::OkStatus();
}

absl::Status CommunicatorImpl::DeviceBarrier(const CallHeader& header) {
  uint8_t token = 0;
  std::vector<uint8_t> tokens(static_cast<size_t>(layout_.n));
  return DeviceExchange(header, &token, tokens.data(), 0);
}

absl::Status CommunicatorImpl::DeviceStepDone(const CallHeader& header, const std::string& what,
                                              bool worked) {
  if (!worked) return DeviceBarrier(header);
  if (absl::Status s = base::cuda::Synchronize(); !s.ok()) return DeviceFailure(header, s, what);
  return DeviceBarrier(header);
}

absl::StatusOr<bool> CommunicatorImpl::ShareDeviceBuffers(const CallHeader& header,
                                                          const void* send, const void* recv,
                                                          bool usable,
                                                          std::vector<PeerBuffers>* peers,
                                                          bool* one_gpu) {
  const int n = layout_.n, me = layout_.rank;
  std::string why = usable ? "" : "this rank's send and recv partly overlap";
  // The call runs in recv's context (the task made it current, EnterDeviceContext), which send
  // must share: one synchronisation then covers both buffers' writers.
  const uintptr_t context = base::cuda::CurrentContextId();
  if (usable && (context == 0 || base::cuda::ContextId(recv) != context ||
                 (send != nullptr && base::cuda::ContextId(send) != context))) {
    usable = false;
    why = "this rank's buffers are not in one CUDA context";
  }
  std::vector<DeviceBufferRecord> records(n);
  records[me] = DescribeDeviceBuffers(send, recv);
  PLEXUS_RETURN_IF_ERROR(
      DeviceExchange(header, &records[me], records.data(), sizeof(DeviceBufferRecord)));
  *one_gpu = one_gpu_leader.load() &&
             std::all_of(records.begin(), records.end(), [&](const DeviceBufferRecord& r) {
               return r.gpu_known != 0 &&
                      std::memcmp(r.gpu.bytes, records[0].gpu.bytes, sizeof(r.gpu)) == 0;
             });
  if (!device_maps_) device_maps_ = std::make_unique<DevicePeerMaps>();
  peers->assign(n, PeerBuffers{});
  for (int p = 0; p < n && usable; ++p) {
    absl::StatusOr<PeerBuffers> mapped = device_maps_->Map(records[p]);
    if (!mapped.ok()) {
      usable = false;
      why = absl::StrCat("rank ", p, "'s buffers: ", mapped.status().message());
    } else {
      (*peers)[p] = *mapped;
    }
  }
  // The caller's work on its buffers, on any stream of their context, is done before this rank
  // votes: peers read them only once every rank voted yes.
  if (usable) {
    if (absl::Status s = base::cuda::Synchronize(); !s.ok()) {
      usable = false;
      why = absl::StrCat("waiting for this rank's device work: ", s.message());
    }
  }
  uint8_t vote = usable ? 1 : 0;
  std::vector<uint8_t> votes(n);
  PLEXUS_RETURN_IF_ERROR(DeviceExchange(header, &vote, votes.data(), 1));
  votes[me] = vote;
  const bool all = std::all_of(votes.begin(), votes.end(), [](uint8_t v) { return v != 0; });
  (all ? device_to_device_ : device_staged_).fetch_add(1, std::memory_order_relaxed);
  if (!all && debug_) {
    base::Logf(base::LogLevel::kInfo, "[plexus-coll rank %d] %s: staged through the host (%s)",
               layout_.rank, header.Describe().c_str(),
               why.empty() ? "another rank cannot go device to device" : why.c_str());
  }
  return all;
}

absl::StatusOr<bool> CommunicatorImpl::DevicePeerAllReduce(const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           ReduceOp op, const CallHeader& header) {
  const int n = layout_.n, me = layout_.rank;
  const size_t esize = DataTypeSize(dtype), bytes = count * esize;
  // Peers read this rank's send while it writes its recv: partly overlapping buffers stage.
  const bool usable = send == recv || !Overlap(send, bytes, recv, bytes);
  std::vector<PeerBuffers> peers;
  bool one_gpu = false;
  PLEXUS_ASSIGN_OR_RETURN(bool shared,
                          ShareDeviceBuffers(header, send, recv, usable, &peers, &one_gpu));
  if (!shared) return false;
  if (one_gpu) {
    if (me == 0) {
      std::vector<const void*> inputs(n);
      std::vector<void*> outputs(n);
      for (int p = 0; p < n; ++p) {
        inputs[p] = peers[p].send;
        outputs[p] = peers[p].recv;
      }
      absl::Status s;
      if (op != ReduceOp::kAvg) {
        s = kernels::ReduceOnDevice(dtype, op, outputs.data(), n, inputs.data(), n, count);
      } else {
        s = kernels::ReduceOnDevice(dtype, op, &recv, 1, inputs.data(), n, count);
        if (s.ok()) s = kernels::DivideOnDevice(dtype, recv, count, n);
        for (int p = 1; p < n && s.ok(); ++p) {
          s = base::cuda::Copy(peers[p].recv, recv, bytes, "copying the average to a peer");
        }
      }
      if (!s.ok()) return DeviceFailure(header, s, "reducing every rank's buffer on the device");
    }
    PLEXUS_RETURN_IF_ERROR(DeviceStepDone(header, "waiting for the reduction", me == 0));
    return true;
  }
  auto first = [&](int p) { return count * static_cast<size_t>(p) / static_cast<size_t>(n); };
  const size_t lo = first(me), len = first(me + 1) - lo;
  auto* out = static_cast<uint8_t*>(recv);
  if (len > 0) {
    std::vector<const void*> inputs(n);
    for (int p = 0; p < n; ++p) inputs[p] = peers[p].send + lo * esize;
    void* slice = out + lo * esize;
    absl::Status s = kernels::ReduceOnDevice(dtype, op, &slice, 1, inputs.data(), n, len);
    if (s.ok() && op == ReduceOp::kAvg) s = kernels::DivideOnDevice(dtype, slice, len, n);
    if (!s.ok()) return DeviceFailure(header, s, "reducing this rank's slice on the device");
  }
  PLEXUS_RETURN_IF_ERROR(DeviceStepDone(header, "waiting for this rank's reduction"));
  for (int p = 0; p < n; ++p) {
    const size_t at = first(p) * esize, slice = (first(p + 1) - first(p)) * esize;
    if (p == me || slice == 0) continue;
    if (absl::Status s =
            base::cuda::Copy(out + at, peers[p].recv + at, slice, "copying a peer's reduced slice");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading rank ", p, "'s slice"));
    }
  }
  PLEXUS_RETURN_IF_ERROR(DeviceStepDone(header, "waiting for the copies of the peers' slices"));
  return true;
}

absl::StatusOr<bool> CommunicatorImpl::DevicePeerBroadcast(const void* send, void* recv,
                                                           size_t count, DataType dtype, int root,
                                                           const CallHeader& header) {
  const bool is_root = root == layout_.rank;
  const size_t bytes = count * DataTypeSize(dtype);
  // The root copies its send into its recv: they must not overlap unless they are the same.
  const bool usable = !is_root || send == recv || !Overlap(send, bytes, recv, bytes);
  std::vector<PeerBuffers> peers;
  bool one_gpu = false;
  PLEXUS_ASSIGN_OR_RETURN(bool shared, ShareDeviceBuffers(header, is_root ? send : nullptr, recv,
                                                          usable, &peers, &one_gpu));
  if (!shared) return false;
  const uint8_t* source = peers[root].send != nullptr ? peers[root].send : peers[root].recv;
  if (one_gpu && is_root) {
    std::vector<void*> outputs;
    for (int p = 0; p < layout_.n; ++p) {
      if (peers[p].recv != source) outputs.push_back(peers[p].recv);
    }
    // One destination: the driver's copy; several: one kernel reading the source once.
    absl::Status s;
    if (outputs.size() == 1) {
      s = base::cuda::Copy(outputs[0], source, bytes, "broadcasting");
    } else if (outputs.size() > 1) {
      const void* input = source;
      s = kernels::GatherOnDevice(outputs.data(), static_cast<int>(outputs.size()), &input, 1,
                                  bytes);
    }
    if (!s.ok()) return DeviceFailure(header, s, "writing the ranks' buffers");
  } else if (!one_gpu && source != recv) {
    if (absl::Status s = base::cuda::Copy(recv, source, bytes, "copying the root's buffer");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading root ", root, "'s buffer"));
    }
  }
  PLEXUS_RETURN_IF_ERROR(
      DeviceStepDone(header, "waiting for the copy of the root's buffer", !one_gpu || is_root));
  return true;
}

absl::StatusOr<bool> CommunicatorImpl::DevicePeerAllGather(const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           const CallHeader& header) {
  const int n = layout_.n, me = layout_.rank;
  const size_t block = count * DataTypeSize(dtype);
  auto* out = static_cast<uint8_t*>(recv);
  // This rank writes every block of its recv while peers read its send: send must be its own
  // block (in place) or lie outside recv.
  const bool usable = send == out + static_cast<size_t>(me) * block ||
                      !Overlap(send, block, recv, block * static_cast<size_t>(n));
  std::vector<PeerBuffers> peers;
  bool one_gpu = false;
  PLEXUS_ASSIGN_OR_RETURN(bool shared,
                          ShareDeviceBuffers(header, send, recv, usable, &peers, &one_gpu));
  if (!shared) return false;
  // On one GPU rank 0 writes every rank's block into every rank's output with one kernel that
  // reads each block once.
  if (one_gpu && me == 0) {
    std::vector<void*> outputs(n);
    std::vector<const void*> inputs(n);
    for (int p = 0; p < n; ++p) {
      outputs[p] = peers[p].recv;
      inputs[p] = peers[p].send;
    }
    if (absl::Status s = kernels::GatherOnDevice(outputs.data(), n, inputs.data(), n, block);
        !s.ok()) {
      return DeviceFailure(header, s, "gathering every rank's block on the device");
    }
  }
  for (int p = 0; p < n && !one_gpu; ++p) {
    uint8_t* dst = out + static_cast<size_t>(p) * block;
    if (p == me && send == dst) continue;  // this rank's own block, in place
    if (absl::Status s = base::cuda::Copy(dst, peers[p].send, block, "copying a peer's block");
        !s.ok()) {
      return DeviceFailure(header, s, absl::StrCat("reading rank ", p, "'s block"));
    }
  }
  PLEXUS_RETURN_IF_ERROR(
      DeviceStepDone(header, "waiting for the copies of the peers' blocks", !one_gpu || me == 0));
  return true;
}

}  // namespace plexus::collectives::internal
