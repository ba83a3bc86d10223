// In-process aggregation engines over gradients already in memory, to compare PHub's tall
// aggregation (what the Service does on each core) with the wide aggregation of a conventional
// PS. Both sum `workers` gradients per key and run the optimizer, writing the new values to a
// send buffer; they differ only in who touches what, and when.
#pragma once

#include <barrier>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "buffers.hpp"
#include "plexus/aggregation/mapping.hpp"
#include "plexus/aggregation/optimizer.hpp"

namespace plexus::aggregation::internal {

enum class EngineKind {
  // Chunks owned by cores (LPT); a core sums one chunk over every worker, then optimizes it at
  // once while it is still in cache. No synchronization between cores.
  kTall,
  // Key by key (MXNet style): every core takes a slice of the key for each worker's gradient in
  // turn, in lock step (a barrier per worker), then the optimizer runs over the key, also wide.
  kWide,
};

struct EngineOptions {
  EngineKind kind = EngineKind::kTall;
  int cores = 1;
  int workers = 1;
  size_t chunk_bytes = kDefaultChunkBytes;
  UpdateRule optimizer;
};

class Engine {
 public:
  // `key_elements`: f32 elements of each key; keys lie back to back in a model-sized array.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        std::vector<size_t> key_elements);
  // One round: grads[w] is worker w's whole gradient (model_elements floats). Keys are taken
  // last to first, the order backpropagation produces them.
  void RunRound(absl::Span<const float* const> grads);
  size_t model_elements() const { return total_; }
  const float* weights() const { return reinterpret_cast<const float*>(w_.get()); }
  const float* values() const { return reinterpret_cast<const float*>(out_.get()); }

 private:
  Engine(EngineOptions options, std::vector<size_t> key_elements);
  void TallCore(int core, absl::Span<const float* const> grads);
  void WideCore(int core, absl::Span<const float* const> grads, std::barrier<>& sync);
  void Optimize(size_t offset, size_t n);

  EngineOptions options_;
  std::vector<size_t> key_elements_, key_offset_;
  size_t total_ = 0;
  std::vector<std::vector<Chunk>> core_chunks_;  // tall: each core's chunks, in arrival order
  AlignedBytes w_, g_, m_, v_, out_;
  uint64_t step_ = 0;
};

}  // namespace plexus::aggregation::internal
