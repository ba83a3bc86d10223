#include "verbs/protocol.hpp"
#include "make_completion.hpp"
#include "produce_consume.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::verbs {
namespace {

constexpr uint8_t kChunkMagic = 0xC5;
constexpr uint32_t kHelloMagic = 0x56584c50;  // "PLXV"
constexpr uint16_t kHelloVersion = 1;

}  // namespace

// ---- Encodings --------------------------------------------------------------------------------

void EncodeChunkHeader(const ChunkHeader& header, uint8_t* out) {
  base::ByteWriter w(out);
  w.U8(kChunkMagic);
  w.U8(static_cast<uint8_t>(header.type));
  w.U8(header.flags);
  w.U8(0);
  w.U32(header.credits);
  w.U64(header.total_bytes);
}

absl::StatusOr<ChunkHeader> DecodeChunkHeader(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kChunkHeaderBytes) {
    return absl::DataLossError(absl::StrCat("chunk of ", bytes.size(),
                                            " bytes is shorter than its ", kChunkHeaderBytes,
                                            "-byte header"));
  }
  base::ByteReader r(bytes.data());
  if (r.U8() != kChunkMagic) return absl::DataLossError("chunk header has a bad magic byte");
  ChunkHeader h;
  const uint8_t type = r.U8();
  if (type != static_cast<uint8_t>(ChunkType::kData) &&
      type != static_cast<uint8_t>(ChunkType::kCredit)) {
    return absl::DataLossError(absl::StrCat("chunk header has unknown type ", type));
  }
  h.type = static_cast<ChunkType>(type);
  h.flags = r.U8();
  if ((h.flags & ~(kFirstChunk | kLastChunk)) != 0) {
    return absl::DataLossError(
        absl::StrCat("chunk header has unknown flags 0x", absl::Hex(h.flags)));
  }
  if (r.U8() != 0) return absl::DataLossError("chunk header has a non-zero reserved byte");
  h.credits = r.U32();
  h.total_bytes = r.U64();
  if (h.type == ChunkType::kCredit && (h.flags != 0 || h.total_bytes != 0)) {
    return absl::DataLossError("credit chunk carries message fields");
  }
  return h;
}

std::array<uint8_t, kHelloBytes> EncodeHello(const Hello& hello) {
  std::array<uint8_t, kHelloBytes> out{};
  base::ByteWriter w(out.data());
  w.U32(kHelloMagic);
  w.U16(kHelloVersion);
  w.U16(0);
  w.U32(hello.recv_slots);
  w.U32(hello.slot_bytes);
  return out;
}

absl::StatusOr<Hello> DecodeHello(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kHelloBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verbs handshake: ", bytes.size(), " bytes of private data, expected at least ",
        kHelloBytes, " (is the peer a Plexus verbs endpoint?)"));
  }
  base::ByteReader r(bytes.data());
  if (r.U32() != kHelloMagic) {
    return absl::InvalidArgumentError(
        "verbs handshake: bad magic (the peer is not a Plexus verbs endpoint)");
  }
  const uint16_t version = r.U16();
  if (version != kHelloVersion) {
    return absl::InvalidArgumentError(absl::StrCat("verbs handshake: peer speaks version ", version,
                                                   ", this build speaks ", kHelloVersion));
  }
  r.U16();
  Hello hello;
  hello.recv_slots = r.U32();
  hello.slot_bytes = r.U32();
  if (hello.recv_slots < kMinSlots || hello.recv_slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("verbs handshake: peer announces ",
                                                   hello.recv_slots, " receive slots, expected [",
                                                   kMinSlots, ", ", kMaxSlots, "]"));
  }
  if (hello.slot_bytes < kMinSlotBytes || hello.slot_bytes > kMaxSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat("verbs handshake: peer announces slots of ",
                                                   hello.slot_bytes, " bytes, expected [",
                                                   kMinSlotBytes, ", ", kMaxSlotBytes, "]"));
  }
  return hello;
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  PLEXUS_ASSIGN_OR_RETURN(HostPort out, base::net::ParseHostPort(address, "verbs address"));
  if (out.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("verbs address '", std::string(address),
                                                   "' has an empty host (expected ip:port or "
                                                   "[ipv6]:port)"));
  }
  return out;
}

