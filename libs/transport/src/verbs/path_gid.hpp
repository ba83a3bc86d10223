// Which source GID a verbs path uses: the choice over a port's GID table, as a pure function of
// the entries ibv_query_gid_table reports (index, port, GID, RoCE v1 / v2 / IB), so that it is
// tested without an RDMA device. verbs_cm.cpp reads the table; verbs_connection.cpp applies the
// choice to the queue pair.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::transport::verbs {

enum class GidType : uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };

const char* GidTypeName(GidType type);  // "IB", "RoCE v1", "RoCE v2"

struct GidEntry {
  uint32_t index = 0;
  uint32_t port = 1;
  std::array<uint8_t, 16> gid{};
  GidType type = GidType::kRoceV2;
};

// The IP a RoCE GID holds ("10.0.0.1" for ::ffff:10.0.0.1, else the IPv6 text); "" for IB.
std::string GidAddress(const GidEntry& entry);

// A GID entry built from an IP (IPv4 becomes ::ffff:a.b.c.d, as RoCE GID tables hold it);
// InvalidArgument for text that is not an IP.
absl::StatusOr<GidEntry> GidEntryForAddress(uint32_t index, uint32_t port, std::string_view ip,
                                            GidType type);

// The source GID index of a path whose rdma_cm id is bound to `address` on `port`:
// - `requested` >= 0: that entry, which must be in the port's table and, when `address` is
//   non-empty and the entry is RoCE, hold `address` (InvalidArgument naming `what`, the index,
//   what it holds and the port's valid entries otherwise);
// - `requested` == -1: the port's RoCE v2 entry for `address`, else its RoCE v1 entry; nullopt
//   when no entry holds it (InfiniBand, or an address rdma_cm resolved another way), which keeps
//   rdma_cm's own choice.
absl::StatusOr<std::optional<uint32_t>> SelectSourceGid(absl::Span<const GidEntry> table,
                                                        uint32_t port, std::string_view address,
                                                        int requested, std::string_view what);

}  // namespace plexus::transport::verbs
