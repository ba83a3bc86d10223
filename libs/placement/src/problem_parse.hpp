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

// The strict JSON field readers every section parser uses.
using base::json::ArrayField;
using base::json::BoolField;
using base::json::CheckKeys;
using base::json::Child;
using base::json::Index;
using base::json::IntegerField;
using base::json::Invalid;
using base::json::Json;
using base::json::NumberField;
using base::json::ObjectField;
using base::json::StringField;

absl::Status ParseWorkflow(const Json& workflow, Problem& p);
absl::Status ParseInfrastructure(const Json& infra, Problem& p);
absl::Status ParseAccuracyProfiles(const Json& root, Problem& p);
absl::Status ParseExecutionProfiles(const Json& root, Problem& p);
absl::Status ParseObjective(const Json& root, Problem& p);
absl::Status ParseOptions(const Json& root, Problem& p);
// Fills p.rate from the sources' rates along the edges; needs ParseWorkflow and ParseOptions.
absl::Status ComputeRates(Problem& p);

// Error texts that list the valid names, and the worker-type lookup the sections share.
std::string UnknownOperator(const std::string& name, const Problem& p);
std::string UnknownTier(const std::string& name, const Problem& p);
int FindType(const std::string& name, const Problem& p);

}  // namespace plexus::placement::internal
