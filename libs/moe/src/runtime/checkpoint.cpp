#include "runtime/checkpoint.hpp"

#include <cmath>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/hash.hpp"

namespace plexus::moe::runtime {
namespace {

constexpr size_t kHeaderBytes = sizeof(kCheckpointMagic) + 3 * sizeof(int64_t);
constexpr size_t kChecksumBytes = sizeof(uint64_t);
// The first format: magic, step, floats, floats in host order; no identity, no checksum.
constexpr char kFormat1Magic[8] = {'P', 'X', 'M', 'O', 'E', 'C', 'K', '1'};

absl::Status Refuse(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("moe runtime: checkpoint ", path, " ", what));
}

// Where float `i` of the state lies, for messages.
std::string Locate(const Layout& layout, int64_t i) {
  if (i < 2 * layout.gate_size) {
    return absl::StrCat(
        i < layout.gate_size ? "gate weights" : "gate momentum", " of layer ",
        (i % layout.gate_size) / (int64_t{layout.config.experts} * layout.config.hidden));
  }
  const int64_t per_expert = 2 * layout.expert_params;
  const int64_t k = (i - 2 * layout.gate_size) / per_expert;
  const bool momentum = (i - 2 * layout.gate_size) % per_expert >= layout.expert_params;
  return absl::StrCat(momentum ? "momentum" : "weights", " of layer ", k / layout.config.experts,
                      " expert ", k % layout.config.experts);
}

}  // namespace

uint64_t ModelIdentity(const ModelSpec& c) {
  return base::Fnv1a64(
      absl::StrFormat("plexus-moe model: layers=%d experts=%d hidden=%d ffn=%d top_k=%d skew=%.17g "
                      "tokens_per_step=%d seed=%d learning_rate=%.9g momentum=%.9g",
                      c.layers, c.experts, c.hidden, c.ffn, c.top_k, c.skew, c.tokens_per_step,
                      c.seed, c.learning_rate, c.momentum));
}

std::string EncodeCheckpoint(const Layout& layout, int64_t step, const std::vector<float>& state) {
  std::string data(kCheckpointMagic, sizeof(kCheckpointMagic));
  data.reserve(kHeaderBytes + state.size() * sizeof(float) + kChecksumBytes);
  base::AppendLittleEndian<int64_t>(data, step);
  base::AppendLittleEndian<int64_t>(data, static_cast<int64_t>(state.size()));
  base::AppendLittleEndian<uint64_t>(data, ModelIdentity(layout.config));
  for (float v : state) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    base::AppendLittleEndian<uint32_t>(data, bits);
  }
  base::AppendLittleEndian<uint64_t>(data, base::Fnv1a64(data));
  return data;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view data, const std::string& path,
                                            const Layout& layout, int64_t max_step) {
  const size_t want = kHeaderBytes + layout.total * sizeof(float) + kChecksumBytes;
  if (data.empty()) return Refuse(path, "is empty (0 bytes): it was never written completely");
  const std::string_view magic = data.substr(0, sizeof(kCheckpointMagic));
  if (magic == std::string_view(kFormat1Magic, sizeof(kFormat1Magic))) {
    return Refuse(path,
                  "is in format 1 (magic PXMOECK1: no checksum, no model identity), which this "
                  "runtime no longer loads; delete it to restart from the initial model");
  }
  if (magic != std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))) {
    return Refuse(path,
                  absl::StrCat("is not a checkpoint of this runtime: it starts with \"",
                               absl::CHexEscape(absl::string_view(magic.data(), magic.size())),
                               "\", not the magic \"PXMOECK2\" (", data.size(), " bytes)"));
  }
  if (data.size() < kHeaderBytes + kChecksumBytes) {
    return Refuse(path, absl::StrCat("is truncated: ", data.size(), " bytes, shorter than the ",
                                     kHeaderBytes + kChecksumBytes,
                                     " bytes of the header and checksum alone"));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  const int64_t step = base::LoadLittleEndian<int64_t>(bytes + 8);
  const int64_t floats = base::LoadLittleEndian<int64_t>(bytes + 16);
  const uint64_t identity = base::LoadLittleEndian<uint64_t>(bytes + 24);
  if (floats != layout.total) {
    return Refuse(path, absl::StrCat("holds ", floats, " floats, this model has ", layout.total,
                                     ": it is a checkpoint of another model"));
  }
  if (data.size() != want) {
    return Refuse(path, absl::StrCat("is ", data.size(), " bytes, but a checkpoint of ", floats,
                                     " floats is ", want, " bytes: it is ",
                                     data.size() < want ? "truncated" : "followed by extra bytes"));
  }
  const uint64_t stored = base::LoadLittleEndian<uint64_t>(bytes + want - kChecksumBytes);
  const uint64_t computed = base::Fnv1a64(data.substr(0, want - kChecksumBytes));
  if (stored != computed) {
    return Refuse(path, absl::StrFormat("is corrupt: its checksum is %016x, its %d bytes hash to "
                                        "%016x",
                                        stored, want - kChecksumBytes, computed));
  }
  const uint64_t mine = ModelIdentity(layout.config);
  if (identity != mine) {
    return Refuse(
        path, absl::StrFormat("is of another model or run: model identity %016x, this run's %016x "
                              "(layers, experts, hidden, ffn, top_k, skew, tokens_per_step, seed, "
                              "learning_rate and momentum must all be equal)",
                              identity, mine));
  }
  if (step < 0 || step > max_step) {
    return Refuse(path, absl::StrCat("is at step ", step, ", outside this run's 0..", max_step,
                                     " (a run resumes at or before the step it reached): it "
                                     "is of another run"));
  }
  Checkpoint out;
  out.step = step;
  out.state.resize(layout.total);
  for (int64_t i = 0; i < layout.total; ++i) {
    const uint32_t bits = base::LoadLittleEndian<uint32_t>(bytes + kHeaderBytes + 4 * i);
    std::memcpy(&out.state[i], &bits, sizeof bits);
    if (!std::isfinite(out.state[i])) {
      return Refuse(path, absl::StrCat("holds a non-finite value (", out.state[i], ") at float ", i,
                                       ", ", Locate(layout, i), ": the run it saved diverged"));
    }
  }
  return out;
}

}  // namespace plexus::moe::runtime
