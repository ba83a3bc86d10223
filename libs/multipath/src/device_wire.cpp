// MultipathDevice's composite address and set-up messages (device_wire.hpp).
#include "device_wire.hpp"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/base/net.hpp"
#include "plexus/base/record.hpp"

namespace plexus::multipath::internal {

namespace {

const std::string kPrefix = "mp:";
// The set-up messages: base::Records of these kinds.
constexpr std::string_view kRequestRecord = "multipath.setup_request";
constexpr std::string_view kReplyRecord = "multipath.setup_reply";
constexpr std::string_view kVerdictRecord = "multipath.setup_verdict";
constexpr uint16_t kSetupVersion = 2;  // 2: the verdicts after the paths
constexpr int kMaxPaths = 1 << 16;     // a connection's paths are numbered in 16 bits
constexpr size_t kMaxAddressBytes = 300;
constexpr size_t kMaxRefusalBytes = 1000;

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

std::string EncodeSetupRequest(int paths) {
  return base::RecordWriter(kRequestRecord, kSetupVersion).Int("paths", paths).Finish();
}

absl::StatusOr<int> ParseSetupRequest(std::string_view text) {
  absl::StatusOr<base::RecordReader> r =
      base::RecordReader::Parse(text, kRequestRecord, kSetupVersion);
  absl::Status status = r.status();
  int paths = 0;
  if (r.ok()) {
    paths = r->IntAs<int>("paths", 1, kMaxPaths);
    status = r->Finish();
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed multipath set-up request: ", status.message()));
  }
  return paths;
}

std::string EncodeSetupAccept(const std::vector<std::string>& addresses) {
  return base::RecordWriter(kReplyRecord, kSetupVersion)
      .Int("refused", 0)
      .Strings("addresses", addresses)
      .Finish();
}

std::string EncodeSetupRefusal(std::string_view why) {
  return base::RecordWriter(kReplyRecord, kSetupVersion)
      .Int("refused", 1)
      .String("why", why.substr(0, kMaxRefusalBytes))
      .Finish();
}

absl::StatusOr<SetupReply> ParseSetupReply(std::string_view text,
                                           const std::vector<std::string>& hosts) {
  const auto malformed = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("malformed set-up answer: ", why, " (expected ",
                                            hosts.size(), " paths on ", absl::StrJoin(hosts, ","),
                                            ")"));
  };
  absl::StatusOr<base::RecordReader> r =
      base::RecordReader::Parse(text, kReplyRecord, kSetupVersion);
  if (!r.ok()) return malformed(r.status().message());
  SetupReply out;
  out.refused = r->Int("refused", 0, 1) == 1;
  if (out.refused) {
    out.why = r->String("why", kMaxRefusalBytes);
  } else {
    out.addresses = r->Strings("addresses", kMaxPaths, kMaxAddressBytes);
    if (r->ok() && out.addresses.size() != hosts.size()) {
      r->Fail("addresses", absl::StrCat(out.addresses.size(), " paths"));
    }
    for (size_t k = 0; r->ok() && k < out.addresses.size(); ++k) {
      absl::StatusOr<std::string> host = HostOfHostPort(out.addresses[k], "path");
      if (!host.ok()) {
        r->Fail("addresses", std::string(host.status().message()));
      } else if (*host != hosts[k]) {
        r->Fail("addresses",
                absl::StrCat("path ", k, " ('", out.addresses[k], "') is not on ", hosts[k]));
      }
    }
  }
  if (absl::Status s = r->Finish(); !s.ok()) return malformed(s.message());
  return out;
}

std::string EncodeSetupReady() {
  return base::RecordWriter(kVerdictRecord, kSetupVersion).Int("ready", 1).Finish();
}

std::string EncodeSetupFailed(std::string_view why) {
  return base::RecordWriter(kVerdictRecord, kSetupVersion)
      .Int("ready", 0)
      .String("why", why.substr(0, kMaxRefusalBytes))
      .Finish();
}

absl::StatusOr<SetupVerdict> ParseSetupVerdict(std::string_view text) {
  absl::StatusOr<base::RecordReader> r =
      base::RecordReader::Parse(text, kVerdictRecord, kSetupVersion);
  absl::Status status = r.status();
  SetupVerdict out;
  if (r.ok()) {
    out.ready = r->Int("ready", 0, 1) == 1;
    if (!out.ready) out.why = r->String("why", kMaxRefusalBytes);
    status = r->Finish();
  }
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat("malformed set-up verdict: ", status.message()));
  }
  return out;
}

}  // namespace plexus::multipath::internal
