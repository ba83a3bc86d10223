// Each collective of the communicator: argument checks when the call is issued, then (when it
// runs) staging of device buffers, the layout, and either the mailbox path or a plan for the
// executor.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "communicator_impl.hpp"
#include "cuda_staging.hpp"
#include "plexus/base/status.hpp"
#include "plexus/kernels/reduce.hpp"
#include "staging.hpp"

namespace plexus::collectives::internal {

// ---------------------------------------------------------------------------------------------
// Fused casts

absl::Status CommunicatorImpl::CheckWire(const char* what, DataType dtype, const CallOptions& call,
                                         bool supported, bool recv_supported) const {
  if (!recv_supported && call.recv_dtype.has_value() && *call.recv_dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": recv_dtype is for Broadcast and AllGather only; leave it unset"));
  }
  if (!call.wire_dtype.has_value() || *call.wire_dtype == dtype) return absl::OkStatus();
  const std::string asked = absl::StrCat(what, ": wire_dtype ",
                                         static_cast<unsigned>(*call.wire_dtype) < kNumDataTypes
                                             ? std::string(DataTypeName(*call.wire_dtype))
                                             : std::string("(invalid)"),
                                         " for ", std::string(DataTypeName(dtype)), " data");
  if (!supported) {
    return absl::InvalidArgumentError(absl::StrCat(
        asked, ": only AllReduce, Broadcast and AllGather cast on the wire; leave it unset"));
  }
  if (dtype != DataType::kF32 ||
      (*call.wire_dtype != DataType::kBF16 && *call.wire_dtype != DataType::kF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(asked, ": casts go from f32 data to bf16 or f16 on the wire"));
  }
  return absl::OkStatus();
}

absl::Status CommunicatorImpl::CheckRecvType(const char* what, const void* send, size_t send_bytes,
                                             const void* recv, size_t recv_bytes, DataType dtype,
                                             const CallOptions& call) const {
  const std::optional<DataType> out = RecvTypeOf(dtype, call);
  if (!out.has_value()) return absl::OkStatus();
  if (dtype != DataType::kF32 || (*out != DataType::kBF16 && *out != DataType::kF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": recv_dtype ",
        static_cast<unsigned>(*out) < kNumDataTypes ? std::string(DataTypeName(*out))
                                                    : std::string("(invalid)"),
        " for ", std::string(DataTypeName(dtype)), " data: casts go from f32 to bf16 or f16"));
  }
  if (call.wire_dtype.has_value() && *call.wire_dtype != dtype && *call.wire_dtype != *out) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": wire_dtype ", std::string(DataTypeName(*call.wire_dtype)),
                     " differs from recv_dtype ", std::string(DataTypeName(*out)),
                     ": recv's elements travel as they are"));
  }
  const auto* s = static_cast<const uint8_t*>(send);
  const auto* r = static_cast<const uint8_t*>(recv);
  if (Overlap(s, send_bytes, r, recv_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": with recv_dtype, send must not overlap recv (they hold different "
                     "types): pass distinct buffers"));
  }
  if ((s != nullptr && internal::IsDevicePointer(s)) ||
      (r != nullptr && internal::IsDevicePointer(r))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": recv_dtype needs host buffers (device buffers: cast on the device)"));
  }
  return absl::OkStatus();
}

const Layout& CommunicatorImpl::MakeWireLayout(DataType dtype, DataType wire,
                                               size_t segment_bytes) {
  const size_t esize = DataTypeSize(dtype);
  const size_t wsize = DataTypeSize(wire);
  MakeLayout(wire, segment_bytes / esize * wsize);  // chunk_bytes of wire elements
  call_layout_.esize = esize;
  call_layout_.chunk_bytes = std::max(call_layout_.chunk_bytes / wsize, size_t{1}) * esize;
  return call_layout_;
}

// ---------------------------------------------------------------------------------------------
// Collectives

CommunicatorImpl::TaskOr CommunicatorImpl::AllReduceTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, ReduceOp op,
                                                         CallOptions call) {
  PLEXUS_RETURN_IF_ERROR(CheckCommon("AllReduce", send, recv, count, dtype, op));
  PLEXUS_RETURN_IF_ERROR(CheckWire("AllReduce", dtype, call, true));
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this] { return RunAllReduce(send, recv, count, dtype, op, call); };
}

