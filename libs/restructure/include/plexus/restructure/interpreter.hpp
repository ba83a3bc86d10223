// The reference interpreter: runs a Program with straightforward loops, one element at a time.
// It defines the semantics written in program.hpp; faster executors are checked against it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure {

using ConstBytes = absl::Span<const uint8_t>;
using MutableBytes = absl::Span<uint8_t>;

// Validates `program`, then runs it. inputs[k] is the k-th input declaration's bytes and
// outputs[k] the k-th output's, in declaration order; each must hold exactly count * size bytes
// (no alignment needed) and no output may overlap another caller buffer (InvalidArgument naming
// the buffer otherwise). Scratch buffers are allocated here, zero-filled. An output element no
// step writes keeps its bytes.
absl::Status Interpret(const Program& program, absl::Span<const ConstBytes> inputs,
                       absl::Span<const MutableBytes> outputs);

// One element of `dtype` at `p` as f32 (i32 rounds to nearest even; others are exact).
float LoadElement(DataType dtype, const uint8_t* p);
// Stores `v` as `dtype` at `p`: f16/bf16 round to nearest even, integers round to nearest even
// and saturate, NaN stores as 0 in an integer type.
void StoreElement(DataType dtype, uint8_t* p, float v);

}  // namespace plexus::restructure
