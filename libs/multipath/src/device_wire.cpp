// MultipathDevice's composite address and set-up messages (device_wire.hpp).
#include "device_wire.hpp"

#include <arpa/inet.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace plexus::multipath::internal {

namespace {

const std::string kPrefix = "mp:";
const std::string kRequestMagic = "plexus-multipath/1 paths=";
const std::string kReplyOk = "ok ";
const std::string kReplyError = "error ";

// "IP:PORT" with an IPv4 literal and a port in [0, 65535].
absl::Status CheckHostPort(const std::string& entry, const std::string& what) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ('", entry, "'): expected IP:PORT"));
  }
  if (!IsIpv4(entry.substr(0, colon))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ('", entry, "'): '", entry.substr(0, colon), "' is not an IPv4 address"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ('", entry, "'): port '",
                                                   entry.substr(colon + 1),
                                                   "' is not a number in [0, 65535]"));
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
}

}  // namespace

bool IsIpv4(const std::string& text) {
  in_addr a;
  return inet_pton(AF_INET, text.c_str(), &a) == 1;
}

absl::StatusOr<MultipathDevice::Address> ParseCompositeAddress(std::string_view address_view) {
  const std::string address(address_view);
  const auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("multipath address '", address, "': ", why,
                                                   " (expected mp:IP0:PORT,IP1,...,IPK-1)"));
  };
  if (!absl::StartsWith(address, kPrefix)) return fail("missing the 'mp:' prefix");
  const std::vector<std::string> entries = absl::StrSplit(address.substr(kPrefix.size()), ',');
  MultipathDevice::Address out;
  for (size_t k = 0; k < entries.size(); ++k) {
    const std::string& e = entries[k];
    if (e.empty()) return fail(absl::StrCat("entry ", k, " is empty"));
    if (k == 0) {
      if (absl::Status s = CheckHostPort(e, "entry 0"); !s.ok()) {
        return fail(std::string(s.message()));
      }
      out.control = e;
      out.hosts.push_back(HostOf(e));
      continue;
    }
    if (!IsIpv4(e)) {
      return fail(absl::StrCat("entry ", k, " ('", e, "') is not an IPv4 address"));
    }
    out.hosts.push_back(e);
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
    well_formed =
        CheckHostPort(out.addresses[k], "path").ok() && HostOf(out.addresses[k]) == hosts[k];
  }
  if (!well_formed) {
    return absl::DataLossError(absl::StrCat("malformed set-up answer ('", text.substr(0, 200),
                                            "'): expected ", hosts.size(), " paths on ",
                                            absl::StrJoin(hosts, ",")));
  }
  return out;
}

}  // namespace plexus::multipath::internal
