#include "plexus/collectives/types.hpp"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace plexus::collectives {
namespace {

constexpr std::string_view kDataTypeNames[kNumDataTypes] = {"f32", "f64", "f16", "bf16",
                                                            "i32", "i64", "u8"};
constexpr size_t kDataTypeSizes[kNumDataTypes] = {4, 8, 2, 2, 4, 8, 1};
constexpr std::string_view kReduceOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg"};
constexpr std::string_view kCollectiveNames[kNumCollectiveKinds] = {
    "allreduce", "reduce",    "broadcast", "allgather", "reducescatter",
    "alltoall",  "alltoallv", "sendrecv",  "barrier"};

template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseName(std::string_view name, const std::string_view (&names)[N],
                               std::string_view what) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  for (size_t i = 0; i < N; ++i) {
    if (lower == names[i]) return static_cast<Enum>(i);
  }
  std::string valid;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppend(&valid, i ? ", " : "", std::string(names[i]));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ", std::string(what), " '",
                                                 std::string(name), "' (valid: ", valid, ")"));
}

template <size_t N>
std::string_view NameOf(size_t index, const std::string_view (&names)[N]) {
  return index < N ? names[index] : std::string_view("invalid");
}

}  // namespace

size_t DataTypeSize(DataType dtype) {
  const size_t i = static_cast<size_t>(dtype);
  return i < kNumDataTypes ? kDataTypeSizes[i] : 0;
}
std::string_view DataTypeName(DataType dtype) {
  return NameOf(static_cast<size_t>(dtype), kDataTypeNames);
}
absl::StatusOr<DataType> ParseDataType(std::string_view name) {
  return ParseName<DataType>(name, kDataTypeNames, "data type");
}

std::string_view ReduceOpName(ReduceOp op) {
  return NameOf(static_cast<size_t>(op), kReduceOpNames);
}
absl::StatusOr<ReduceOp> ParseReduceOp(std::string_view name) {
  return ParseName<ReduceOp>(name, kReduceOpNames, "reduction");
}

std::string_view AlgorithmName(Algorithm algorithm) {
  return NameOf(static_cast<size_t>(algorithm), kAlgorithmNames);
}
absl::StatusOr<Algorithm> ParseAlgorithm(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (lower == "hd" || lower == "rhd" || lower == "halving-doubling") {
    return Algorithm::kHalvingDoubling;
  }
  if (lower == "rd" || lower == "recursive-doubling") return Algorithm::kRecursiveDoubling;
  return ParseName<Algorithm>(name, kAlgorithmNames, "algorithm");
}

std::string_view CollectiveName(CollectiveKind kind) {
  return NameOf(static_cast<size_t>(kind), kCollectiveNames);
}
absl::StatusOr<CollectiveKind> ParseCollective(std::string_view name) {
  return ParseName<CollectiveKind>(name, kCollectiveNames, "collective");
}

}  // namespace plexus::collectives
