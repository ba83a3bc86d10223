// The tile kernels compiled with AVX2 and F16C (CMakeLists.txt); tile.cpp calls them when the
// CPU has both.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "plexus/kernels/reduce.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "tile.hpp"

namespace plexus::restructure::internal::avx2 {
#include "tile_impl.inc"
}  // namespace plexus::restructure::internal::avx2
