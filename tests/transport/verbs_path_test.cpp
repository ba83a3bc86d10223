// A verbs path's binding without hardware: PathBinding validation, the RoCE v2 UDP source port of
// a flow label, the source GID choice over a given GID table (path_gid.hpp), and the backends
// without GIDs refusing them.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "verbs/path_gid.hpp"

namespace plexus::transport {
namespace {

using verbs::GidEntry;
using verbs::GidEntryForAddress;
using verbs::GidType;
using verbs::SelectSourceGid;

GidEntry Entry(uint32_t index, uint32_t port, const std::string& ip, GidType type) {
  absl::StatusOr<GidEntry> e = GidEntryForAddress(index, port, ip, type);
  REQUIRE(e.ok());
  return *e;
}

// A RoCE port as the kernel fills it: index 0/1 the link-local IPv6 (v1, v2), then each IPv4
// address of the netdev as a v1 and a v2 entry; port 2 holds another address.
std::vector<GidEntry> Table() {
  return {Entry(0, 1, "fe80::1", GidType::kRoceV1),  Entry(1, 1, "fe80::1", GidType::kRoceV2),
          Entry(2, 1, "10.0.1.1", GidType::kRoceV1), Entry(3, 1, "10.0.1.1", GidType::kRoceV2),
          Entry(4, 1, "10.0.2.1", GidType::kRoceV1), Entry(5, 1, "10.0.2.1", GidType::kRoceV2),
          Entry(0, 2, "10.0.9.1", GidType::kRoceV2), Entry(7, 1, "10.0.3.1", GidType::kRoceV1)};
}

bool Has(const absl::Status& s, const std::string& text) {
  return absl::StrContains(s.message(), text);
}

TEST_CASE("verbs path: a path's address picks its RoCE v2 GID, else its v1 one", "[verbs]") {
  const std::vector<GidEntry> table = Table();
  auto v2 = SelectSourceGid(table, 1, "10.0.2.1", -1, "path 1");
  REQUIRE(v2.ok());
  REQUIRE(v2->has_value());
  CHECK(**v2 == 5);
  auto first = SelectSourceGid(table, 1, "10.0.1.1", -1, "path 0");
  REQUIRE(first.ok());
  CHECK(first->value() == 3);
  // Only a v1 entry holds 10.0.3.1.
  auto v1 = SelectSourceGid(table, 1, "10.0.3.1", -1, "path 2");
  REQUIRE(v1.ok());
  CHECK(v1->value() == 7);
  // IPv6 addresses compare as GIDs directly.
  auto v6 = SelectSourceGid(table, 1, "fe80::1", -1, "path 3");
  REQUIRE(v6.ok());
  CHECK(v6->value() == 1);
  // The same address on another port is not this port's.
  auto other = SelectSourceGid(table, 1, "10.0.9.1", -1, "path 4");
  REQUIRE(other.ok());
  CHECK(!other->has_value());  // rdma_cm's own choice stands
  auto port2 = SelectSourceGid(table, 2, "10.0.9.1", -1, "path 4");
  REQUIRE(port2.ok());
  CHECK(port2->value() == 0);
}

TEST_CASE("verbs path: an explicit GID index is checked against the port's table", "[verbs]") {
  const std::vector<GidEntry> table = Table();
  // The v1 entry of the path's own address: allowed (that is what an explicit index is for).
  auto v1 = SelectSourceGid(table, 1, "10.0.2.1", 4, "path 1");
  REQUIRE(v1.ok());
  CHECK(v1->value() == 4);
  // An index holding another address: refused, naming both and the entries.
  auto wrong = SelectSourceGid(table, 1, "10.0.2.1", 3, "path 1");
  REQUIRE(absl::IsInvalidArgument(wrong.status()));
  CHECK(Has(wrong.status(), "path 1: gid_index 3 of port 1 holds 3 (RoCE v2 10.0.1.1)"));
  CHECK(Has(wrong.status(), "not the path's local_address 10.0.2.1"));
  CHECK(Has(wrong.status(), "5 (RoCE v2 10.0.2.1)"));
  // Out of the table, or an empty slot (6), or another port's index.
  for (int index : {6, 8, 200}) {
    auto missing = SelectSourceGid(table, 1, "10.0.2.1", index, "path 1");
    REQUIRE(absl::IsInvalidArgument(missing.status()));
    CHECK(Has(missing.status(), "is not a valid entry of port 1's GID table"));
    CHECK(Has(missing.status(), "0 (RoCE v1 fe80::1), 1 (RoCE v2 fe80::1)"));
  }
  auto port3 = SelectSourceGid(table, 3, "", 0, "path 5");
  REQUIRE(absl::IsInvalidArgument(port3.status()));
  CHECK(Has(port3.status(), "its entries: none"));
  // Without an address (e.g. InfiniBand), any valid index of the port is taken.
  auto any = SelectSourceGid(table, 2, "", 0, "path 6");
  REQUIRE(any.ok());
  CHECK(any->value() == 0);
}

TEST_CASE("verbs path: IB GIDs never match an address; bad address text is named", "[verbs]") {
  std::vector<GidEntry> ib = {Entry(0, 1, "10.0.1.1", GidType::kIb)};
  CHECK(verbs::GidAddress(ib[0]).empty());
  auto none = SelectSourceGid(ib, 1, "10.0.1.1", -1, "path 0");
  REQUIRE(none.ok());
  CHECK(!none->has_value());
  auto explicit_ib = SelectSourceGid(ib, 1, "10.0.1.1", 0, "path 0");
  REQUIRE(explicit_ib.ok());
  CHECK(explicit_ib->value() == 0);
  auto bad = SelectSourceGid(ib, 1, "host-a", -1, "path 0");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(Has(bad.status(), "path 0: local_address 'host-a' is not an IPv4 or IPv6 address"));
  CHECK(verbs::GidAddress(Entry(3, 1, "192.168.7.9", GidType::kRoceV2)) == "192.168.7.9");
  CHECK(std::string(verbs::GidTypeName(GidType::kRoceV1)) == "RoCE v1");
}

TEST_CASE("path binding: flow label and gid_index ranges, named", "[verbs]") {
  PathBinding ok;
  ok.flow_label = kMaxFlowLabel;
  ok.gid_index = 255;
  CHECK(ValidatePathBinding(ok, "path 1").ok());
  PathBinding big;
  big.flow_label = kMaxFlowLabel + 1;
  absl::Status s = ValidatePathBinding(big, "path 2");
  REQUIRE(absl::IsInvalidArgument(s));
  CHECK(Has(s, "path 2: flow_label 1048576 (0x100000) does not fit the GRH's 20 bits"));
  PathBinding gid;
  gid.gid_index = -2;
  s = ValidatePathBinding(gid, "path 3");
  REQUIRE(absl::IsInvalidArgument(s));
  CHECK(Has(s, "path 3: gid_index -2"));
  gid.gid_index = 256;
  CHECK(absl::IsInvalidArgument(ValidatePathBinding(gid, "path 3")));
}

TEST_CASE("path binding: RoCE v2 source port of a flow label (Linux's formula)", "[verbs]") {
  // low 14 bits XOR the high 6, with the top two bits set.
  CHECK(RoceV2SourcePort(0x12345) == 0xE341);
  CHECK(RoceV2SourcePort(0x00001) == 0xC001);
  CHECK(RoceV2SourcePort(0x04000) == 0xC001);  // high bits fold onto the low ones
  CHECK(RoceV2SourcePort(kMaxFlowLabel) == 0xFFC0);
  for (uint32_t label : {1u, 77u, 0x3FFFu, 0x80000u, kMaxFlowLabel}) {
    CHECK(RoceV2SourcePort(label) >= 0xC000);
  }
}

TEST_CASE("path binding: tcp takes a source address, refuses a GID or flow label", "[verbs]") {
  DeviceOptions o;
  o.backend = Backend::kTcp;
  auto device = Device::Create(o);
  REQUIRE(device.ok());
  CompletionQueue cq;
  PathBinding labelled;
  labelled.local_address = "127.0.0.1";
  labelled.flow_label = 5;
  auto refused = (*device)->ConnectOnPath(labelled, "127.0.0.1:1", &cq);
  REQUIRE(absl::IsUnimplemented(refused.status()));
  CHECK(Has(refused.status(), "the tcp backend has no GID index or flow label"));
  auto listen_refused = (*device)->ListenOnPath(labelled, "");
  CHECK(absl::IsUnimplemented(listen_refused.status()));
  PathBinding too_big;
  too_big.flow_label = 1u << 21;
  CHECK(absl::IsInvalidArgument((*device)->ConnectOnPath(too_big, "127.0.0.1:1", &cq).status()));

  // The address alone: a listener on it, and a connection from 127.0.0.2 that carries data.
  PathBinding at;
  at.local_address = "127.0.0.1";
  auto listener = (*device)->ListenOnPath(at, "");
  REQUIRE(listener.ok());
  CHECK(absl::StartsWith((*listener)->address(), "127.0.0.1:"));
  PathBinding from;
  from.local_address = "127.0.0.2";
  auto conn = (*device)->ConnectOnPath(from, (*listener)->address(), &cq);
  REQUIRE(conn.ok());
  CompletionQueue accepted_cq;
  auto accepted = (*listener)->Accept(&accepted_cq, absl::Seconds(5));
  REQUIRE(accepted.ok());
  char out[3] = {'a', 'b', 'c'}, in[3] = {};
  REQUIRE((*accepted)->PostRecv({in, sizeof in}, 7).ok());
  REQUIRE((*conn)->PostSend(ConstBuffer{out, sizeof out}, 8).ok());
  auto got = accepted_cq.Wait(absl::Seconds(5));
  REQUIRE(got.ok());
  CHECK(got->status.ok());
  CHECK(std::string(in, 3) == "abc");
  CHECK(absl::StartsWith((*accepted)->peer_address(), "127.0.0.2:"));
}

}  // namespace
}  // namespace plexus::transport
