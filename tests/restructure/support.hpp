// Helpers shared by the restructure tests: typed byte buffers and running a program on them.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure::testing {

template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> FromBytes(const std::vector<uint8_t>& b) {
  std::vector<T> out(b.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
  return out;
}

// Runs `p` on `inputs` (bytes, in declaration order); outputs start as `fill` bytes.
inline absl::Status RunProgram(const Program& p, const std::vector<std::vector<uint8_t>>& inputs,
                               std::vector<std::vector<uint8_t>>* outputs, uint8_t fill = 0xEE) {
  outputs->clear();
  for (const BufferDecl& b : p.buffers) {
    if (b.role == Role::kOutput) {
      outputs->emplace_back(static_cast<size_t>(b.count) * kernels::DataTypeSize(b.dtype), fill);
    }
  }
  std::vector<ConstBytes> in;
  for (const auto& v : inputs) in.emplace_back(v.data(), v.size());
  std::vector<MutableBytes> out;
  for (auto& v : *outputs) out.emplace_back(v.data(), v.size());
  return Interpret(p, in, out);
}

}  // namespace plexus::restructure::testing
