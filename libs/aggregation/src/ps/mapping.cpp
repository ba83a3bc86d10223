#include "plexus/aggregation/mapping.hpp"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus::aggregation {

absl::StatusOr<std::vector<Chunk>> SplitKey(uint64_t key, size_t elements, size_t element_bytes,
                                            size_t chunk_bytes) {
  if (elements == 0 || element_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, ": ", elements, " elements of ",
                                                   element_bytes, " bytes: both must be > 0"));
  }
  if (chunk_bytes < element_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, ": chunk_bytes ", chunk_bytes,
                                                   " is smaller than one element (", element_bytes,
                                                   " bytes)"));
  }
  const size_t per_chunk = chunk_bytes / element_bytes;
  const size_t count = (elements + per_chunk - 1) / per_chunk;
  if (count > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", key, ": ", count, " chunks; raise chunk_bytes"));
  }
  std::vector<Chunk> chunks(count);
  for (size_t i = 0; i < count; ++i) {
    Chunk& c = chunks[i];
    c.key = key;
    c.index = static_cast<uint32_t>(i);
    c.offset = i * per_chunk;
    c.elements = std::min(per_chunk, elements - c.offset);
    c.bytes = c.elements * element_bytes;
  }
  return chunks;
}

std::vector<int> LptAssign(absl::Span<const uint64_t> sizes, int bins,
                           absl::Span<const uint64_t> initial_loads) {
  std::vector<int> out(sizes.size(), 0);
  if (bins <= 0) return out;
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  // Min-heap of (load, bin): the least loaded bin, the lowest index among equals.
  using Entry = std::pair<uint64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (int b = 0; b < bins; ++b) {
    heap.push({static_cast<size_t>(b) < initial_loads.size() ? initial_loads[b] : 0, b});
  }
  for (size_t item : order) {
    auto [load, bin] = heap.top();
    heap.pop();
    out[item] = bin;
    heap.push({load + sizes[item], bin});
  }
  return out;
}

uint64_t Makespan(absl::Span<const uint64_t> sizes, absl::Span<const int> bins, int num_bins) {
  std::vector<uint64_t> load(static_cast<size_t>(std::max(num_bins, 0)), 0);
  for (size_t i = 0; i < sizes.size() && i < bins.size(); ++i) {
    if (bins[i] >= 0 && bins[i] < num_bins) load[bins[i]] += sizes[i];
  }
  return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
}

Mapping MapChunks(absl::Span<const Chunk> chunks, int connections, int cores) {
  Mapping m;
  std::vector<uint64_t> sizes(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) sizes[i] = chunks[i].bytes;
  m.chunk_connection = LptAssign(sizes, connections);
  std::vector<uint64_t> conn_load(static_cast<size_t>(std::max(connections, 0)), 0);
  for (size_t i = 0; i < chunks.size(); ++i) conn_load[m.chunk_connection[i]] += sizes[i];
  m.connection_core = LptAssign(conn_load, cores);
  m.core_bytes.assign(static_cast<size_t>(std::max(cores, 0)), 0);
  for (size_t q = 0; q < conn_load.size(); ++q) m.core_bytes[m.connection_core[q]] += conn_load[q];
  return m;
}

}  // namespace plexus::aggregation