std::string FormatHostPort(std::string_view host, uint16_t port) {
  return base::net::JoinHostPort(host, port);
}

uint32_t ImmediateToWire(uint32_t host) {
  const uint8_t b[4] = {static_cast<uint8_t>(host >> 24), static_cast<uint8_t>(host >> 16),
                        static_cast<uint8_t>(host >> 8), static_cast<uint8_t>(host)};
  uint32_t out;
  std::memcpy(&out, b, sizeof out);
  return out;
}

uint32_t ImmediateFromWire(uint32_t wire) {
  uint8_t b[4];
  std::memcpy(b, &wire, sizeof b);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

absl::Status ValidateConfig(const ProtocolConfig& c) {
  if (c.slot_bytes < kMinSlotBytes || c.slot_bytes > kMaxSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat("verbs slot_bytes must be in [", kMinSlotBytes,
                                                   ", ", kMaxSlotBytes, "], got ", c.slot_bytes));
  }
  if (c.recv_slots < kMinSlots || c.recv_slots > kMaxSlots || c.send_slots < 1 ||
      c.send_slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("verbs recv_slots must be in [", kMinSlots, ", ",
                                                   kMaxSlots, "] and send_slots in [1, ", kMaxSlots,
                                                   "]"));
  }
  if (c.max_send_wr < 2 || c.max_write_bytes == 0 || c.max_write_bytes > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        "verbs max_send_wr must be >= 2 and max_write_bytes in [1, 2^31]");
  }
  return absl::OkStatus();
}

// ---- Engine -----------------------------------------------------------------------------------

Protocol::Protocol(const ProtocolConfig& config, absl::Span<uint8_t> send_pool,
                   absl::Span<uint8_t> recv_pool, Wire* wire, CompletionQueue* cq,
                   uint64_t connection_id, std::string peer)
    : config_(config),
      send_pool_(send_pool),
      recv_pool_(recv_pool),
      wire_(wire),
      cq_(cq),
      connection_id_(connection_id),
      peer_(std::move(peer)),
      wrs_(config.recv_slots + config.max_send_wr),
      matcher_(MatcherConfig{.backend = "verbs",
                             .peer = peer_,
                             .connection_cap = config.held_bytes_per_connection,
                             .device = config.held_budget,
                             .max_spare_bytes =
                                 internal::SpareBytesFor(config.held_bytes_per_connection),
                             // Chunks are copied out of receive slots that are re-posted at
                             // once: a consumed receive takes the message once it is whole.
                             .stream_consumers = false},
               [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                 Push(Opcode::kRecv, wr_id, std::move(status), bytes);
               }) {
  free_send_slots_.reserve(config_.send_slots);
  for (uint32_t i = config_.send_slots; i > 0; --i) free_send_slots_.push_back(i - 1);
}

absl::Status Protocol::Start() {
  PLEXUS_RETURN_IF_ERROR(ValidateConfig(config_));
  if (send_pool_.size() < size_t{config_.send_slots} * config_.slot_bytes ||
      recv_pool_.size() < size_t{config_.recv_slots} * config_.slot_bytes) {
    return absl::InvalidArgumentError("verbs bounce pools are smaller than the configured slots");
  }
  for (uint32_t slot = 0; slot < config_.recv_slots; ++slot) {
    PLEXUS_RETURN_IF_ERROR(PostRecvSlot(slot));
  }
  return absl::OkStatus();
}

absl::Status Protocol::Connected(const Hello& peer, absl::Time now) {
  if (peer.recv_slots < kMinSlots || peer.slot_bytes < kMinSlotBytes) {
    return absl::InvalidArgumentError("verbs handshake: peer announced too few or too small slots");
  }
  connected_ = true;
  peer_recv_slots_ = peer.recv_slots;
  credits_ = peer.recv_slots;
  chunk_bytes_ = std::min(config_.slot_bytes, peer.slot_bytes);
  last_progress_ = now;
  Pump();
  return status_;
}

