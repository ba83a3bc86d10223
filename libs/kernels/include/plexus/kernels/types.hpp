// Element types and reduction operators: the vocabulary of the kernels, shared by every library
// that reduces or converts buffers (collectives, aggregation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace plexus::kernels {

// Element type of a buffer. kF16 and kBF16 are reduced in f32 and rounded back (to nearest even)
// after each pairwise step.
enum class DataType : uint8_t {
  kF32 = 0,
  kF64 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU8 = 6,
  kI8 = 7
};
inline constexpr int kNumDataTypes = 8;
// Bytes of one element.
size_t DataTypeSize(DataType dtype);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "i8".
std::string_view DataTypeName(DataType dtype);
absl::StatusOr<DataType> ParseDataType(std::string_view name);

// Element-wise reduction. kAvg sums and then divides by the number of ranks (integer division for
// integer types).
enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4 };
inline constexpr int kNumReduceOps = 5;
// "sum", "prod", "min", "max", "avg".
std::string_view ReduceOpName(ReduceOp op);
absl::StatusOr<ReduceOp> ParseReduceOp(std::string_view name);

}  // namespace plexus::kernels