absl::Status CommunicatorImpl::RunAllReduce(const void* send, void* recv, size_t count,
                                            DataType dtype, ReduceOp op, CallOptions call) {
  PLEXUS_RETURN_IF_ERROR(BeginCollective());
  const size_t bytes = count * DataTypeSize(dtype);
  Algorithm algo = Resolve(CollectiveKind::kAllReduce, bytes, call.algorithm);
  // Whole-vector doubling travels uncast (below); a wire cast asks for fewer bytes, so with one
  // the call halves and doubles instead, casting on the way.
  if (algo == Algorithm::kRecursiveDoubling && WireOf(dtype, call)) {
    algo = Algorithm::kHalvingDoubling;
  }
  CallHeader header = Header(CollectiveKind::kAllReduce, dtype, op, algo, -1, count);
  if (count == 0) return absl::OkStatus();
  // Device buffers: their context is current for the whole call, whichever path it takes.
  const auto context = internal::EnterDeviceContext(recv);
  if (!WireOf(dtype, call) && UsesDevicePeers(send, recv, call)) {
    CallHeader peer = header;
    peer.device_peer = true;
    PLEXUS_ASSIGN_OR_RETURN(const bool done,
                            DevicePeerAllReduce(send, recv, count, dtype, op, peer));
    if (done) return absl::OkStatus();  // else every rank stages it, below
  }
  if (algo == Algorithm::kRing && !WireOf(dtype, call) && layout_.n > 1 &&
      bytes >= kPipelinedStagingBytes && internal::IsDevicePointer(recv) &&
      (send == recv || internal::IsDevicePointer(send))) {
    return PipelinedDeviceAllReduce(send, recv, count, dtype, op, header);
  }
  Staging staging = NewStaging();
  PLEXUS_ASSIGN_OR_RETURN(auto buf, staging.Output(recv, bytes, send == recv));
  // Small calls (or fewer elements than ranks) are latency-bound: they travel uncast, and
  // halving-doubling exchanges the whole vector there (cheaper below a block per rank).
  // Whole-vector doubling always travels uncast: every rank reduces both operands, and a cast
  // would have to round its own too.
  const bool small = bytes <= 16384 || count < static_cast<size_t>(layout_.n);
  const bool recursive_doubling =
      algo == Algorithm::kRecursiveDoubling || (algo == Algorithm::kHalvingDoubling && small);
  const std::optional<DataType> wire =
      small || recursive_doubling ? std::nullopt : WireOf(dtype, call);
  header.wire = wire;
  const size_t segment = algo == Algorithm::kRing ? bytes / static_cast<size_t>(layout_.n) : 0;
  const Layout& L = wire ? MakeWireLayout(dtype, *wire, segment) : MakeLayout(dtype, segment);
  // Small halving-doubling exchanges the whole vector: the recursive doubling schedule.
  const PlanBuilder* builder = FindPlanBuilder(
      CollectiveKind::kAllReduce, recursive_doubling ? Algorithm::kRecursiveDoubling : algo, L.n);
  const uint8_t* input = nullptr;  // out of place: where this rank's operand is
  if (send != recv) {
    PLEXUS_ASSIGN_OR_RETURN(input, staging.In(send, bytes, true));
    // The schedules read this rank's operand straight from the input (every block of the
    // output is written by a reduction or a receive); the mailbox path starts from a copy.
    const bool overlap = Overlap(input, bytes, buf, bytes);
    const bool direct = builder->reads_input != nullptr && builder->reads_input(L.n) &&
                        !(recursive_doubling && FitsMailbox(bytes));
    if (!direct || L.n == 1 || overlap) {
      std::memmove(buf, input, bytes);
      input = nullptr;
    }
  }
  if (recursive_doubling && FitsMailbox(bytes)) {
    PLEXUS_RETURN_IF_ERROR(MailboxAllReduce(buf, count, dtype, op, header));
  } else {
    Plan& plan = NewPlan();
    plan.wire = wire;
    PLEXUS_RETURN_IF_ERROR(
        builder->build({.L = L, .buf = buf, .count = count, .input = input}, &plan));
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, op));
  }
  if (op == ReduceOp::kAvg && staging.any()) {
    // A device result: copy the sum back and divide it there (libs/kernels/src/cuda/divide.cu).
    PLEXUS_RETURN_IF_ERROR(staging.CopyOut());
    return internal::DeviceDivide(dtype, recv, count, L.n);
  }
  if (op == ReduceOp::kAvg) plexus::kernels::DivideInPlace(dtype, buf, count, L.n);
  return staging.CopyOut();
}

