// MultipathDevice's composite address and set-up messages (device_wire.hpp).
#include "device_wire.hpp"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/base/net.hpp"

namespace plexus::multipath::internal {

namespace {

const std::string kPrefix = "mp:";
const std::string kRequestMagic = "plexus-multipath/1 paths=";
const std::string kReplyOk = "ok ";
const std::string kReplyError = "error ";

// "IP:PORT" or "[IPv6]:PORT" (base::net::ParseHostPort) with a numeric IP; the IP, without
// brackets.
absl::StatusOr<std::string> HostOfHostPort(const std::string& entry, const std::string& what) {
  absl::StatusOr<base::net::HostPort> hp = base::net::ParseHostPort(entry, what);
  if (!hp.ok()) return hp.status();
  if (!base::net::IsIpLiteral(hp->host)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ('", entry, "'): '", hp->host, "' is not an IP address"));
  }
  return hp->host;
}

// An IP of a path after the first: "10.0.0.2", "fd00::2" or "[fd00::2]"; the IP, without
// brackets, or nullopt.
std::optional<std::string> PathHost(const std::string& entry) {
  std::string host = entry;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (!base::net::IsIpLiteral(host)) return std::nullopt;
  return host;
}

}  // namespace

absl::StatusOr<MultipathDevice::Address> ParseCompositeAddress(std::string_view address_view) {
  const std::string address(address_view);
  const auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("multipath address '", address, "': ", why,
                                                   " (expected mp:IP0:PORT,IP1,...,IPK-1; IPv6 "
                                                   "as mp:[IP0]:PORT,IP1,...)"));
  };
  if (!absl::StartsWith(address, kPrefix)) return fail("missing the 'mp:' prefix");
  const std::vector<std::string> entries = absl::StrSplit(address.substr(kPrefix.size()), ',');
  MultipathDevice::Address out;
  for (size_t k = 0; k < entries.size(); ++k) {
    const std::string& e = entries[k];
    if (e.empty()) return fail(absl::StrCat("entry ", k, " is empty"));
    if (k == 0) {
      absl::StatusOr<std::string> host = HostOfHostPort(e, "entry 0");
      if (!host.ok()) return fail(std::string(host.status().message()));
      out.control = e;
      out.hosts.push_back(*std::move(host));
      continue;
    }
    std::optional<std::string> host = PathHost(e);
    if (!host) return fail(absl::StrCat("entry ", k, " ('", e, "') is not an IP address"));
    out.hosts.push_back(*std::move(host));
  }
  return out;
}

std::string EncodeSetupRequest(int paths) { return absl::StrCat(kRequestMagic, paths); }

absl::StatusOr<int> ParseSetupRequest(std::string_view text_view) {
  const std::string text(text_view);
  int paths = 0;
  if (!absl::StartsWith(text, kRequestMagic) ||
      !absl::SimpleAtoi(text.substr(kRequestMagic.size()), &paths) || paths < 1) {
    return absl::InvalidArgumentError("malformed multipath set-up request");
  }
  return paths;
}

std::string EncodeSetupAccept(const std::vector<std::string>& addresses) {
  return absl::StrCat(kReplyOk, absl::StrJoin(addresses, ","));
}

std::string EncodeSetupRefusal(std::string_view why) {
  return absl::StrCat(kReplyError, std::string(why));
}

absl::StatusOr<SetupReply> ParseSetupReply(std::string_view text_view,
                                           const std::vector<std::string>& hosts) {
  const std::string text(text_view);
  SetupReply out;
  if (absl::StartsWith(text, kReplyError)) {
    out.refused = true;
    out.why = text.substr(kReplyError.size(), 1000);
    return out;
  }
  if (absl::StartsWith(text, kReplyOk)) {
    out.addresses = absl::StrSplit(text.substr(kReplyOk.size()), ',');
  }
  bool well_formed = out.addresses.size() == hosts.size();
  for (size_t k = 0; well_formed && k < out.addresses.size(); ++k) {
    absl::StatusOr<std::string> host = HostOfHostPort(out.addresses[k], "path");
    well_formed = host.ok() && *host == hosts[k];
  }
  if (!well_formed) {
    return absl::DataLossError(absl::StrCat("malformed set-up answer ('", text.substr(0, 200),
                                            "'): expected ", hosts.size(), " paths on ",
                                            absl::StrJoin(hosts, ",")));
  }
  return out;
}

}  // namespace plexus::multipath::internal
