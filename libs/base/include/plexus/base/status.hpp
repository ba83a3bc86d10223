// Status propagation helpers shared by every Plexus library and tool: one pair of macros, one
// way of prefixing an error with the context a user needs (rank, peer, file, field).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace plexus::base {

// `status` with `context` put in front of its message ("context: message"); OK stays OK.
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok() || context.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(std::string(context), ": ", std::string(status.message())));
}

}  // namespace plexus::base

#define PLEXUS_STATUS_CONCAT_INNER_(a, b) a##b
#define PLEXUS_STATUS_CONCAT_(a, b) PLEXUS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function if not OK.
#define PLEXUS_RETURN_IF_ERROR(expr)                                    \
  do {                                                                  \
    if (::absl::Status plexus_status_ = (expr); !plexus_status_.ok()) { \
      return plexus_status_;                                            \
    }                                                                   \
  } while (false)

// `PLEXUS_ASSIGN_OR_RETURN(auto x, F());` or `PLEXUS_ASSIGN_OR_RETURN(x, F());`: evaluates the
// StatusOr once, returns its status if not OK, otherwise moves the value into `lhs`.
#define PLEXUS_ASSIGN_OR_RETURN(lhs, expr) \
  PLEXUS_ASSIGN_OR_RETURN_IMPL_(PLEXUS_STATUS_CONCAT_(plexus_status_or_, __LINE__), lhs, expr)
#define PLEXUS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(*tmp)
