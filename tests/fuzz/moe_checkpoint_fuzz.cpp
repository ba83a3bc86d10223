// libFuzzer target for the MoE runtime's checkpoint decoder (libs/moe/src/runtime/checkpoint),
// which reads a file a user or another run may have written. The first byte picks a small model
// shape and a mode: decode the rest as it is, or encode a state made from the rest and damage
// one byte of it (so the search reaches past the checksum). Decoding never crashes; whatever
// decodes is this model's full, finite state at an allowed step and encodes back to the same
// bytes; a damaged checkpoint never decodes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/checkpoint.hpp"

namespace rt = plexus::moe::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  plexus::moe::ModelSpec spec;
  spec.layers = 1 + data[0] % 2;
  spec.experts = 1 + (data[0] >> 1) % 3;
  spec.hidden = 2;
  spec.ffn = 2;
  spec.seed = data[1];
  const rt::Layout layout(spec);
  constexpr int64_t kMaxStep = 1000;
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if ((data[0] & 0x80) == 0) {
    auto c = rt::DecodeCheckpoint(rest, "fuzz.ckpt", layout, kMaxStep);
    if (!c.ok()) return 0;
    if (static_cast<int64_t>(c->state.size()) != layout.total) std::abort();
    if (c->step < 0 || c->step > kMaxStep) std::abort();
    for (float v : c->state) {
      if (!std::isfinite(v)) std::abort();
    }
    if (rt::EncodeCheckpoint(layout, c->step, c->state) != rest) std::abort();
    return 0;
  }
  // A valid checkpoint of a state drawn from the input, then one byte changed.
  if (rest.size() < 4) return 0;
  std::vector<float> state(static_cast<size_t>(layout.total));
  const std::string_view values = rest.substr(3);
  for (size_t i = 0; i < state.size(); ++i) {
    state[i] = static_cast<float>(static_cast<int8_t>(values[i % values.size()]));
  }
  const int64_t step = static_cast<uint8_t>(rest[0]);
  std::string file = rt::EncodeCheckpoint(layout, step, state);
  auto good = rt::DecodeCheckpoint(file, "fuzz.ckpt", layout, kMaxStep);
  if (!good.ok() || good->step != step || good->state != state) std::abort();
  const size_t at =
      (static_cast<size_t>(static_cast<uint8_t>(rest[1])) << 8 | static_cast<uint8_t>(rest[2])) %
      file.size();
  const char flip = static_cast<char>(rest[3] == 0 ? 1 : rest[3]);
  file[at] = static_cast<char>(file[at] ^ flip);
  if (rt::DecodeCheckpoint(file, "fuzz.ckpt", layout, kMaxStep).ok()) std::abort();
  return 0;
}
