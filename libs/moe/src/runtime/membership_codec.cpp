// Codecs of the runtime's membership values (membership_codec.hpp), as base::Records. No
// dependency beyond Abseil and base's record, so that the fuzzer
// (tests/fuzz/moe_membership_fuzz.cpp) compiles this file with record.cpp alone.
#include "runtime/membership_codec.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/base/record.hpp"

namespace plexus::moe::runtime {
namespace {

// Every value is a record of version 1; the kinds are "moe.alive", "moe.membership" and
// "moe.ticket".
constexpr uint16_t kVersion = 1;
// Physical node ids, and experts held in a ticket's placements, at most.
constexpr size_t kMaxMembers = size_t{1} << 20;
constexpr size_t kMaxPlacementEntries = size_t{1} << 24;

// Parses `text` as a record of `kind` and reads it into a T with `read`; any error, and a field
// `read` did not ask for, is DataLoss naming `what`.
template <typename T, typename Read>
absl::StatusOr<T> Decode(absl::string_view text, std::string_view kind, std::string_view what,
                         Read read) {
  absl::StatusOr<base::RecordReader> r =
      base::RecordReader::Parse(std::string_view(text.data(), text.size()), kind, kVersion);
  absl::Status status = r.status();
  T value;
  if (r.ok()) {
    read(*r, value);
    status = r->Finish();
  }
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat("moe runtime: bad ", std::string(what),
                                            " in the job's store: ", status.message()));
  }
  return value;
}

// The fields the alive value and the membership start with: steps completed, deployments
// committed (both >= 0).
base::RecordWriter StepAndGeneration(std::string_view kind, int64_t step, int64_t generation) {
  base::RecordWriter w(kind, kVersion);
  w.Int("step", step).Int("generation", generation);
  return w;
}
void ReadStepAndGeneration(base::RecordReader& r, int64_t* step, int64_t* generation) {
  *step = r.Int("step", 0);
  *generation = r.Int("generation", 0);
}

// A non-empty list of distinct ids >= 0.
std::vector<int> ReadMembers(base::RecordReader& r) {
  std::vector<int> members = r.Ints<int>("members", kMaxMembers, 0);
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (r.ok() &&
      (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())) {
    r.Fail("members", "no members, or one twice");
  }
  return members;
}

}  // namespace

std::string EncodeAlive(const AliveValue& v) {
  return StepAndGeneration("moe.alive", v.step, v.generation).Finish();
}

absl::StatusOr<AliveValue> DecodeAlive(absl::string_view text) {
  return Decode<AliveValue>(text, "moe.alive", "alive value",
                            [](base::RecordReader& r, AliveValue& v) {
                              ReadStepAndGeneration(r, &v.step, &v.generation);
                            });
}

std::string EncodeMembership(const Membership& m) {
  return StepAndGeneration("moe.membership", m.step, m.generation)
      .Ints("members", m.members)
      .Finish();
}

absl::StatusOr<Membership> DecodeMembership(absl::string_view text) {
  return Decode<Membership>(text, "moe.membership", "membership",
                            [](base::RecordReader& r, Membership& m) {
                              ReadStepAndGeneration(r, &m.step, &m.generation);
                              m.members = ReadMembers(r);
                            });
}

std::string EncodeTicket(const Ticket& t) {
  // Placements flattened layer by layer, node by node: the decoder knows the shape.
  std::vector<int> experts;
  for (const Placement& p : t.placements) {
    for (const auto& slots : p.node_slots) {
      experts.insert(experts.end(), slots.begin(), slots.end());
    }
  }
  return base::RecordWriter("moe.ticket", kVersion)
      .Int("epoch", t.epoch)
      .Int("step", t.step)
      .Int("generation", t.generation)
      .Int("admitted_before", t.admitted_before)
      .Int("admitted_after", t.admitted_after)
      .Ints("members", t.members)
      .Ints("placements", experts)
      .Finish();
}

absl::StatusOr<Ticket> DecodeTicket(absl::string_view text, int layers, int experts, int slots) {
  return Decode<Ticket>(text, "moe.ticket", "join ticket", [&](base::RecordReader& r, Ticket& t) {
    t.epoch = r.IntAs<int>("epoch", 0);
    t.step = r.Int("step", 0);
    t.generation = r.Int("generation", 0);
    t.admitted_before = r.Int("admitted_before", 0);
    t.admitted_after = r.Int("admitted_after", 0);
    if (r.ok() && t.admitted_after <= t.admitted_before) {
      r.Fail("admitted_after", absl::StrCat(t.admitted_after, " is not above admitted_before (",
                                            t.admitted_before, ")"));
    }
    t.members = ReadMembers(r);
    const std::vector<int> held = r.Ints<int>("placements", kMaxPlacementEntries, 0, experts - 1);
    const size_t nodes = t.members.size();
    if (r.ok() && held.size() != static_cast<size_t>(layers) * nodes * static_cast<size_t>(slots)) {
      r.Fail("placements", absl::StrCat("has ", held.size(), " experts, want ", layers,
                                        " layers x ", nodes, " nodes x ", slots, " slots"));
    }
    if (!r.ok()) return;
    auto at = held.begin();
    for (int l = 0; l < layers; ++l) {
      Placement p;
      p.num_nodes = static_cast<int>(nodes);
      p.slots_per_node = slots;
      p.num_experts = experts;
      for (size_t n = 0; n < nodes; ++n, at += slots) p.node_slots.emplace_back(at, at + slots);
      t.placements.push_back(std::move(p));
    }
  });
}

}  // namespace plexus::moe::runtime
