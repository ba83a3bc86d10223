// The runtime's membership values on the job's store (base::Records): round trips, and refusals
// that name the field.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/base/record.hpp"
#include "runtime/membership_codec.hpp"

namespace rt = plexus::moe::runtime;

namespace {

// `decoded` failed with DataLoss naming the store and saying `says`.
template <typename T>
void CheckRefused(const absl::StatusOr<T>& decoded, const std::string& says) {
  REQUIRE_FALSE(decoded.ok());
  const std::string message(decoded.status().message());
  INFO(message);
  CHECK(absl::IsDataLoss(decoded.status()));
  CHECK(absl::StrContains(message, "in the job's store"));
  CHECK(absl::StrContains(message, says));
}

}  // namespace

TEST_CASE("membership values round-trip", "[moe][runtime]") {
  auto alive = rt::DecodeAlive(rt::EncodeAlive({12, 3}));
  REQUIRE(alive.ok());
  CHECK(alive->step == 12);
  CHECK(alive->generation == 3);

  auto members = rt::DecodeMembership(rt::EncodeMembership({7, 2, {3, 0, 5}}));
  REQUIRE(members.ok());
  CHECK(members->step == 7);
  CHECK(members->members == std::vector<int>{3, 0, 5});

  rt::Ticket t{.epoch = 2,
               .step = 40,
               .generation = 1,
               .admitted_after = 1,
               .members = {0, 2, 4},
               .placements = {}};
  for (int layer = 0; layer < 2; ++layer) {
    plexus::moe::Placement p;
    p.node_slots = {{0, 1}, {2, 3}, {layer, 3}};
    t.placements.push_back(p);
  }
  auto back = rt::DecodeTicket(rt::EncodeTicket(t), /*layers=*/2, /*experts=*/4, /*slots=*/2);
  REQUIRE(back.ok());
  CHECK(back->members == t.members);
  CHECK(back->admitted_after == 1);
  REQUIRE(back->placements.size() == 2);
  CHECK(back->placements[1].node_slots == t.placements[1].node_slots);
  CHECK(back->placements[0].num_nodes == 3);
  CHECK(back->placements[0].num_experts == 4);
}

TEST_CASE("membership values from the store are checked field by field", "[moe][runtime]") {
  CheckRefused(rt::DecodeAlive("12,3"), "not a record");
  CheckRefused(rt::DecodeAlive(rt::EncodeAlive({-1, 0})), "field 'step'");
  CheckRefused(rt::DecodeMembership(rt::EncodeMembership({1, 1, {}})),
               "field 'members': no members, or one twice");
  CheckRefused(rt::DecodeMembership(rt::EncodeMembership({1, 1, {2, 2}})),
               "field 'members': no members, or one twice");
  CheckRefused(rt::DecodeMembership(rt::EncodeMembership({1, 1, {0, -3}})),
               "field 'members': entry 1 = -3");
  // Another kind of value under the key: refused, not misread.
  CheckRefused(rt::DecodeMembership(rt::EncodeAlive({1, 1})), "is a 'moe.alive' record");
  CheckRefused(rt::DecodeAlive(plexus::base::RecordWriter("moe.alive", 1)
                                   .Int("step", 1)
                                   .Int("generation", 1)
                                   .Int("extra", 1)
                                   .Finish()),
               "unknown field 'extra'");

  rt::Ticket t{.admitted_after = 1, .members = {0, 1}, .placements = {}};
  plexus::moe::Placement p;
  p.node_slots = {{0}, {5}};
  t.placements = {p};
  // Expert 5 of 4, and a shape other than the model's.
  CheckRefused(rt::DecodeTicket(rt::EncodeTicket(t), 1, 4, 1),
               "field 'placements': entry 1 = 5 is outside [0, 3]");
  CheckRefused(rt::DecodeTicket(rt::EncodeTicket(t), 2, 8, 1),
               "field 'placements': has 2 experts, want 2 layers x 2 nodes x 1 slots");
  t.admitted_after = 0;
  CheckRefused(rt::DecodeTicket(rt::EncodeTicket(t), 1, 8, 1),
               "field 'admitted_after': 0 is not above admitted_before (0)");
}
