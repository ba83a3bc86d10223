// The launcher of src/cuda/divide.cu's kernels, through base::cuda (no CUDA library linked).
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/base/cuda.hpp"
#include "plexus/config.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::kernels {

#if PLEXUS_HAVE_CUDA
namespace internal {
extern const unsigned char kDivideFatbin[];  // generated from src/cuda/divide.cu
}  // namespace internal

absl::Status DivideOnDevice(DataType dtype, void* data, size_t n, int divisor) {
  if (n == 0) return absl::OkStatus();
  const unsigned threads = 256;
  const size_t blocks = (n + threads - 1) / threads;
  if (blocks > 0x7fffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("DivideOnDevice: ", n, " elements exceed one grid"));
  }
  const std::string kernel = "plexus_divide_" + std::string(DataTypeName(dtype));
  void* args[] = {&data, &n, &divisor};
  return base::cuda::Launch({internal::kDivideFatbin, "plexus::kernels division"}, kernel.c_str(),
                            static_cast<unsigned>(blocks), threads, args);
}
#else
absl::Status DivideOnDevice(DataType, void*, size_t, int) {
  std::string why;
  base::cuda::Available(&why);
  return absl::FailedPreconditionError(absl::StrCat("DivideOnDevice: ", why));
}
#endif

}  // namespace plexus::kernels