absl::Status Protocol::AddOp(Op op, absl::Time now) {
  PLEXUS_RETURN_IF_ERROR(status_);
  if (!connected_) return absl::FailedPreconditionError("verbs connection is not established yet");
  if (ops_.empty()) last_progress_ = now;
  op.seq = next_seq_++;
  std::optional<uint32_t> handle = ops_.Insert(std::move(op));
  if (!handle) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many outstanding operations on the verbs connection to ", peer_));
  }
  pending_.push_back(*handle);
  Pump();
  return absl::OkStatus();
}

absl::Status Protocol::PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id,
                                absl::Time now) {
  Op op;
  op.kind = OpKind::kSend;
  op.wr_id = wr_id;
  for (const ConstBuffer& b : buffers) {
    if (b.data == nullptr && b.size > 0) {
      return absl::InvalidArgumentError("PostSend: null buffer with a non-zero size");
    }
    op.total += b.size;
  }
  if (op.total > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("PostSend: message of ", op.total,
                                                   " bytes exceeds max_message_bytes (",
                                                   config_.max_message_bytes, ")"));
  }
  op.buffers.assign(buffers.begin(), buffers.end());
  return AddOp(std::move(op), now);
}

absl::Status Protocol::PostSendProduced(size_t length, Producer producer, uint64_t wr_id,
                                        absl::Time now) {
  if (length > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("PostSendProduced: message of ", length,
                                                   " bytes exceeds max_message_bytes (",
                                                   config_.max_message_bytes, ")"));
  }
  PLEXUS_RETURN_IF_ERROR(status_);
  if (!connected_) return absl::FailedPreconditionError("verbs connection is not established yet");
  Op op;
  op.kind = OpKind::kSend;
  op.wr_id = wr_id;
  op.total = length;
  // Produced whole now: the bounce slots are filled as credits allow, which may be long after
  // the producer's data could be trusted to be ready (and the contract allows one pass only).
  op.staged.resize(length);
  if (absl::Status s = internal::ProduceRange(producer, 0, absl::MakeSpan(op.staged), length);
      !s.ok()) {
    const absl::Status why = absl::Status(
        s.code(), absl::StrCat("verbs send (wr_id ", wr_id, ") to ", peer_, ": ", s.message()));
    Push(Opcode::kSend, wr_id, why, 0);
    Fail(why);
    return absl::OkStatus();
  }
  if (length > 0) op.buffers.push_back(ConstBuffer{op.staged.data(), length});
  return AddOp(std::move(op), now);
}

absl::Status Protocol::PostWrite(const WriteRequest& request, uint64_t wr_id, absl::Time now) {
  Op op;
  op.kind = OpKind::kWrite;
  op.wr_id = wr_id;
  op.total = request.length;
  op.write = request;
  return AddOp(std::move(op), now);
}

absl::Status Protocol::PostRecv(MutableBuffer buffer, uint64_t wr_id) {
  if (buffer.data == nullptr && buffer.size > 0) {
    return absl::InvalidArgumentError("PostRecv: null buffer with a non-zero size");
  }
  // Messages that arrived whole before a failure are delivered first.
  if (!status_.ok() && !matcher_.has_unclaimed()) return status_;
  if (absl::Status s = matcher_.PostRecv(buffer, wr_id); !s.ok()) Fail(s);
  return absl::OkStatus();
}

absl::Status Protocol::PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) {
  if (!status_.ok() && !matcher_.has_unclaimed()) return status_;
  if (absl::Status s = matcher_.PostRecvConsumed(max_length, std::move(consumer), wr_id); !s.ok()) {
    Fail(s);
  }
  return absl::OkStatus();
}

absl::Status Protocol::PostRecvSlot(uint32_t slot) {
  std::optional<uint32_t> handle = wrs_.Insert(WrDesc{WrKind::kRecv, slot, 0});
  if (!handle) return absl::InternalError("verbs work-request table is full");
  absl::Status s = wire_->PostRecv(*handle, slot);
  if (!s.ok()) wrs_.Take(*handle);
  return s;
}

