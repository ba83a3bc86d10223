#include <atomic>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/memory.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kInproc:
      return "inproc";
    case Backend::kShm:
      return "shm";
    case Backend::kTcp:
      return "tcp";
    case Backend::kVerbs:
      return "verbs";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (Backend b : {Backend::kInproc, Backend::kShm, Backend::kTcp, Backend::kVerbs}) {
    if (lower == BackendName(b)) return b;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown transport backend '", std::string(name),
                                                 "' (expected inproc, shm, tcp or verbs)"));
}

std::string_view OpcodeName(Opcode opcode) {
  switch (opcode) {
    case Opcode::kSend:
      return "send";
    case Opcode::kRecv:
      return "recv";
    case Opcode::kWrite:
      return "write";
    case Opcode::kRemoteWrite:
      return "remote_write";
  }
  return "unknown";
}

namespace {
constexpr uint32_t kHandleMagic = 0x504c5848;  // "PLXH"
constexpr uint8_t kHandleVersion = 1;
}  // namespace

std::array<uint8_t, RegionHandle::kEncodedSize> RegionHandle::Encode() const {
  std::array<uint8_t, kEncodedSize> out{};
  base::ByteWriter w(out.data());
  w.U32(kHandleMagic);
  w.U8(kHandleVersion);
  w.U8(static_cast<uint8_t>(backend));
  w.U8(static_cast<uint8_t>(kind));
  w.U8(0);
  w.U64(id);
  w.U64(address);
  w.U64(length);
  w.U32(rkey);
  w.U32(0);
  return out;
}

absl::StatusOr<RegionHandle> RegionHandle::Decode(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kEncodedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("region handle must be ", kEncodedSize, " bytes, got ", bytes.size()));
  }
  base::ByteReader r(bytes.data());
  if (r.U32() != kHandleMagic) return absl::InvalidArgumentError("region handle: bad magic");
  if (r.U8() != kHandleVersion) {
    return absl::InvalidArgumentError("region handle: unsupported version");
  }
  RegionHandle h;
  const uint8_t backend = r.U8();
  const uint8_t kind = r.U8();
  r.U8();
  if (backend > static_cast<uint8_t>(Backend::kVerbs)) {
    return absl::InvalidArgumentError("region handle: unknown backend");
  }
  if (kind > static_cast<uint8_t>(MemoryKind::kCuda)) {
    return absl::InvalidArgumentError("region handle: unknown memory kind");
  }
  h.backend = static_cast<Backend>(backend);
  h.kind = static_cast<MemoryKind>(kind);
  h.id = r.U64();
  h.address = r.U64();
  h.length = r.U64();
  h.rkey = r.U32();
  return h;
}

namespace {
std::atomic<uint64_t> next_connection_id{1};
}  // namespace

Connection::Connection() : id_(next_connection_id.fetch_add(1, std::memory_order_relaxed)) {}

}  // namespace plexus::transport
