// See path_gid.hpp.
#include "verbs/path_gid.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::transport::verbs {
namespace {

constexpr std::array<uint8_t, 12> kV4MappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool IsV4Mapped(const std::array<uint8_t, 16>& gid) {
  return std::memcmp(gid.data(), kV4MappedPrefix.data(), kV4MappedPrefix.size()) == 0;
}

std::string Describe(const GidEntry& e) {
  const std::string ip = GidAddress(e);
  return absl::StrCat(e.index, " (", GidTypeName(e.type), ip.empty() ? "" : " ", ip, ")");
}

std::string ListEntries(absl::Span<const GidEntry> table, uint32_t port) {
  std::vector<std::string> parts;
  for (const GidEntry& e : table) {
    if (e.port == port) parts.push_back(Describe(e));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

}  // namespace

const char* GidTypeName(GidType type) {
  switch (type) {
    case GidType::kIb:
      return "IB";
    case GidType::kRoceV1:
      return "RoCE v1";
    case GidType::kRoceV2:
      return "RoCE v2";
  }
  return "?";
}

std::string GidAddress(const GidEntry& entry) {
  if (entry.type == GidType::kIb) return "";
  char text[INET6_ADDRSTRLEN] = "";
  if (IsV4Mapped(entry.gid)) {
    inet_ntop(AF_INET, entry.gid.data() + 12, text, sizeof text);
  } else {
    inet_ntop(AF_INET6, entry.gid.data(), text, sizeof text);
  }
  return text;
}

absl::StatusOr<GidEntry> GidEntryForAddress(uint32_t index, uint32_t port, std::string_view ip,
                                            GidType type) {
  GidEntry e;
  e.index = index;
  e.port = port;
  e.type = type;
  const std::string text(ip);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    std::memcpy(e.gid.data(), kV4MappedPrefix.data(), kV4MappedPrefix.size());
    std::memcpy(e.gid.data() + 12, &v4, 4);
    return e;
  }
  if (inet_pton(AF_INET6, text.c_str(), e.gid.data()) == 1) return e;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an IPv4 or IPv6 address"));
}

absl::StatusOr<std::optional<uint32_t>> SelectSourceGid(absl::Span<const GidEntry> table,
                                                        uint32_t port, std::string_view address,
                                                        int requested, std::string_view what) {
  std::optional<GidEntry> wanted;  // `address` as a GID, to compare with the entries
  if (!address.empty()) {
    absl::StatusOr<GidEntry> parsed = GidEntryForAddress(0, port, address, GidType::kRoceV2);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(what), ": local_address ", parsed.status().message()));
    }
    wanted = *parsed;
  }
  if (requested >= 0) {
    for (const GidEntry& e : table) {
      if (e.port != port || e.index != static_cast<uint32_t>(requested)) continue;
      if (wanted && e.type != GidType::kIb && e.gid != wanted->gid) {
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(what), ": gid_index ", requested, " of port ", port, " holds ",
                         Describe(e), ", not the path's local_address ", std::string(address),
                         "; the port's entries: ", ListEntries(table, port)));
      }
      return std::optional<uint32_t>(e.index);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": gid_index ", requested, " is not a valid entry of port ",
                     port, "'s GID table; its entries: ", ListEntries(table, port)));
  }
  if (!wanted) return std::optional<uint32_t>();
  std::optional<uint32_t> v1;
  for (const GidEntry& e : table) {
    if (e.port != port || e.type == GidType::kIb || e.gid != wanted->gid) continue;
    if (e.type == GidType::kRoceV2) return std::optional<uint32_t>(e.index);
    if (!v1) v1 = e.index;
  }
  return v1;
}

}  // namespace plexus::transport::verbs