void Protocol::Pump() {
  while (status_.ok() && connected_ && !pending_.empty()) {
    const uint32_t op_handle = pending_.front();
    Op* op = ops_.Find(op_handle);
    if (op == nullptr) {
      pending_.pop_front();
      continue;
    }
    if (send_wrs_ >= config_.max_send_wr) break;
    const bool posted = op->kind == OpKind::kSend ? PostNextSendChunk(*op, op_handle)
                                                  : PostNextWriteSegment(*op, op_handle);
    if (!status_.ok()) return;
    if (!posted) break;
    if (op->fully_posted) pending_.pop_front();
  }
  MaybeReturnCredits();
}

bool Protocol::PostNextSendChunk(Op& op, uint32_t op_handle) {
  // Data keeps the last credit in reserve for a credit-only chunk (see the file comment).
  if (credits_ < 2 || free_send_slots_.empty()) return false;
  const uint32_t slot = free_send_slots_.back();
  uint8_t* out = send_slot(slot);
  const size_t capacity = chunk_bytes_ - kChunkHeaderBytes;
  const bool first = op.posted == 0 && op.inflight == 0;
  size_t n = 0;
  while (n < capacity && op.buf_index < op.buffers.size()) {
    const ConstBuffer& b = op.buffers[op.buf_index];
    const size_t take = std::min(capacity - n, b.size - op.buf_offset);
    if (take > 0) {
      std::memcpy(out + kChunkHeaderBytes + n, static_cast<const uint8_t*>(b.data) + op.buf_offset,
                  take);
    }
    n += take;
    op.buf_offset += take;
    if (op.buf_offset == b.size) {
      ++op.buf_index;
      op.buf_offset = 0;
    }
  }
  op.posted += n;
  const bool last = op.posted == op.total;
  ChunkHeader h;
  h.type = ChunkType::kData;
  h.flags = static_cast<uint8_t>((first ? kFirstChunk : 0) | (last ? kLastChunk : 0));
  h.credits = owed_;
  h.total_bytes = op.total;
  EncodeChunkHeader(h, out);

  std::optional<uint32_t> wr = wrs_.Insert(WrDesc{WrKind::kSendChunk, slot, op_handle});
  if (!wr) {
    Fail(absl::InternalError("verbs work-request table is full"));
    return false;
  }
  if (absl::Status s = wire_->PostSendSlot(*wr, slot, static_cast<uint32_t>(kChunkHeaderBytes + n));
      !s.ok()) {
    wrs_.Take(*wr);
    Fail(s);
    return false;
  }
  free_send_slots_.pop_back();
  owed_ = 0;
  --credits_;
  ++send_wrs_;
  ++op.inflight;
  op.fully_posted = last;
  return true;
}

bool Protocol::PostNextWriteSegment(Op& op, uint32_t op_handle) {
  const uint64_t remaining = op.total - op.posted;
  const uint64_t length = std::min(remaining, config_.max_write_bytes);
  const bool last = length == remaining;
  WriteSegment seg;
  seg.local_addr = op.write.local_addr + op.posted;
  seg.lkey = op.write.lkey;
  seg.remote_addr = op.write.remote_addr + op.posted;
  seg.rkey = op.write.rkey;
  seg.length = static_cast<uint32_t>(length);
  if (last) seg.immediate = op.write.immediate;
  // WRITE_WITH_IMM consumes one of the peer's receives, like a data chunk.
  if (seg.immediate && credits_ < 2) return false;

  std::optional<uint32_t> wr = wrs_.Insert(WrDesc{WrKind::kWrite, 0, op_handle});
  if (!wr) {
    Fail(absl::InternalError("verbs work-request table is full"));
    return false;
  }
  if (absl::Status s = wire_->PostWrite(*wr, seg); !s.ok()) {
    wrs_.Take(*wr);
    Fail(s);
    return false;
  }
  if (seg.immediate) --credits_;
  ++send_wrs_;
  ++op.inflight;
  op.posted += length;
  op.fully_posted = last;
  return true;
}

