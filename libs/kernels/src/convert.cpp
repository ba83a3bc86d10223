// The scalar f16 and bf16 conversions (round to nearest even), apart from the reduction kernels
// so that code needing only the conversions (a fuzz target) builds without the CPU dispatch. The
// code itself is convert_bits.hpp's, shared with device kernels.
#include "plexus/kernels/convert_bits.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::kernels {

float HalfToFloat(uint16_t h) { return bits::HalfToFloat(h); }
uint16_t FloatToHalf(float f) { return bits::FloatToHalf(f); }
float Bf16ToFloat(uint16_t h) { return bits::Bf16ToFloat(h); }
uint16_t FloatToBf16(float f) { return bits::FloatToBf16(f); }

}  // namespace plexus::kernels
