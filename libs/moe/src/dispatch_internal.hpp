// Shared between the CPU dispatcher and the CUDA wrapper.
#pragma once

#include "absl/status/status.h"
#include "plexus/moe/dispatch.hpp"

namespace plexus::moe::internal {

// Shapes, signs, per-expert totals, and tokens without replicas.
absl::Status ValidateDispatchInput(const DispatchInput& input);

}  // namespace plexus::moe::internal
