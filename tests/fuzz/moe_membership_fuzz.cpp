// libFuzzer target for the codecs of the MoE runtime's membership values (libs/moe/src/runtime/
// membership_codec, base::Records), which a rank reads from the job's store as other processes
// wrote them: survivors' "alive" values, the leader's "members", a newcomer's join ticket. The
// first three bytes pick the model shape the ticket is checked against, the rest is the value.
// Decoding must never crash, and whatever decodes must encode back to a value that decodes to
// the same thing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/membership_codec.hpp"

namespace rt = plexus::moe::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int layers = 1 + data[0] % 4, experts = 1 + data[1] % 8, slots = 1 + data[2] % 4;
  const std::string text(reinterpret_cast<const char*>(data + 3), size - 3);
  if (auto a = rt::DecodeAlive(text); a.ok()) {
    auto again = rt::DecodeAlive(rt::EncodeAlive(*a));
    if (!again.ok() || again->step != a->step || again->generation != a->generation) std::abort();
  }
  if (auto m = rt::DecodeMembership(text); m.ok()) {
    auto again = rt::DecodeMembership(rt::EncodeMembership(*m));
    if (!again.ok() || again->members != m->members || again->step != m->step) std::abort();
  }
  if (auto t = rt::DecodeTicket(text, layers, experts, slots); t.ok()) {
    if (static_cast<int>(t->placements.size()) != layers) std::abort();
    for (const auto& p : t->placements) {
      if (p.node_slots.size() != t->members.size()) std::abort();
      for (const auto& node : p.node_slots) {
        if (static_cast<int>(node.size()) != slots) std::abort();
        for (int e : node) {
          if (e < 0 || e >= experts) std::abort();
        }
      }
    }
    auto again = rt::DecodeTicket(rt::EncodeTicket(*t), layers, experts, slots);
    if (!again.ok() || again->members != t->members || again->step != t->step ||
        again->admitted_after != t->admitted_after) {
      std::abort();
    }
    for (size_t l = 0; l < t->placements.size(); ++l) {
      if (again->placements[l].node_slots != t->placements[l].node_slots) std::abort();
    }
  }
  return 0;
}