absl::Status CommunicatorImpl::PipelinedDeviceAllReduce(const void* send, void* recv, size_t count,
                                                        DataType dtype, ReduceOp op,
                                                        const CallHeader& header) {
  const size_t esize = DataTypeSize(dtype);
  Staging staging = NewStaging();
  PLEXUS_ASSIGN_OR_RETURN(uint8_t * buf, staging.Output(recv, count * esize, false));
  uint8_t* input = nullptr;  // out of place: the host copy of send (the ring reads it directly)
  if (send != recv) {
    PLEXUS_ASSIGN_OR_RETURN(input, staging.In(send, count * esize, false));
  }
  uint8_t* landing = input != nullptr ? input : buf;
  const auto* source = static_cast<const uint8_t*>(send);
  auto* target = static_cast<uint8_t*>(recv);
  // Segments of equal size (the last one shorter by fewer elements than there are segments), so
  // that no tail segment is too small for a ring step per rank.
  const size_t largest =
      std::max(kStagingSegmentBytes / esize, (count + kStagingSegments - 1) / kStagingSegments);
  const size_t segments = (count + largest - 1) / largest;
  const size_t per_segment = (count + segments - 1) / segments;
  // Declared after `staging`: destroyed first, so every queued copy has landed before the pinned
  // buffers go back to the pool, also on an early error return.
  CopyStreams copies;
  const size_t first_bytes = std::min(per_segment, count) * esize;
  PLEXUS_ASSIGN_OR_RETURN(int arrived, copies.ToHost(landing, source, first_bytes));
  for (size_t first = 0; first < count; first += per_segment) {
    const size_t n = std::min(per_segment, count - first);
    const size_t offset = first * esize;
    PLEXUS_RETURN_IF_ERROR(copies.Wait(arrived));
    if (first + n < count) {
      const size_t next = std::min(per_segment, count - first - n);
      const size_t at = offset + n * esize;
      PLEXUS_ASSIGN_OR_RETURN(arrived, copies.ToHost(landing + at, source + at, next * esize));
    }
    CallHeader segment = header;  // checked against the peers' like a call of its own
    segment.count = n;
    const Layout& L = MakeLayout(dtype, n * esize / static_cast<size_t>(layout_.n));
    Plan& plan = NewPlan();
    PLEXUS_RETURN_IF_ERROR(FindPlanBuilder(CollectiveKind::kAllReduce, Algorithm::kRing, L.n)
                               ->build({.L = L,
                                        .buf = buf + offset,
                                        .count = n,
                                        .input = input != nullptr ? input + offset : nullptr},
                                       &plan));
    PLEXUS_RETURN_IF_ERROR(Execute(plan, segment, dtype, op));
    if (op == ReduceOp::kAvg) plexus::kernels::DivideInPlace(dtype, buf + offset, n, L.n);
    PLEXUS_RETURN_IF_ERROR(copies.ToDevice(target + offset, buf + offset, n * esize).status());
  }
  return copies.WaitAll();
}