void Protocol::MaybeReturnCredits() {
  const uint32_t threshold = config_.recv_slots / 2;  // >= 2, see kMinSlots
  if (!status_.ok() || !connected_ || owed_ < threshold || credits_ < 1 ||
      free_send_slots_.empty() || send_wrs_ >= config_.max_send_wr) {
    return;
  }
  const uint32_t slot = free_send_slots_.back();
  ChunkHeader h;
  h.type = ChunkType::kCredit;
  h.credits = owed_;
  EncodeChunkHeader(h, send_slot(slot));
  std::optional<uint32_t> wr = wrs_.Insert(WrDesc{WrKind::kCreditChunk, slot, 0});
  if (!wr) {
    Fail(absl::InternalError("verbs work-request table is full"));
    return;
  }
  if (absl::Status s = wire_->PostSendSlot(*wr, slot, kChunkHeaderBytes); !s.ok()) {
    wrs_.Take(*wr);
    Fail(s);
    return;
  }
  free_send_slots_.pop_back();
  owed_ = 0;
  --credits_;
  ++send_wrs_;
}

void Protocol::FinishOpIfDone(uint32_t op_handle) {
  Op* op = ops_.Find(op_handle);
  if (op == nullptr || !op->fully_posted || op->inflight > 0) return;
  std::optional<Op> done = ops_.Take(op_handle);
  Push(done->kind == OpKind::kSend ? Opcode::kSend : Opcode::kWrite, done->wr_id, absl::OkStatus(),
       done->total);
}

void Protocol::OnCompletion(uint32_t wr_handle, const WireCompletion& completion, absl::Time now) {
  std::optional<WrDesc> desc = wrs_.Take(wr_handle);
  if (!desc) return;  // stale: its connection state was already torn down
  if (completion.status.ok()) last_progress_ = now;
  switch (desc->kind) {
    case WrKind::kRecv:
      OnRecv(desc->slot, completion);
      break;
    case WrKind::kSendChunk:
    case WrKind::kCreditChunk:
    case WrKind::kWrite:
      --send_wrs_;
      if (desc->kind != WrKind::kWrite) free_send_slots_.push_back(desc->slot);
      if (!completion.status.ok()) {
        Fail(completion.status);
        return;
      }
      if (desc->kind != WrKind::kCreditChunk) {
        if (Op* op = ops_.Find(desc->op)) --op->inflight;
        FinishOpIfDone(desc->op);
      }
      break;
  }
  Pump();
}

void Protocol::OnRecv(uint32_t slot, const WireCompletion& completion) {
  if (!completion.status.ok()) {
    Fail(completion.status);
    return;
  }
  if (!status_.ok()) return;  // late arrivals after a failure are dropped with their slot
  if (completion.immediate) {
    Push(Opcode::kRemoteWrite, 0, absl::OkStatus(), completion.byte_len, completion.immediate);
  } else if (absl::Status s = OnChunk(slot, completion.byte_len); !s.ok()) {
    Fail(s);
    return;
  }
  if (!status_.ok()) return;
  if (absl::Status s = PostRecvSlot(slot); !s.ok()) {
    Fail(s);
    return;
  }
  ++owed_;
}

absl::Status Protocol::Malformed(std::string_view what) const {
  return absl::DataLossError(
      absl::StrCat("verbs connection to ", peer_, " closed: malformed chunk: ", std::string(what)));
}

