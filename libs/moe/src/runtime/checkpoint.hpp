// The runtime's checkpoint file (docs/moe.md, "Checkpoints"): the full state of the model at a
// step, with what a reader needs to refuse a file that is not this run's: the model's identity,
// a checksum over every byte, and bounds on the step and the values.
//
// Format 2, little-endian:
//   magic "PXMOECK2" | step int64 | floats int64 | model identity uint64 |
//   floats x float32 (GatherState's layout) | FNV-1a 64 of every byte before it
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/moe/runtime.hpp"
#include "runtime/model.hpp"

namespace plexus::moe::runtime {

inline constexpr char kCheckpointMagic[8] = {'P', 'X', 'M', 'O', 'E', 'C', 'K', '2'};

// What identifies a run's model: every field of the ModelSpec (shape, routing, batch, seed,
// optimiser). Training is deterministic in (spec, step), so two runs with equal identities have
// equal states at every step; a checkpoint of another identity is of another run.
uint64_t ModelIdentity(const ModelSpec& spec);

std::string EncodeCheckpoint(const Layout& layout, int64_t step, const std::vector<float>& state);

struct Checkpoint {
  int64_t step = 0;
  std::vector<float> state;
};

// Decodes `data`, read from `path`, for `layout`'s model. DataLoss naming `path` and what is
// wrong: not a checkpoint (magic), another format, another size of model, truncated or
// extended, a checksum that does not match, another model or run, a step outside
// [0, max_step] (a run never resumes ahead of where it is), a value that is not finite.
absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view data, const std::string& path,
                                            const Layout& layout, int64_t max_step);

}  // namespace plexus::moe::runtime
