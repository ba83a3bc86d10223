// Binding a program's buffers to memory: the caller's inputs and outputs checked against the
// declarations, scratch allocated. Shared by the interpreter and the fast executor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure::internal {

struct Bound {
  const uint8_t* read = nullptr;
  uint8_t* write = nullptr;  // null for inputs
  DataType dtype = DataType::kF32;
  size_t size = 0;  // bytes per element
};

struct BoundBuffers {
  std::vector<Bound> bufs;  // indexed like Program::buffers
  std::vector<std::vector<uint8_t>> scratch;
};

// inputs[k] / outputs[k] are the k-th input / output declaration's bytes; each must hold exactly
// count * size bytes and no output may overlap another caller buffer (InvalidArgument naming the
// buffer). Scratch buffers are zero-filled (ResourceExhausted when they cannot be allocated);
// with `scratch_needed`, only those it marks (the others stay null). Buffer `unbound` (an input
// or output, or -1) is left without memory: its span is skipped (a stream supplies it in pieces).
absl::Status BindBuffers(const Program& program, absl::Span<const ConstBytes> inputs,
                         absl::Span<const MutableBytes> outputs, BoundBuffers* out,
                         const std::vector<bool>* scratch_needed = nullptr, int unbound = -1);

}  // namespace plexus::restructure::internal
