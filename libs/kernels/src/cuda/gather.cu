// Device kernels (nvcc, embedded as a fatbin; launched by src/device_kernels.cpp through the
// driver): every input block copied into its place in every output, reading each input once,
// where one copy per output would read it once per output. extern "C" names: plexus_gather_<w>,
// w = 16, 8, 4, 2 or 1 bytes per word (every pointer and the block aligned to w).
#include <cstddef>
#include <cstdint>

#include "pointers.cuh"

namespace {

// Grid: gridDim.x / k thread blocks per input, striding over its words. The loops over the pointer
// arrays run to their compile-time bound so that every pointer is read from the parameters at a
// constant index (see reduce.cu). An input that already lies at its place in an output (an in-place
// gather) is not written onto itself.
template <typename W>
__device__ void Gather(const Outputs& outs, int m, const Inputs& inputs, int k, size_t words) {
  const unsigned per_input = gridDim.x / static_cast<unsigned>(k);
  const int j = static_cast<int>(blockIdx.x / per_input);
  const W* src = nullptr;
#pragma unroll
  for (int q = 0; q < kMaxInputs; ++q) {
    if (q == j) src = static_cast<const W*>(inputs.in[q]);
  }
  const size_t at = static_cast<size_t>(j) * words;
  const size_t stride = static_cast<size_t>(per_input) * blockDim.x;
  for (size_t i = (blockIdx.x % per_input) * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < words; i += stride) {
    const W w = src[i];
#pragma unroll
    for (int o = 0; o < kMaxInputs; ++o) {
      if (o < m) {
        W* dst = static_cast<W*>(outs.out[o]) + at;
        if (dst != src) dst[i] = w;
      }
    }
  }
}

}  // namespace

#define PLEXUS_GATHER_KERNEL(bytes, W)                                                        \
  extern "C" __global__ void plexus_gather_##bytes(Outputs outs, int m, Inputs inputs, int k, \
                                                   size_t words) {                            \
    Gather<W>(outs, m, inputs, k, words);                                                     \
  }

PLEXUS_GATHER_KERNEL(16, uint4)
PLEXUS_GATHER_KERNEL(8, uint64_t)
PLEXUS_GATHER_KERNEL(4, uint32_t)
PLEXUS_GATHER_KERNEL(2, uint16_t)
PLEXUS_GATHER_KERNEL(1, uint8_t)