CommunicatorImpl::TaskOr CommunicatorImpl::ReduceTask(const void* send, void* recv, size_t count,
                                                      DataType dtype, ReduceOp op, int root,
                                                      CallOptions call) {
  const bool is_root = root == layout_.rank;
  PLEXUS_RETURN_IF_ERROR(
      CheckCommon("Reduce", send, is_root ? recv : send, count, dtype, op, root));
  PLEXUS_RETURN_IF_ERROR(CheckWire("Reduce", dtype, call, false));
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const size_t bytes = count * DataTypeSize(dtype);
    const Algorithm algo = Resolve(CollectiveKind::kReduce, bytes, call.algorithm);
    const CallHeader header = Header(CollectiveKind::kReduce, dtype, op, algo, root, count);
    if (count == 0) return absl::OkStatus();
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(send, bytes, true));
    uint8_t* buf = nullptr;
    if (is_root) {
      PLEXUS_ASSIGN_OR_RETURN(buf, staging.Output(recv, bytes, false));
    } else {
      buf = Scratch(bytes);
    }
    const Layout& L = MakeLayout(dtype);
    if (algo == Algorithm::kTree && FitsMailbox(bytes)) {
      // Small: a binary tree over the positions counted from the root, by mailbox, children
      // folded in order (the plan's first tree; its halves would be separate messages here).
      const int i = ((L.pos() - L.position[root]) % L.n + L.n) % L.n;
      auto rank_at = [&](int index) { return L.at(L.position[root] + index); };
      const bool leaf = 2 * i + 1 >= L.n;
      if (!leaf && buf != in) std::memmove(buf, in, bytes);
      for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
        const MailInbound from_child{rank_at(child), buf, /*reduce=*/true, /*src_first=*/false};
        PLEXUS_RETURN_IF_ERROR(MailExchange(-1, nullptr, from_child, bytes, dtype, op, header));
      }
      if (i != 0) {
        PLEXUS_RETURN_IF_ERROR(
            MailExchange(rank_at((i - 1) / 2), leaf ? in : buf, {}, bytes, dtype, op, header));
        return absl::OkStatus();
      }
      if (leaf && buf != in) std::memmove(buf, in, bytes);  // a root alone
      if (op == ReduceOp::kAvg) plexus::kernels::DivideInPlace(dtype, buf, count, L.n);
      return staging.CopyOut();
    }
    const PlanBuilder* builder = FindPlanBuilder(CollectiveKind::kReduce, algo, L.n);
    // The plan reads the input in place (no copy into buf first) unless they overlap.
    const bool direct = builder->reads_input != nullptr && builder->reads_input(L.n) &&
                        (in + bytes <= buf || buf + bytes <= in);
    if (!direct && buf != in) std::memmove(buf, in, bytes);
    Plan& plan = NewPlan();
    PLEXUS_RETURN_IF_ERROR(builder->build({.L = L,
                                           .buf = buf,
                                           .count = count,
                                           .root_pos = L.position[root],
                                           .input = direct ? in : nullptr},
                                          &plan));
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, op));
    if (!is_root) return absl::OkStatus();
    if (op == ReduceOp::kAvg) plexus::kernels::DivideInPlace(dtype, buf, count, L.n);
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::BroadcastTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, int root,
                                                         CallOptions call) {
  const bool is_root = root == layout_.rank;
  PLEXUS_RETURN_IF_ERROR(
      CheckCommon("Broadcast", is_root ? send : recv, recv, count, dtype, ReduceOp::kSum, root));
  PLEXUS_RETURN_IF_ERROR(CheckWire("Broadcast", dtype, call, true, true));
  if (const std::optional<DataType> out = RecvTypeOf(dtype, call)) {
    PLEXUS_RETURN_IF_ERROR(CheckRecvType("Broadcast", is_root ? send : nullptr,
                                         count * DataTypeSize(dtype), recv,
                                         count * DataTypeSize(*out), dtype, call));
    // The root converts its source into its recv (its output); then recv travels as it is.
    CallOptions plain = call;
    plain.wire_dtype.reset();
    plain.recv_dtype.reset();
    PLEXUS_ASSIGN_OR_RETURN(auto broadcast, BroadcastTask(recv, recv, count, *out, root, plain));
    return [=, this]() -> absl::Status {
      if (is_root && count > 0) {
        plexus::kernels::PackWire(*out, recv, static_cast<const float*>(send), count, nullptr);
      }
      return broadcast();
    };
  }
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const size_t bytes = count * DataTypeSize(dtype);
    const Algorithm algo = Resolve(CollectiveKind::kBroadcast, bytes, call.algorithm);
    CallHeader header =
        Header(CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, algo, root, count);
    if (count == 0) return absl::OkStatus();
    const auto context = internal::EnterDeviceContext(recv);
    if (!WireOf(dtype, call) && UsesDevicePeers(is_root ? send : nullptr, recv, call)) {
      CallHeader peer = header;
      peer.device_peer = true;
      PLEXUS_ASSIGN_OR_RETURN(const bool done,
                              DevicePeerBroadcast(send, recv, count, dtype, root, peer));
      if (done) return absl::OkStatus();  // else every rank stages it, below
    }
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto buf, staging.Output(recv, bytes, is_root && send == recv));
    const uint8_t* source = nullptr;  // out of place at the root: its input
    if (is_root && send != recv) {
      PLEXUS_ASSIGN_OR_RETURN(source, staging.In(send, bytes, true));
    }
    // Larger ones may cast: the root keeps the rounded values it sends (SendOp::final).
    const std::optional<DataType> wire = bytes <= 16384 ? std::nullopt : WireOf(dtype, call);
    const bool mailbox = algo == Algorithm::kTree && FitsMailbox(bytes);
    // Out of place, the plan's root sends straight from its input and copies it into its
    // output after (no copy before the first send). Not by mailbox, with a cast (the root's
    // output holds the rounded values) or when input and output overlap.
    const bool direct =
        source != nullptr && !mailbox && !wire && !Overlap(source, bytes, buf, bytes);
    if (source != nullptr && !direct) std::memmove(buf, source, bytes);
    const Layout& L = MakeLayout(dtype);
    if (mailbox) {
      // Small: a binary tree over the positions counted from the root, by mailbox.
      const int i = ((L.pos() - L.position[root]) % L.n + L.n) % L.n;
      auto rank_at = [&](int index) { return L.at(L.position[root] + index); };
      if (i != 0) {
        const MailInbound from_parent{rank_at((i - 1) / 2), buf, false, false};
        PLEXUS_RETURN_IF_ERROR(
            MailExchange(-1, nullptr, from_parent, bytes, dtype, ReduceOp::kSum, header));
      }
      for (int child = 2 * i + 1; child <= 2 * i + 2 && child < L.n; ++child) {
        PLEXUS_RETURN_IF_ERROR(
            MailExchange(rank_at(child), buf, {}, bytes, dtype, ReduceOp::kSum, header));
      }
      return staging.CopyOut();
    }
    header.wire = wire;
    if (wire) MakeWireLayout(dtype, *wire);  // recuts L (the same call layout) for the wire
    Plan& plan = NewPlan();
    plan.wire = wire;
    PLEXUS_RETURN_IF_ERROR(FindPlanBuilder(CollectiveKind::kBroadcast, algo, L.n)
                               ->build({.L = L,
                                        .buf = buf,
                                        .count = count,
                                        .root_pos = L.position[root],
                                        .input = direct ? source : nullptr},
                                       &plan));
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, ReduceOp::kSum));
    if (direct) std::memcpy(buf, source, bytes);
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllGatherTask(const void* send, void* recv, size_t count,
                                                         DataType dtype, CallOptions call) {
  PLEXUS_RETURN_IF_ERROR(CheckCommon("AllGather", send, recv, count, dtype));
  PLEXUS_RETURN_IF_ERROR(CheckWire("AllGather", dtype, call, true, true));
  if (const std::optional<DataType> out = RecvTypeOf(dtype, call)) {
    const size_t block = count * DataTypeSize(*out);
    PLEXUS_RETURN_IF_ERROR(CheckRecvType("AllGather", send, count * DataTypeSize(dtype), recv,
                                         block * layout_.n, dtype, call));
    // Each rank converts its block into its place in recv; then an in-place allgather of it.
    uint8_t* mine = static_cast<uint8_t*>(recv) + static_cast<size_t>(layout_.rank) * block;
    CallOptions plain = call;
    plain.wire_dtype.reset();
    plain.recv_dtype.reset();
    PLEXUS_ASSIGN_OR_RETURN(auto gather, AllGatherTask(mine, recv, count, *out, plain));
    return [=]() -> absl::Status {
      if (count > 0)
        plexus::kernels::PackWire(*out, mine, static_cast<const float*>(send), count, nullptr);
      return gather();
    };
  }
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t total = count * n * esize;
    const Algorithm algo = Resolve(CollectiveKind::kAllGather, total, call.algorithm);
    CallHeader header = Header(CollectiveKind::kAllGather, dtype, ReduceOp::kSum, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    const auto context = internal::EnterDeviceContext(recv);
    if (!WireOf(dtype, call) && send != nullptr && UsesDevicePeers(send, recv, call)) {
      CallHeader peer = header;
      peer.device_peer = true;
      PLEXUS_ASSIGN_OR_RETURN(const bool done, DevicePeerAllGather(send, recv, count, dtype, peer));
      if (done) return absl::OkStatus();  // else every rank stages it, below
    }
    const size_t mine = static_cast<size_t>(layout_.rank) * count * esize;
    const bool in_place = send == static_cast<uint8_t*>(recv) + mine;
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto buf, staging.Output(recv, total, in_place));
    const uint8_t* own_block = nullptr;
    if (!in_place) {
      PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(send, count * esize, true));
      std::memmove(buf + mine, in, count * esize);
      // Sent from the input only where no write into the output can reach it.
      const auto at = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
      if (at(in) + count * esize <= at(buf) || at(in) >= at(buf) + total) own_block = in;
    }
    const Layout& L = MakeLayout(dtype);
    if (algo == Algorithm::kHalvingDoubling && FitsMailbox(count * esize)) {
      // Small (the selector's halving-doubling range): pairwise exchange by mailbox (step d: to
      // rank + d, from rank - d); log2(n) doubling steps would move the same bytes, later.
      const int me = layout_.rank;
      for (int d = 1; d < n; ++d) {
        const int to = (me + d) % n;
        const int from = (me - d + n) % n;
        const MailInbound in{from, buf + static_cast<size_t>(from) * count * esize, false, false};
        PLEXUS_RETURN_IF_ERROR(
            MailExchange(to, buf + mine, in, count * esize, dtype, ReduceOp::kSum, header));
      }
      return staging.CopyOut();
    }
    // Larger ones may cast: each block's owner keeps the rounded values it sends.
    const std::optional<DataType> wire = total <= 16384 ? std::nullopt : WireOf(dtype, call);
    header.wire = wire;
    if (wire) MakeWireLayout(dtype, *wire);  // recuts L (the same call layout) for the wire
    Plan& plan = NewPlan();
    plan.wire = wire;
    PLEXUS_RETURN_IF_ERROR(FindPlanBuilder(CollectiveKind::kAllGather, algo, n)
                               ->build({.L = L,
                                        .buf = buf,
                                        .count = count,
                                        // A wire cast sends the rounded copy in buf.
                                        .own_block = wire ? nullptr : own_block},
                                       &plan));
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, ReduceOp::kSum));
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::ReduceScatterTask(const void* send, void* recv,
                                                             size_t count, DataType dtype,
                                                             ReduceOp op, CallOptions call) {
  PLEXUS_RETURN_IF_ERROR(CheckCommon("ReduceScatter", send, recv, count, dtype, op));
  PLEXUS_RETURN_IF_ERROR(CheckWire("ReduceScatter", dtype, call, false));
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t total = count * n * esize;
    const Algorithm algo = Resolve(CollectiveKind::kReduceScatter, total, call.algorithm);
    const CallHeader header = Header(CollectiveKind::kReduceScatter, dtype, op, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(send, total, true));
    // The send buffer is the caller's and recv may lie inside it: the partial sums go to a
    // scratch buffer.
    uint8_t* work = Scratch(total);
    if (algo == Algorithm::kHalvingDoubling && n > 1 && FitsMailbox(total)) {
      // Small (the selector's halving-doubling range, on a power-of-two world): latency-bound,
      // like a small allreduce, so the whole vector goes by mailbox with recursive doubling
      // (log2 n exchanges, none of them through the completion queue), and this rank keeps its
      // block: the bits of a small AllReduce of the same input.
      MakeLayout(dtype);
      std::memcpy(work, in, total);
      PLEXUS_RETURN_IF_ERROR(MailboxAllReduce(work, count * n, dtype, op, header));
    } else {
      // The first step reads this rank's operand straight from the input (every block of `work`
      // that is read was written by a reduction first), so nothing is copied in.
      const Layout& L = MakeLayout(dtype);
      Plan& plan = NewPlan();
      PLEXUS_RETURN_IF_ERROR(
          FindPlanBuilder(CollectiveKind::kReduceScatter, algo, n)
              ->build({.L = L, .buf = work, .count = count, .input = in}, &plan));
      if (n == 1) std::memcpy(work, in, total);  // no step: the input is the result
      PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, op));
    }
    uint8_t* mine = work + static_cast<size_t>(layout_.rank) * count * esize;
    if (op == ReduceOp::kAvg) plexus::kernels::DivideInPlace(dtype, mine, count, n);
    PLEXUS_ASSIGN_OR_RETURN(auto out, staging.Output(recv, count * esize, false));
    std::memmove(out, mine, count * esize);
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllToAllTask(const void* send, void* recv, size_t count,
                                                        DataType dtype, CallOptions call) {
  PLEXUS_RETURN_IF_ERROR(CheckCommon("AllToAll", send, recv, count, dtype));
  PLEXUS_RETURN_IF_ERROR(CheckWire("AllToAll", dtype, call, false));
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const size_t esize = DataTypeSize(dtype);
    const int n = layout_.n;
    const size_t block = count * esize;
    const size_t total = block * n;
    const Algorithm algo = Resolve(CollectiveKind::kAllToAll, total, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kAllToAll, dtype, ReduceOp::kSum, algo, -1, count);
    if (count == 0) return absl::OkStatus();
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(send, total, true));
    PLEXUS_ASSIGN_OR_RETURN(auto out, staging.Output(recv, total, false));
    const uint8_t* src = in;
    if (src == out) {  // in place: send from a copy
      uint8_t* copy = Scratch(total);
      std::memcpy(copy, src, total);
      src = copy;
    }
    const int me = layout_.rank;
    std::memmove(out + me * block, src + me * block, block);
    const Layout& L = MakeLayout(dtype);
    if (FitsMailbox(block)) {
      // Small: the same pairwise exchange, by mailbox.
      for (int d = 1; d < n; ++d) {
        const int to = (me + d) % n;
        const int from = (me - d + n) % n;
        const MailInbound in{from, out + from * block, false, false};
        PLEXUS_RETURN_IF_ERROR(
            MailExchange(to, src + to * block, in, block, dtype, ReduceOp::kSum, header));
      }
      return staging.CopyOut();
    }
    Plan& plan = NewPlan();
    for (int d = 1; d < n; ++d) {
      const int to = (me + d) % n;
      const int from = (me - d + n) % n;
      internal::BuildSendTo(L, src + to * block, count, to, false, &plan);
      internal::BuildRecvFrom(L, out + from * block, count, from, false, &plan);
    }
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, ReduceOp::kSum));
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::AllToAllVTask(
    const void* send, absl::Span<const size_t> send_counts, absl::Span<const size_t> send_displs,
    void* recv, absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
    DataType dtype, CallOptions call) {
  const int n = layout_.n;
  PLEXUS_RETURN_IF_ERROR(CheckCommon("AllToAllV", send, recv, 0, dtype));
  PLEXUS_RETURN_IF_ERROR(CheckWire("AllToAllV", dtype, call, false));
  for (auto [span, name] : {std::pair{send_counts, "send_counts"},
                            {send_displs, "send_displs"},
                            {recv_counts, "recv_counts"},
                            {recv_displs, "recv_displs"}}) {
    if (static_cast<int>(span.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: ", name, " has ", span.size(),
                                                     " entries, need one per rank (", n, ")"));
    }
  }
  const size_t esize = DataTypeSize(dtype);
  size_t send_extent = 0, recv_extent = 0;
  for (int r = 0; r < n; ++r) {
    const size_t limit = (size_t{1} << 40) / esize;
    if (send_counts[r] > limit || send_displs[r] > limit || recv_counts[r] > limit ||
        recv_displs[r] > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllToAllV: count or displacement for rank ", r, " is too large"));
    }
    send_extent = std::max(send_extent, send_displs[r] + send_counts[r]);
    recv_extent = std::max(recv_extent, recv_displs[r] + recv_counts[r]);
  }
  if ((send_extent > 0 && send == nullptr) || (recv_extent > 0 && recv == nullptr)) {
    return absl::InvalidArgumentError("AllToAllV: null buffer with non-zero counts");
  }
  if (send_extent > 0 && send == recv) {
    return absl::InvalidArgumentError("AllToAllV cannot run in place: pass distinct buffers");
  }
  std::vector<size_t> sc(send_counts.begin(), send_counts.end());
  std::vector<size_t> sd(send_displs.begin(), send_displs.end());
  std::vector<size_t> rc(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> rd(recv_displs.begin(), recv_displs.end());
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [=, this]() -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(BeginCollective());
    const Algorithm algo = Resolve(CollectiveKind::kAllToAllV, send_extent * esize, call.algorithm);
    const CallHeader header =
        Header(CollectiveKind::kAllToAllV, dtype, ReduceOp::kSum, algo, -1, 0);
    if (trace_ != nullptr) trace_->NoteBytes(send_extent * esize);
    Staging staging = NewStaging();
    PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(send, send_extent * esize, true));
    PLEXUS_ASSIGN_OR_RETURN(auto out, staging.Output(recv, recv_extent * esize, false));
    const int me = layout_.rank;
    if (sc[me] != rc[me]) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: rank ", me, " sends itself ",
                                                     sc[me], " elements but expects ", rc[me]));
    }
    if (sc[me] > 0) std::memmove(out + rd[me] * esize, in + sd[me] * esize, sc[me] * esize);
    const Layout& L = MakeLayout(dtype);
    Plan& plan = NewPlan();
    plan.tx_extra.assign(n, 0);
    plan.rx_extra.assign(n, 0);
    for (int d = 1; d < n; ++d) {
      const int to = (me + d) % n;
      const int from = (me - d + n) % n;
      plan.tx_extra[to] = sc[to];
      plan.rx_extra[from] = rc[from];
      internal::BuildSendTo(L, in + sd[to] * esize, sc[to], to, true, &plan);
      internal::BuildRecvFrom(L, out + rd[from] * esize, rc[from], from, true, &plan);
    }
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, ReduceOp::kSum));
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::PointToPointTask(void* buf, size_t count, DataType dtype,
                                                            int peer, bool is_send) {
  const char* what = is_send ? "Send" : "Recv";
  PLEXUS_RETURN_IF_ERROR(CheckCommon(what, buf, buf, count, dtype));
  if (peer < 0 || peer >= layout_.n || peer == layout_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": peer ", peer, " must be another rank of this ", layout_.n, "-rank communicator"));
  }
  return [=, this]() -> absl::Status {
    const size_t bytes = count * DataTypeSize(dtype);
    CallHeader header;
    header.kind = CollectiveKind::kSendRecv;
    header.dtype = dtype;
    header.algorithm = Algorithm::kRing;
    header.sender = is_send ? layout_.rank : peer;
    header.count = count;
    header.communicator = uid_;
    header.epoch = config_epoch_;  // informational: a Send and its Recv may straddle a change
    // Each direction of each pair numbers its messages: that is what matches a Send to a Recv.
    header.sequence = is_send ? p2p_send_seq_[peer]++ : p2p_recv_seq_[peer]++;
    if (trace_ != nullptr) trace_->Describe(header, peer);
    Staging staging = NewStaging();
    // Every connected channel, whatever the active configuration: a Send and its Recv may sit
    // on either side of a reconfiguration.
    MakeLayout(dtype);
    call_layout_.channels = options_.channels;
    const Layout& L = call_layout_;
    Plan& plan = NewPlan();
    if (is_send) {
      PLEXUS_ASSIGN_OR_RETURN(auto in, staging.In(buf, bytes, true));
      internal::BuildSendTo(L, in, count, peer, true, &plan);
      return Execute(plan, header, dtype, ReduceOp::kSum);
    }
    PLEXUS_ASSIGN_OR_RETURN(auto out, staging.Output(buf, bytes, false));
    internal::BuildRecvFrom(L, out, count, peer, true, &plan);
    PLEXUS_RETURN_IF_ERROR(Execute(plan, header, dtype, ReduceOp::kSum));
    return staging.CopyOut();
  };
}

