// Fuzzes MultipathDevice's texts from the network: the composite address, the connector's set-up
// request, the listener's answer (checked against the address's hosts) and either side's verdict.
// No crash, no overflow; whatever is accepted is well formed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "device_wire.hpp"
#include "plexus/base/net.hpp"

namespace pmi = plexus::multipath::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto address = pmi::ParseCompositeAddress(text);
  if (address.ok()) {
    if (address->hosts.empty() || address->control.empty()) __builtin_trap();
    for (const std::string& host : address->hosts) {
      if (!plexus::base::net::IsIpLiteral(host)) __builtin_trap();
    }
    // An acceptance built for these hosts parses back to the same addresses.
    std::vector<std::string> addresses;
    for (const std::string& host : address->hosts) {
      addresses.push_back(plexus::base::net::JoinHostPort(host, 1));
    }
    auto round = pmi::ParseSetupReply(pmi::EncodeSetupAccept(addresses), address->hosts);
    if (!round.ok() || round->refused || round->addresses != addresses) __builtin_trap();
  }
  auto request = pmi::ParseSetupRequest(text);
  if (request.ok() && *request < 1) __builtin_trap();
  const std::vector<std::string> hosts = {"127.0.0.1", "127.0.0.2"};
  auto reply = pmi::ParseSetupReply(text, hosts);
  if (reply.ok() && !reply->refused && reply->addresses.size() != hosts.size()) __builtin_trap();
  auto verdict = pmi::ParseSetupVerdict(text);
  if (verdict.ok() && verdict->ready && !verdict->why.empty()) __builtin_trap();
  return 0;
}
