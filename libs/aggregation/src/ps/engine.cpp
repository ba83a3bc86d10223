#include "engine.hpp"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels.hpp"
#include "plexus/base/status.hpp"

namespace plexus::aggregation::internal {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       std::vector<size_t> key_elements) {
  if (options.cores < 1 || options.workers < 1 || key_elements.empty()) {
    return absl::InvalidArgumentError("engine: cores, workers and keys must be >= 1");
  }
  PLEXUS_RETURN_IF_ERROR(ValidateOptimizer(options.optimizer));
  for (size_t k = 0; k < key_elements.size(); ++k) {
    if (key_elements[k] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("engine: key ", k, " has no elements"));
    }
  }
  auto e = std::unique_ptr<Engine>(new Engine(options, std::move(key_elements)));
  // Tall: chunks to cores by LPT (one connection per core), kept in backprop arrival order.
  std::vector<Chunk> chunks;
  for (size_t k = e->key_elements_.size(); k-- > 0;) {
    PLEXUS_ASSIGN_OR_RETURN(auto c, SplitKey(k, e->key_elements_[k], 4, options.chunk_bytes));
    for (auto& ch : c) ch.offset += e->key_offset_[k];  // model-global offsets
    chunks.insert(chunks.end(), c.begin(), c.end());
  }
  const Mapping m = MapChunks(chunks, options.cores, options.cores);
  e->core_chunks_.resize(options.cores);
  for (size_t i = 0; i < chunks.size(); ++i) {
    e->core_chunks_[m.connection_core[m.chunk_connection[i]]].push_back(chunks[i]);
  }
  return e;
}

Engine::Engine(EngineOptions options, std::vector<size_t> key_elements)
    : options_(std::move(options)), key_elements_(std::move(key_elements)) {
  for (size_t n : key_elements_) {
    key_offset_.push_back(total_);
    total_ += n;
  }
  const size_t bytes = total_ * sizeof(float);
  w_ = AllocAligned(bytes);
  g_ = AllocAligned(bytes);
  out_ = AllocAligned(bytes);
  const int slots = OptimizerStateSlots(options_.optimizer.kind);
  if (slots >= 1) m_ = AllocAligned(bytes);
  if (slots >= 2) v_ = AllocAligned(bytes);
}

void Engine::Optimize(size_t offset, size_t n) {
  auto f = [&](const AlignedBytes& b) {
    return b ? reinterpret_cast<float*>(b.get()) + offset : nullptr;
  };
  ApplyOptimizer(options_.optimizer.kind, PrepareStep(options_.optimizer, step_), f(w_), f(g_),
                 f(m_), f(v_), f(out_), DataType::kF32, n, false);
}

void Engine::TallCore(int core, absl::Span<const float* const> grads) {
  float* g = reinterpret_cast<float*>(g_.get());
  for (const Chunk& c : core_chunks_[core]) {
    for (size_t w = 0; w < grads.size(); ++w) {
      Accumulate(g + c.offset, grads[w] + c.offset, DataType::kF32, c.elements, w == 0);
    }
    Optimize(c.offset, c.elements);  // the last contribution is in: optimize while it is hot
  }
}

void Engine::WideCore(int core, absl::Span<const float* const> grads, std::barrier<>& sync) {
  float* g = reinterpret_cast<float*>(g_.get());
  const size_t cores = static_cast<size_t>(options_.cores);
  for (size_t k = key_elements_.size(); k-- > 0;) {
    const size_t n = key_elements_[k];
    const size_t begin = key_offset_[k] + n * core / cores;
    const size_t end = key_offset_[k] + n * (core + 1) / cores;
    for (size_t w = 0; w < grads.size(); ++w) {
      if (end > begin) Accumulate(g + begin, grads[w] + begin, DataType::kF32, end - begin, w == 0);
      sync.arrive_and_wait();  // the key's aggregation proceeds worker by worker, in lock step
    }
    if (end > begin) Optimize(begin, end - begin);
    sync.arrive_and_wait();  // the optimizer finishes the key before the next one starts
  }
}

void Engine::RunRound(absl::Span<const float* const> grads) {
  ++step_;
  std::barrier<> sync(options_.cores);
  std::vector<std::thread> threads;
  for (int c = 1; c < options_.cores; ++c) {
    threads.emplace_back([&, c] {
      if (options_.kind == EngineKind::kTall) {
        TallCore(c, grads);
      } else {
        WideCore(c, grads, sync);
      }
    });
  }
  if (options_.kind == EngineKind::kTall) {
    TallCore(0, grads);
  } else {
    WideCore(0, grads, sync);
  }
  for (auto& t : threads) t.join();
}

}  // namespace plexus::aggregation::internal
