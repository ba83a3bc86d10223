#include "plexus/collectives/types.hpp"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/names.hpp"

namespace plexus::collectives {
namespace {
constexpr std::string_view kCollectiveNames[kNumCollectiveKinds] = {
    "allreduce", "reduce",    "broadcast", "allgather", "reducescatter",
    "alltoall",  "alltoallv", "sendrecv",  "barrier"};
}  // namespace

std::string_view AlgorithmName(Algorithm algorithm) {
  return base::NameAt(static_cast<size_t>(algorithm), kAlgorithmNames);
}
absl::StatusOr<Algorithm> ParseAlgorithm(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (lower == "hd" || lower == "rhd" || lower == "halving-doubling") {
    return Algorithm::kHalvingDoubling;
  }
  if (lower == "rd" || lower == "recursive-doubling") return Algorithm::kRecursiveDoubling;
  return base::ParseName<Algorithm>(name, kAlgorithmNames, "algorithm");
}

std::string_view CollectiveName(CollectiveKind kind) {
  return base::NameAt(static_cast<size_t>(kind), kCollectiveNames);
}
absl::StatusOr<CollectiveKind> ParseCollective(std::string_view name) {
  return base::ParseName<CollectiveKind>(name, kCollectiveNames, "collective");
}

}  // namespace plexus::collectives
