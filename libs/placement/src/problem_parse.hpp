// Section parsers of the placement input (docs/placement.md), one per top-level section. Each
// fills its part of `p` and returns InvalidArgument naming the JSON path of the first bad field.
// Order matters: the workflow, then the infrastructure, the profiles (which refer to both), the
// objective and the options; ComputeRates last.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "plexus/base/json_reader.hpp"
#include "plexus/placement/problem.hpp"

namespace plexus::placement::internal {

absl::Status ParseWorkflow(const base::json::Json& workflow, Problem& p);
absl::Status ParseInfrastructure(const base::json::Json& infra, Problem& p);
absl::Status ParseAccuracyProfiles(const base::json::Json& root, Problem& p);
absl::Status ParseExecutionProfiles(const base::json::Json& root, Problem& p);
absl::Status ParseObjective(const base::json::Json& root, Problem& p);
absl::Status ParseOptions(const base::json::Json& root, Problem& p);
// Fills p.rate from the sources' rates along the edges; needs ParseWorkflow and ParseOptions.
absl::Status ComputeRates(Problem& p);

// Error texts that list the valid names, and the worker-type lookup the sections share.
std::string UnknownOperator(const std::string& name, const Problem& p);
std::string UnknownTier(const std::string& name, const Problem& p);
int FindType(const std::string& name, const Problem& p);

}  // namespace plexus::placement::internal
