// The simulator's allreduces: netmodel's schedules (schedule.cpp) placed on hosts.
#include "plexus/netmodel/flow_schedules.hpp"

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/netmodel/schedule.hpp"

namespace plexus::netmodel::sim {
namespace {

absl::Status CheckRanks(const std::string& what, std::span<const int> hosts, double bytes) {
  if (hosts.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no ranks"));
  if (!std::isfinite(bytes) || bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer bytes ", bytes, " must be >= 0"));
  }
  std::set<int> seen;
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", r, " has a negative host ", hosts[r]));
    }
    if (!seen.insert(hosts[r]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", r, " reuses host ", hosts[r], " (one rank per host)"));
    }
  }
  return absl::OkStatus();
}

int Ranks(std::span<const int> hosts) { return static_cast<int>(hosts.size()); }

}  // namespace

absl::StatusOr<Schedule> ShardedPsSchedule(std::span<const int> hosts, double bytes) {
  PLEXUS_RETURN_IF_ERROR(CheckRanks("sharded ps", hosts, bytes));
  PLEXUS_ASSIGN_OR_RETURN(Schedule s, netmodel::ShardedPsSchedule(Ranks(hosts), bytes));
  return PlaceSchedule(std::move(s), hosts);
}

absl::StatusOr<Schedule> RingSchedule(std::span<const int> hosts, double bytes, int slices) {
  PLEXUS_RETURN_IF_ERROR(CheckRanks("ring", hosts, bytes));
  PLEXUS_ASSIGN_OR_RETURN(Schedule s, RingAllreduceSchedule(Ranks(hosts), bytes, slices));
  return PlaceSchedule(std::move(s), hosts);
}

absl::StatusOr<Schedule> RingChunkedSchedule(std::span<const int> hosts, double bytes, int chunks) {
  PLEXUS_RETURN_IF_ERROR(CheckRanks("ring-chunked", hosts, bytes));
  PLEXUS_ASSIGN_OR_RETURN(Schedule s, netmodel::RingChunkedSchedule(Ranks(hosts), bytes, chunks));
  return PlaceSchedule(std::move(s), hosts);
}

absl::StatusOr<Schedule> HalvingDoublingSchedule(std::span<const int> hosts, double bytes) {
  PLEXUS_RETURN_IF_ERROR(CheckRanks("halving_doubling", hosts, bytes));
  const int p = Ranks(hosts);
  if ((p & (p - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("halving-doubling: ", p, " ranks is not a power of two"));
  }
  PLEXUS_ASSIGN_OR_RETURN(Schedule s,
                          netmodel::HalvingDoublingSchedule(p, bytes, HalvingOrder::kNearFirst));
  return PlaceSchedule(std::move(s), hosts);
}

absl::StatusOr<Schedule> TreeSchedule(std::span<const int> hosts, double bytes, int fanout) {
  PLEXUS_RETURN_IF_ERROR(CheckRanks("tree", hosts, bytes));
  PLEXUS_ASSIGN_OR_RETURN(Schedule s, FanoutTreeSchedule(Ranks(hosts), bytes, fanout));
  return PlaceSchedule(std::move(s), hosts);
}

}  // namespace plexus::netmodel::sim