absl::Status Protocol::OnChunk(uint32_t slot, uint32_t byte_len) {
  if (byte_len > config_.slot_bytes) return Malformed("longer than a receive slot");
  const uint8_t* in = recv_slot(slot);
  absl::StatusOr<ChunkHeader> header = DecodeChunkHeader(absl::MakeConstSpan(in, byte_len));
  if (!header.ok()) return Malformed(std::string(header.status().message()));
  const ChunkHeader& h = *header;
  if (uint64_t{credits_} + h.credits > peer_recv_slots_) {
    return Malformed("the peer returned more credits than it has receives");
  }
  credits_ += h.credits;
  if (h.type == ChunkType::kCredit) return absl::OkStatus();

  const uint8_t* payload = in + kChunkHeaderBytes;
  const uint64_t n = byte_len - kChunkHeaderBytes;
  const bool first = (h.flags & kFirstChunk) != 0;
  const bool last = (h.flags & kLastChunk) != 0;
  Incoming& m = incoming_;
  if (first) {
    if (m.active) return Malformed("a message started before the previous one ended");
    if (h.total_bytes > config_.max_message_bytes) {
      return Malformed(
          absl::StrCat("message of ", h.total_bytes, " bytes exceeds max_message_bytes"));
    }
    m = Incoming{};
    PLEXUS_ASSIGN_OR_RETURN(Matcher::Admission admitted, matcher_.Admit(h.total_bytes, &m.slot));
    if (admitted == Matcher::Admission::kWait) {
      // The chunk is consumed already: verbs cannot make its peer wait (yet).
      return absl::ResourceExhaustedError(absl::StrCat(
          "verbs: peer ", peer_, " sent a message of ", h.total_bytes, " bytes while ",
          matcher_.held_bytes(),
          " bytes of its messages wait for receives; holding it would exceed the caps on held "
          "bytes (raise DeviceOptions::max_held_bytes_per_connection / _per_device or "
          "PLEXUS_MAX_HELD_BYTES_PER_CONNECTION / _PER_DEVICE, or post receives earlier)"));
    }
    m.active = true;
    m.total = h.total_bytes;
  } else if (!m.active) {
    return Malformed("a continuation chunk without a first chunk");
  } else if (h.total_bytes != m.total) {
    return Malformed("chunks of one message disagree on its length");
  }
  const uint64_t end = m.received + n;
  if (end > m.total || (last && end != m.total) || (!last && (n == 0 || end == m.total))) {
    return Malformed(absl::StrCat("chunk of ", n, " bytes at offset ", m.received,
                                  " does not fit a message of ", m.total, " bytes"));
  }
  if (n > 0) std::memcpy(m.slot.dest + m.received, payload, n);
  m.received = end;
  if (!last) return absl::OkStatus();
  const Matcher::Slot placed = m.slot;
  m = Incoming{};
  return matcher_.Placed(placed);  // an error: a consumer failed
}

void Protocol::Push(Opcode opcode, uint64_t wr_id, absl::Status status, size_t bytes,
                    std::optional<uint32_t> immediate) {
  cq_->Push(
      internal::MakeCompletion(connection_id_, opcode, wr_id, std::move(status), bytes, immediate));
}

void Protocol::Fail(const absl::Status& reason) {
  if (!status_.ok()) return;
  status_ = reason.ok() ? absl::InternalError("verbs connection failed") : reason;
  // Every outstanding operation completes once, in the order it was posted.
  std::vector<std::pair<uint64_t, Op>> ops;
  std::vector<uint32_t> handles;
  ops_.ForEach([&](uint32_t handle, Op&) { handles.push_back(handle); });
  for (uint32_t handle : handles) {
    std::optional<Op> op = ops_.Take(handle);
    ops.emplace_back(op->seq, std::move(*op));
  }
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [seq, op] : ops) {
    Push(op.kind == OpKind::kSend ? Opcode::kSend : Opcode::kWrite, op.wr_id, status_, 0);
  }
  pending_.clear();
  if (incoming_.active && !incoming_.slot.held) {
    Push(Opcode::kRecv, incoming_.slot.wr_id, status_, 0);
  }
  incoming_ = Incoming{};
  // Messages that arrived whole stay deliverable, unless we closed the connection ourselves.
  matcher_.Fail(status_, /*keep_whole=*/!absl::IsCancelled(status_));
  wire_->Abort(status_);
}

void Protocol::CheckTimeout(absl::Time now) {
  if (!status_.ok() || ops_.empty() || now - last_progress_ < config_.op_timeout) return;
  Fail(absl::DeadlineExceededError(absl::StrCat(
      "verbs connection to ", peer_, ": no progress for ", absl::FormatDuration(config_.op_timeout),
      " with ", ops_.size(), " operations outstanding (op_timeout; peer hung or link down)")));
}

}  // namespace plexus::transport::verbs
