#include "plexus/multipath/scheduler.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  std::string name() const override { return "round_robin"; }
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
  std::string name() const override { return congestion_ ? "congestion" : "weighted"; }
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
  std::string name() const override { return "min_rtt"; }
  int Pick(absl::Span<const PathView> paths) override { return MinRttPath(paths); }
};

// Power of two choices (Aurelia's adaptive routing): two distinct random candidates, the one with
// less queued work wins. The loads may be stale; sampling two keeps stale values from herding
// every chunk onto one path.
class PowerOfTwo final : public Scheduler {
 public:
  explicit PowerOfTwo(uint64_t seed) : gen_(std::seed_seq{seed}) {}
  std::string name() const override { return "power_of_two"; }
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

const std::vector<std::string_view>& BuiltinSchedulers() {
  static const std::vector<std::string_view>* const kNames = new std::vector<std::string_view>{
      "round_robin", "weighted", "min_rtt", "congestion", "power_of_two"};
  return *kNames;
}

absl::StatusOr<std::unique_ptr<Scheduler>> MakeScheduler(std::string_view name, uint64_t seed) {
  if (name == "round_robin") return std::make_unique<RoundRobin>();
  if (name == "weighted") return std::make_unique<SmoothWeighted>(false);
  if (name == "min_rtt") return std::make_unique<MinRtt>();
  if (name == "congestion") return std::make_unique<SmoothWeighted>(true);
  if (name == "power_of_two") return std::make_unique<PowerOfTwo>(seed);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown multipath scheduler '", std::string(name), "'; expected one of ",
                   absl::StrJoin(BuiltinSchedulers(), ", ",
                                 [](std::string* out, std::string_view n) { out->append(n); }),
                   " (or an application's own: ChannelOptions::make_scheduler)"));
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
