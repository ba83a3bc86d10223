#include "plexus/multipath/scheduler.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace plexus::multipath {
namespace {

// A weight for every path: its measured bandwidth times its rate factor. Paths not measured yet
// get the mean of the measured ones (or 1 when none is), so a new path is tried at once.
std::vector<double> Weights(absl::Span<const PathView> paths, bool penalise_inflation) {
  double sum = 0;
  int known = 0;
  for (const PathView& p : paths) {
    if (p.bandwidth > 0) {
      sum += p.bandwidth;
      ++known;
    }
  }
  const double fallback = known > 0 ? sum / known : 1.0;
  std::vector<double> w(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    const PathView& p = paths[i];
    double x = (p.bandwidth > 0 ? p.bandwidth : fallback) * std::max(p.rate_factor, 1e-3);
    if (penalise_inflation && p.srtt > absl::ZeroDuration() && p.min_rtt > absl::ZeroDuration()) {
      // Queueing beyond the base RTT means the path is congested: weight by min_rtt / srtt.
      x *= std::clamp(absl::FDivDuration(p.min_rtt, p.srtt), 0.05, 1.0);
    }
    w[i] = x;
  }
  return w;
}

class RoundRobin final : public Scheduler {
 public:
  SchedulerKind kind() const override { return SchedulerKind::kRoundRobin; }
  int Pick(absl::Span<const PathView> paths) override {
    if (paths.empty()) return -1;
    for (size_t k = 0; k < paths.size(); ++k) {
      const size_t i = (next_ + k) % paths.size();
      if (paths[i].has_slot) {
        next_ = i + 1;
        return paths[i].index;
      }
    }
    return -1;
  }

 private:
  size_t next_ = 0;
};

// Smooth weighted round robin (nginx): every candidate gains its weight, the richest is picked
// and pays the sum. Over any window the picks follow the weights, interleaved, not in bursts.
class SmoothWeighted final : public Scheduler {
 public:
  explicit SmoothWeighted(bool congestion) : congestion_(congestion) {}
  SchedulerKind kind() const override {
    return congestion_ ? SchedulerKind::kCongestion : SchedulerKind::kWeighted;
  }
  int Pick(absl::Span<const PathView> paths) override {
    const std::vector<double> w = Weights(paths, congestion_);
    int best = -1;
    double total = 0;
    for (size_t i = 0; i < paths.size(); ++i) {
      const int index = paths[i].index;
      if (index >= static_cast<int>(current_.size())) current_.resize(index + 1, 0);
      if (!paths[i].has_slot) continue;
      current_[index] += w[i];
      total += w[i];
      if (best < 0 || current_[index] > current_[paths[best].index]) best = static_cast<int>(i);
    }
    if (best < 0) return -1;
    current_[paths[best].index] -= total;
    return paths[best].index;
  }

 private:
  bool congestion_;
  std::vector<double> current_;
};

class MinRtt final : public Scheduler {
 public:
  SchedulerKind kind() const override { return SchedulerKind::kMinRtt; }
  int Pick(absl::Span<const PathView> paths) override { return MinRttPath(paths); }
};

// Power of two choices (Aurelia's adaptive routing): two distinct random candidates, the one with
// less queued work wins. The loads may be stale; sampling two keeps stale values from herding
// every chunk onto one path.
class PowerOfTwo final : public Scheduler {
 public:
  explicit PowerOfTwo(uint64_t seed) : gen_(std::seed_seq{seed}) {}
  SchedulerKind kind() const override { return SchedulerKind::kPowerOfTwo; }
  int Pick(absl::Span<const PathView> paths) override {
    std::vector<size_t> open;
    for (size_t i = 0; i < paths.size(); ++i) {
      if (paths[i].has_slot) open.push_back(i);
    }
    if (open.empty()) return -1;
    if (open.size() == 1) return paths[open[0]].index;
    const size_t a = absl::Uniform<size_t>(gen_, 0, open.size());
    size_t b = absl::Uniform<size_t>(gen_, 0, open.size() - 1);
    if (b >= a) ++b;
    const PathView& x = paths[open[a]];
    const PathView& y = paths[open[b]];
    if (x.load != y.load) return x.load < y.load ? x.index : y.index;
    return absl::Bernoulli(gen_, 0.5) ? x.index : y.index;
  }

 private:
  absl::BitGen gen_;
};

}  // namespace

std::string_view SchedulerName(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kRoundRobin:
      return "round_robin";
    case SchedulerKind::kWeighted:
      return "weighted";
    case SchedulerKind::kMinRtt:
      return "min_rtt";
    case SchedulerKind::kCongestion:
      return "congestion";
    case SchedulerKind::kPowerOfTwo:
      return "power_of_two";
  }
  return "unknown";
}

absl::StatusOr<SchedulerKind> ParseScheduler(std::string_view name) {
  for (SchedulerKind k :
       {SchedulerKind::kRoundRobin, SchedulerKind::kWeighted, SchedulerKind::kMinRtt,
        SchedulerKind::kCongestion, SchedulerKind::kPowerOfTwo}) {
    if (SchedulerName(k) == name) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown multipath scheduler '", std::string(name),
                   "'; expected round_robin, weighted, min_rtt, congestion or power_of_two"));
}

std::unique_ptr<Scheduler> MakeScheduler(SchedulerKind kind, uint64_t seed) {
  switch (kind) {
    case SchedulerKind::kRoundRobin:
      return std::make_unique<RoundRobin>();
    case SchedulerKind::kWeighted:
      return std::make_unique<SmoothWeighted>(false);
    case SchedulerKind::kMinRtt:
      return std::make_unique<MinRtt>();
    case SchedulerKind::kCongestion:
      return std::make_unique<SmoothWeighted>(true);
    case SchedulerKind::kPowerOfTwo:
      return std::make_unique<PowerOfTwo>(seed);
  }
  return std::make_unique<RoundRobin>();
}

int MinRttPath(absl::Span<const PathView> paths) {
  int best = -1;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!paths[i].has_slot) continue;
    if (best < 0) {
      best = static_cast<int>(i);
      continue;
    }
    const absl::Duration a = paths[i].srtt, b = paths[best].srtt;
    const bool a_known = a > absl::ZeroDuration(), b_known = b > absl::ZeroDuration();
    if ((a_known && !b_known) || (a_known && b_known && a < b)) best = static_cast<int>(i);
  }
  return best < 0 ? -1 : paths[best].index;
}

}  // namespace plexus::multipath
