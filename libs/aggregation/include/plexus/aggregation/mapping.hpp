// Key chunking and the chunk -> connection -> core mapping (PHub §3.2.3-3.2.4). Pure functions of
// their inputs, deterministic to the tie-break, so every worker and the server compute the same
// mapping without talking to each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace plexus::aggregation {

// PHub's default: the smallest message that saturates the network.
inline constexpr size_t kDefaultChunkBytes = size_t{32} << 10;

// A contiguous piece of one key, the unit of aggregation, transfer and ownership.
struct Chunk {
  uint64_t key = 0;
  uint32_t index = 0;   // within the key, from 0
  size_t offset = 0;    // first element
  size_t elements = 0;  // > 0
  size_t bytes = 0;     // elements * element size
};

// Splits a key of `elements` elements into chunks of floor(chunk_bytes / element_bytes) elements
// (the last one shorter). InvalidArgument for 0 elements, element_bytes or chunk_bytes <
// element_bytes, or more than 2^32 chunks.
absl::StatusOr<std::vector<Chunk>> SplitKey(uint64_t key, size_t elements, size_t element_bytes,
                                            size_t chunk_bytes);

// Graham's LPT: items in order of decreasing size (ties: lower index first) each go to the bin
// with the least load so far (ties: lower bin), starting from `initial_loads` (empty: zeros).
// Makespan <= (4/3 - 1/(3 bins)) * optimum. Returns the bin of each item.
std::vector<int> LptAssign(absl::Span<const uint64_t> sizes, int bins,
                           absl::Span<const uint64_t> initial_loads = {});
// The largest bin load of an assignment.
uint64_t Makespan(absl::Span<const uint64_t> sizes, absl::Span<const int> bins, int num_bins);

// Two levels, as PHub: chunks to connections by LPT on chunk bytes, then connections to cores by
// LPT on the connections' loads.
struct Mapping {
  std::vector<int> chunk_connection;  // per chunk
  std::vector<int> connection_core;   // per connection
  std::vector<uint64_t> core_bytes;   // per core: bytes of the chunks it owns
};
Mapping MapChunks(absl::Span<const Chunk> chunks, int connections, int cores);

}  // namespace plexus::aggregation
