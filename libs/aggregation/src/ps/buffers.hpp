// 64-byte aligned byte buffers: merge buffers, weights, state and frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace plexus::aggregation::internal {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t, AlignedFree>;

inline AlignedBytes AllocAligned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
  if (p != nullptr) std::memset(p, 0, rounded == 0 ? 64 : rounded);
  return AlignedBytes(p);
}

}  // namespace plexus::aggregation::internal
