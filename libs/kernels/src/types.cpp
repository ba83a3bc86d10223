#include "plexus/kernels/types.hpp"

#include "plexus/base/names.hpp"

namespace plexus::kernels {
namespace {
constexpr std::string_view kDataTypeNames[kNumDataTypes] = {"f32", "f64", "f16", "bf16",
                                                            "i32", "i64", "u8",  "i8"};
constexpr size_t kDataTypeSizes[kNumDataTypes] = {4, 8, 2, 2, 4, 8, 1, 1};
constexpr std::string_view kReduceOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg"};
}  // namespace

size_t DataTypeSize(DataType dtype) {
  const size_t i = static_cast<size_t>(dtype);
  return i < kNumDataTypes ? kDataTypeSizes[i] : 0;
}
std::string_view DataTypeName(DataType dtype) {
  return base::NameAt(static_cast<size_t>(dtype), kDataTypeNames);
}
absl::StatusOr<DataType> ParseDataType(std::string_view name) {
  return base::ParseName<DataType>(name, kDataTypeNames, "data type");
}
std::string_view ReduceOpName(ReduceOp op) {
  return base::NameAt(static_cast<size_t>(op), kReduceOpNames);
}
absl::StatusOr<ReduceOp> ParseReduceOp(std::string_view name) {
  return base::ParseName<ReduceOp>(name, kReduceOpNames, "reduction");
}

}  // namespace plexus::kernels
