// Recovery from a failed worker (recovery.hpp).
#include "recovery.hpp"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "plexus/placement/optimizer.hpp"
#include "report.hpp"

namespace plexus::serving::internal {

absl::StatusOr<placement::Plan> ReplanWithout(const placement::Problem& problem,
                                              const std::vector<bool>& failed,
                                              const Replanner& replan) {
  placement::Problem remaining = problem;
  std::vector<int> index;  // remaining's worker -> problem's
  remaining.workers.clear();
  for (size_t w = 0; w < problem.workers.size(); ++w) {
    if (failed[w]) continue;
    remaining.workers.push_back(problem.workers[w]);
    index.push_back(static_cast<int>(w));
  }
  absl::StatusOr<placement::Plan> plan =
      replan ? replan(remaining) : placement::Optimize(remaining, placement::Strategy::kJellyBean);
  if (!plan.ok()) return plan.status();
  for (auto& shares : plan->workers) {
    for (placement::WorkerShare& ws : shares) {
      if (ws.worker < 0 || static_cast<size_t>(ws.worker) >= index.size()) {
        return absl::InvalidArgumentError(absl::StrCat("the re-plan names worker ", ws.worker,
                                                       " of the ", index.size(), " left"));
      }
      ws.worker = index[ws.worker];
    }
  }
  return plan;
}

std::vector<std::pair<int, uint64_t>> OwedInputs(const Topology& t, const Collector& collector,
                                                 const std::vector<int64_t>& injected) {
  const std::vector<Collector::Sink> sinks = collector.Sinks();
  const std::vector<DropRecord> drops = collector.Drops();
  absl::flat_hash_set<std::pair<int, uint64_t>> owed;
  for (size_t op = 0; op < t.problem.operators.size(); ++op) {
    if (!t.sink[op]) continue;
    const LostParts lost = LostFor(t, static_cast<int>(op), sinks[op], drops);
    for (size_t i = 0; i < t.masks[op].size(); ++i) {
      const uint64_t mask = t.masks[op][i];
      for (size_t s = 0; s < t.sources.size(); ++s) {
        if ((mask >> s & 1) == 0) continue;
        for (int64_t id = 0; id < injected[s]; ++id) {
          const std::pair<uint64_t, uint64_t> key{mask, static_cast<uint64_t>(id)};
          const auto done = sinks[op].parts_done.find(key);
          const auto gone = lost.find(key);
          const uint64_t settled = (done == sinks[op].parts_done.end() ? 0 : done->second) +
                                   (gone == lost.end() ? 0 : gone->second.size());
          if (settled >= t.Parts(static_cast<int>(op), i, static_cast<uint64_t>(id))) continue;
          owed.insert({static_cast<int>(s), static_cast<uint64_t>(id)});
        }
      }
    }
  }
  std::vector<std::pair<int, uint64_t>> out(owed.begin(), owed.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second < b.second : a.first < b.first;
  });
  return out;
}

}  // namespace plexus::serving::internal
