// Text codecs of the runtime's membership values (membership_codec.hpp). No dependency beyond
// Abseil, so that the fuzzer (tests/fuzz/moe_membership_fuzz.cpp) compiles this file alone.
#include "runtime/membership_codec.hpp"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace plexus::moe::runtime {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("moe runtime: bad ", what, " '",
                                          text.substr(0, std::min<size_t>(text.size(), 200)),
                                          "' in the job's store: ", why));
}

// Comma-separated non-negative ints (an empty field is an error).
absl::StatusOr<std::vector<int>> ParseIds(absl::string_view field, absl::string_view what,
                                          absl::string_view text) {
  std::vector<int> out;
  if (field.empty()) return out;
  for (absl::string_view p : absl::StrSplit(field, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 0) return Bad(what, text, "a list entry is not an id");
    out.push_back(v);
  }
  return out;
}

}  // namespace

std::string EncodeAlive(const AliveValue& v) { return absl::StrCat(v.step, ",", v.generation); }

absl::StatusOr<AliveValue> DecodeAlive(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ',');
  AliveValue v;
  if (f.size() != 2 || !absl::SimpleAtoi(f[0], &v.step) || !absl::SimpleAtoi(f[1], &v.generation) ||
      v.step < 0 || v.generation < 0) {
    return Bad("alive value", text, "want <step>,<generation>");
  }
  return v;
}

std::string EncodeMembership(const Membership& m) {
  return absl::StrCat(m.step, ";", m.generation, ";", absl::StrJoin(m.members, ","));
}

absl::StatusOr<Membership> DecodeMembership(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ';');
  Membership m;
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &m.step) || !absl::SimpleAtoi(f[1], &m.generation) ||
      m.step < 0 || m.generation < 0) {
    return Bad("membership", text, "want <step>;<generation>;<ids>");
  }
  absl::StatusOr<std::vector<int>> ids = ParseIds(f[2], "membership", text);
  if (!ids.ok()) return ids.status();
  m.members = *std::move(ids);
  std::vector<int> sorted = m.members;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Bad("membership", text, "no members, or one twice");
  }
  return m;
}

std::string EncodeTicket(const Ticket& t) {
  std::vector<std::string> layers;
  for (const Placement& p : t.placements) {
    std::vector<std::string> nodes;
    for (const auto& slots : p.node_slots) nodes.push_back(absl::StrJoin(slots, ","));
    layers.push_back(absl::StrJoin(nodes, "/"));
  }
  return absl::StrCat(t.epoch, ";", t.step, ";", t.generation, ";", t.admitted_before, ";",
                      t.admitted_after, ";", absl::StrJoin(t.members, ","), ";",
                      absl::StrJoin(layers, "|"));
}

absl::StatusOr<Ticket> DecodeTicket(absl::string_view text, int layers, int experts, int slots) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ';');
  Ticket t;
  if (f.size() != 7 || !absl::SimpleAtoi(f[0], &t.epoch) || !absl::SimpleAtoi(f[1], &t.step) ||
      !absl::SimpleAtoi(f[2], &t.generation) || !absl::SimpleAtoi(f[3], &t.admitted_before) ||
      !absl::SimpleAtoi(f[4], &t.admitted_after) || t.epoch < 0 || t.step < 0 || t.generation < 0 ||
      t.admitted_before < 0 || t.admitted_after <= t.admitted_before) {
    return Bad("join ticket", text, "want 7 ';'-separated fields, counts in order");
  }
  absl::StatusOr<std::vector<int>> ids = ParseIds(f[5], "join ticket", text);
  if (!ids.ok()) return ids.status();
  t.members = *std::move(ids);
  std::vector<int> sorted = t.members;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Bad("join ticket", text, "no members, or one twice");
  }
  std::vector<absl::string_view> layer_texts = absl::StrSplit(f[6], '|');
  if (static_cast<int>(layer_texts.size()) != layers) {
    return Bad("join ticket", text, absl::StrCat("want ", layers, " layers"));
  }
  for (absl::string_view layer : layer_texts) {
    Placement p;
    p.num_nodes = static_cast<int>(t.members.size());
    p.slots_per_node = slots;
    p.num_experts = experts;
    std::vector<absl::string_view> nodes = absl::StrSplit(layer, '/');
    if (nodes.size() != t.members.size()) {
      return Bad("join ticket", text, "a layer's node count differs from the members'");
    }
    for (absl::string_view node : nodes) {
      absl::StatusOr<std::vector<int>> held = ParseIds(node, "join ticket", text);
      if (!held.ok()) return held.status();
      if (static_cast<int>(held->size()) != slots ||
          std::any_of(held->begin(), held->end(), [&](int e) { return e >= experts; })) {
        return Bad("join ticket", text,
                   absl::StrCat("a node must hold ", slots, " experts below ", experts));
      }
      p.node_slots.push_back(*std::move(held));
    }
    t.placements.push_back(std::move(p));
  }
  return t;
}

}  // namespace plexus::moe::runtime