CommunicatorImpl::TaskOr CommunicatorImpl::RecvFromAnyTask(void* buf, size_t count, DataType dtype,
                                                           int* source) {
  PLEXUS_RETURN_IF_ERROR(CheckCommon("RecvFromAny", buf, buf, count, dtype));
  if (source == nullptr) return absl::InvalidArgumentError("RecvFromAny: null source");
  if (layout_.n < 2) {
    return absl::InvalidArgumentError(
        "RecvFromAny: a 1-rank communicator has no peer to receive from");
  }
  return [=, this]() -> absl::Status {
    PLEXUS_ASSIGN_OR_RETURN(const int peer, AwaitAnySend());
    PLEXUS_ASSIGN_OR_RETURN(std::function<absl::Status()> recv,
                            PointToPointTask(buf, count, dtype, peer, false));
    *source = peer;
    return recv();
  };
}

absl::StatusOr<int> CommunicatorImpl::AwaitAnySend() {
  const absl::Time deadline = absl::Now() + options_.timeout;
  uint8_t head[kHeaderBytes];
  while (true) {
    bool reachable = false;
    for (int peer = 0; peer < layout_.n; ++peer) {
      if (peer == layout_.rank) continue;
      transport::Connection* conn = conns_.conns[0][peer].get();
      absl::StatusOr<std::optional<size_t>> next = conn->PeekNext({head, sizeof head});
      if (!next.ok()) {
        return base::Annotate(next.status(), absl::StrCat("RecvFromAny on rank ", layout_.rank,
                                                          ": the connection to rank ", peer));
      }
      if (!next->has_value()) {
        reachable = reachable || conn->status().ok();
        continue;
      }
      reachable = true;
      if (**next < kHeaderBytes) continue;
      absl::StatusOr<CallHeader> h = CallHeader::Decode(absl::MakeConstSpan(head, sizeof head));
      // Its next Send to this rank: the message a Recv from it would match now.
      if (h.ok() && h->kind == CollectiveKind::kSendRecv && h->sender == peer &&
          h->communicator == uid_ && h->sequence == p2p_recv_seq_[peer]) {
        return peer;
      }
    }
    if (!reachable) {
      return absl::UnavailableError(
          absl::StrCat("RecvFromAny on rank ", layout_.rank,
                       ": the connection to every peer is down and nothing they sent is left (",
                       conns_.DownRanks(layout_.n), ")"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "RecvFromAny on rank ", layout_.rank, ": no peer sent this rank anything within ",
          absl::FormatDuration(options_.timeout), " (CommunicatorOptions::timeout)"));
    }
    conns_.Progress(absl::Microseconds(200));  // moves bytes of caller-mode devices; else sleeps
  }
}

CommunicatorImpl::TaskOr CommunicatorImpl::BarrierTask() {
  PLEXUS_RETURN_IF_ERROR(IssueCollective());
  return [this] { return RunBarrier(); };
}

absl::Status CommunicatorImpl::RunBarrier() {
  PLEXUS_RETURN_IF_ERROR(BeginCollective());
  const CallHeader header = Header(CollectiveKind::kBarrier, DataType::kU8, ReduceOp::kMax,
                                   Algorithm::kHalvingDoubling, -1, 1);
  uint8_t token[8] = {};
  if (FitsMailbox(1)) return MailboxAllReduce(token, 1, DataType::kU8, ReduceOp::kMax, header);
  const Layout& L = MakeLayout(DataType::kU8);
  Plan& plan = NewPlan();
  PLEXUS_RETURN_IF_ERROR(
      FindPlanBuilder(CollectiveKind::kAllReduce, Algorithm::kRecursiveDoubling, L.n)
          ->build({.L = L, .buf = token, .count = 1}, &plan));
  return Execute(plan, header, DataType::kU8, ReduceOp::kMax);
}

}  // namespace plexus::collectives::internal
