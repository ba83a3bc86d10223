#include "plexus/aggregation/plink.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::aggregation {
namespace {

double Dist2(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t d = 0; d < a.size(); ++d) s += (a[d] - b[d]) * (a[d] - b[d]);
  return s;
}

absl::Status CheckSquare(const Matrix& m, const std::string& what, bool zero_diagonal) {
  const size_t n = m.size();
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": empty matrix"));
  for (size_t i = 0; i < n; ++i) {
    if (m[i].size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": row ", i, " has ", m[i].size(), " entries, expected ", n));
    }
    for (size_t j = 0; j < n; ++j) {
      if (!std::isfinite(m[i][j]) || m[i][j] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": entry [", i, "][", j, "] = ", m[i][j], " (must be >= 0)"));
      }
      if (zero_diagonal && i == j && m[i][j] != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": diagonal entry [", i, "][", i, "] is not 0"));
      }
    }
  }
  return absl::OkStatus();
}

// Blame of every node (Finetune).
std::vector<double> Blame(const Plan& plan, const Matrix& rtt, const Matrix& bandwidth,
                          double element_bytes, const FinetuneOptions& o) {
  const int n = plan.nodes;
  const Matrix traffic = PlanTraffic(plan, element_bytes);
  std::vector<double> t(n, 0), l(n, 0);
  for (int i = 0; i < n; ++i) {
    double bw = 0, worst_rtt = 0;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      l[i] += traffic[i][j];
      bw += bandwidth[i][j];
      worst_rtt = std::max(worst_rtt, rtt[i][j]);
    }
    t[i] = worst_rtt + (bw > 0 ? l[i] / bw : 0);
  }
  const double mean_t = std::accumulate(t.begin(), t.end(), 0.0) / n;
  const auto [lo, hi] = std::minmax_element(l.begin(), l.end());
  std::vector<double> blame(n);
  for (int i = 0; i < n; ++i) {
    const double l_hat = *hi > *lo ? (l[i] - *lo) / (*hi - *lo) : 0;
    const double t_hat = mean_t > 0 ? t[i] / mean_t : 1;
    blame[i] = o.beta * l_hat + o.gamma * t_hat;
  }
  return blame;
}

absl::Status CheckMeasurements(const Plan& plan, const Matrix& rtt, const Matrix& bandwidth) {
  PLEXUS_RETURN_IF_ERROR(CheckSquare(rtt, "finetune rtt", false));
  PLEXUS_RETURN_IF_ERROR(CheckSquare(bandwidth, "finetune bandwidth", false));
  if (static_cast<int>(rtt.size()) != plan.nodes ||
      static_cast<int>(bandwidth.size()) != plan.nodes) {
    return absl::InvalidArgumentError(absl::StrCat("finetune: measurements for ", rtt.size(), " / ",
                                                   bandwidth.size(), " nodes, plan has ",
                                                   plan.nodes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDistances(const Matrix& distance) {
  return CheckSquare(distance, "distances", true);
}

absl::StatusOr<Embedding> Embed(const Matrix& distance, const EmbedOptions& o) {
  PLEXUS_RETURN_IF_ERROR(CheckDistances(distance));
  if (o.dims < 1 || o.dims > 16 || !(o.alpha >= 1 && o.alpha <= 2) || o.iterations < 1 ||
      !(o.learning_rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("embed: dims (", o.dims, ") in 1..16, alpha (",
                                                   o.alpha, ") in [1, 2], iterations (",
                                                   o.iterations, ") >= 1, learning_rate > 0"));
  }
  const int n = static_cast<int>(distance.size());
  double scale = 0;
  for (const auto& row : distance)
    scale = std::max(scale, *std::max_element(row.begin(), row.end()));
  if (scale == 0) scale = 1;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> normal(0, 0.1);
  Embedding e;
  e.coords.assign(n, std::vector<double>(o.dims));
  for (auto& v : e.coords) {
    for (double& x : v) x = normal(rng);
  }
  e.offset.assign(n, 0);
  const int params = n * o.dims + (o.node_offset ? n : 0);
  std::vector<double> m(params, 0), v(params, 0), g(params, 0);
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (int it = 1; it <= o.iterations; ++it) {
    std::fill(g.begin(), g.end(), 0);
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < i; ++j) {
        const double d2 = Dist2(e.coords[i], e.coords[j]);
        const double d = std::sqrt(d2);
        const double da = o.alpha == 2 ? d2 : std::pow(d + 1e-12, o.alpha);
        const double err = da + e.offset[i] + e.offset[j] - distance[i][j] / scale;
        loss += err * err;
        // d(d^alpha)/d(v_i) = alpha d^(alpha-2) (v_i - v_j).
        const double k =
            2 * err * o.alpha * (o.alpha == 2 ? 1.0 : std::pow(d + 1e-12, o.alpha - 2));
        for (int x = 0; x < o.dims; ++x) {
          const double diff = e.coords[i][x] - e.coords[j][x];
          g[i * o.dims + x] += k * diff;
          g[j * o.dims + x] -= k * diff;
        }
        if (o.node_offset) {
          g[n * o.dims + i] += 2 * err;
          g[n * o.dims + j] += 2 * err;
        }
      }
    }
    e.loss = loss;
    const double c1 = 1 - std::pow(b1, it), c2 = 1 - std::pow(b2, it);
    for (int p = 0; p < params; ++p) {
      m[p] = b1 * m[p] + (1 - b1) * g[p];
      v[p] = b2 * v[p] + (1 - b2) * g[p] * g[p];
      const double step = o.learning_rate * (m[p] / c1) / (std::sqrt(v[p] / c2) + eps);
      if (p < n * o.dims) {
        e.coords[p / o.dims][p % o.dims] -= step;
      } else {
        double& h = e.offset[p - n * o.dims];
        h = std::max(0.0, h - step);  // h_i >= 0
      }
    }
  }
  return e;
}

absl::StatusOr<std::vector<std::vector<int>>> ConstrainedKMeans(const Matrix& points,
                                                                const ClusterOptions& o) {
  const int n = static_cast<int>(points.size());
  if (n == 0) return absl::InvalidArgumentError("k-means: no points");
  const size_t dims = points[0].size();
  for (int i = 0; i < n; ++i) {
    if (points[i].size() != dims || dims == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "k-means: point ", i, " has ", points[i].size(), " coordinates, point 0 ", dims));
    }
    for (double x : points[i]) {
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat("k-means: point ", i, " is not finite"));
      }
    }
  }
  const int k = o.groups > 0 ? o.groups : std::max(1, static_cast<int>(std::lround(std::sqrt(n))));
  if (k > n) {
    return absl::InvalidArgumentError(absl::StrCat("k-means: ", k, " groups for ", n, " points"));
  }
  if (!(o.elasticity >= 1 && o.elasticity <= 2) || o.restarts < 1 || o.iterations < 1) {
    return absl::InvalidArgumentError(absl::StrCat("k-means: elasticity (", o.elasticity,
                                                   ") in [1, 2], restarts and iterations >= 1"));
  }
  const int min_size = std::max(1, static_cast<int>(std::floor(double(n) / k / o.elasticity)));
  std::mt19937_64 rng(o.seed);
  std::vector<int> best;
  int best_spread = std::numeric_limits<int>::max();
  double best_inertia = std::numeric_limits<double>::infinity();
  for (int restart = 0; restart < o.restarts; ++restart) {
    // k-means++ seeding.
    Matrix centre;
    centre.push_back(points[std::uniform_int_distribution<int>(0, n - 1)(rng)]);
    std::vector<double> d2(n);
    while (static_cast<int>(centre.size()) < k) {
      double total = 0;
      for (int i = 0; i < n; ++i) {
        d2[i] = std::numeric_limits<double>::infinity();
        for (const auto& c : centre) d2[i] = std::min(d2[i], Dist2(points[i], c));
        total += d2[i];
      }
      int pick = 0;
      if (total > 0) {
        double u = std::uniform_real_distribution<double>(0, total)(rng);
        for (pick = 0; pick < n - 1; ++pick) {
          u -= d2[pick];
          if (u <= 0) break;
        }
      } else {
        pick = static_cast<int>(centre.size());  // every point on a centre: any distinct one
      }
      centre.push_back(points[pick]);
    }
    std::vector<int> assign(n, -1);
    for (int iter = 0; iter < o.iterations; ++iter) {
      std::vector<int> next(n);
      std::vector<int> size(k, 0);
      for (int i = 0; i < n; ++i) {
        int c_best = 0;
        for (int c = 1; c < k; ++c) {
          if (Dist2(points[i], centre[c]) < Dist2(points[i], centre[c_best])) c_best = c;
        }
        next[i] = c_best;
        ++size[c_best];
      }
      // Repair: fill clusters below the minimum with the cheapest points of clusters above it.
      for (int c = 0; c < k; ++c) {
        while (size[c] < min_size) {
          int pick = -1;
          double cost = std::numeric_limits<double>::infinity();
          for (int i = 0; i < n; ++i) {
            if (next[i] == c || size[next[i]] <= min_size) continue;
            const double extra = Dist2(points[i], centre[c]) - Dist2(points[i], centre[next[i]]);
            if (extra < cost) {
              cost = extra;
              pick = i;
            }
          }
          if (pick < 0) break;  // cannot happen: k * min_size <= n
          --size[next[pick]];
          next[pick] = c;
          ++size[c];
        }
      }
      const bool stable = next == assign;
      assign = std::move(next);
      for (int c = 0; c < k; ++c) {
        std::vector<double> mean(dims, 0);
        for (int i = 0; i < n; ++i) {
          if (assign[i] != c) continue;
          for (size_t x = 0; x < dims; ++x) mean[x] += points[i][x] / size[c];
        }
        if (size[c] > 0) centre[c] = mean;
      }
      if (stable) break;
    }
    std::vector<int> size(k, 0);
    double inertia = 0;
    for (int i = 0; i < n; ++i) {
      ++size[assign[i]];
      inertia += Dist2(points[i], centre[assign[i]]);
    }
    const int spread =
        *std::max_element(size.begin(), size.end()) - *std::min_element(size.begin(), size.end());
    // The most even sizes win (the seed); ties go to the tighter clustering (the seed picks at
    // random; this keeps runs reproducible).
    if (spread < best_spread || (spread == best_spread && inertia < best_inertia - 1e-12)) {
      best_spread = spread;
      best_inertia = inertia;
      best = assign;
    }
  }
  std::map<int, std::vector<int>> by_cluster;
  for (int i = 0; i < n; ++i) by_cluster[best[i]].push_back(i);
  std::vector<std::vector<int>> groups;
  for (auto& [c, members] : by_cluster) groups.push_back(std::move(members));
  std::sort(groups.begin(), groups.end());
  return groups;
}

absl::StatusOr<std::vector<std::vector<int>>> GroupByDistance(const Matrix& distance,
                                                              const EmbedOptions& embed,
                                                              const ClusterOptions& cluster) {
  PLEXUS_ASSIGN_OR_RETURN(Embedding e, Embed(distance, embed));
  return ConstrainedKMeans(e.coords, cluster);
}

Matrix PlanTraffic(const Plan& plan, double element_bytes) {
  Matrix d(plan.nodes, std::vector<double>(plan.nodes, 0));
  for (const Step& s : plan.steps) {
    if (s.kind != StepKind::kSend && s.kind != StepKind::kBroadcast) continue;
    const double bytes = plan.chunks[s.chunk].elements * element_bytes;
    for (int p : s.peers) {
      d[s.node][p] += bytes;
      d[p][s.node] += bytes;
    }
  }
  return d;
}

absl::StatusOr<std::vector<double>> QuicktuneWeights(const Matrix& bandwidth) {
  PLEXUS_RETURN_IF_ERROR(CheckSquare(bandwidth, "quicktune bandwidth", false));
  std::vector<double> w(bandwidth.size(), 0);
  for (size_t i = 0; i < bandwidth.size(); ++i) {
    for (size_t j = 0; j < bandwidth.size(); ++j) {
      if (i != j) w[i] += bandwidth[i][j];
    }
    if (!(w[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("quicktune: node ", i, " has no bandwidth to any other node"));
    }
  }
  return w;
}

absl::StatusOr<std::optional<Plan>> FinetuneStep(const Plan& plan, const Matrix& rtt,
                                                 const Matrix& bandwidth, double element_bytes,
                                                 int moves, const FinetuneOptions& o) {
  PLEXUS_RETURN_IF_ERROR(CheckMeasurements(plan, rtt, bandwidth));
  const std::vector<double> blame = Blame(plan, rtt, bandwidth, element_bytes, o);
  const int hi = static_cast<int>(std::max_element(blame.begin(), blame.end()) - blame.begin());
  const int lo = static_cast<int>(std::min_element(blame.begin(), blame.end()) - blame.begin());
  if (!(blame[lo] > 0) || blame[hi] / blame[lo] <= o.epsilon) return std::optional<Plan>();
  std::vector<int> group_of(plan.nodes);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    for (int u : plan.groups[g]) group_of[u] = static_cast<int>(g);
  }
  std::vector<PlanChunk> chunks = plan.chunks;
  int moved = 0;
  for (auto& c : chunks) {  // GMs first
    if (moved == moves) break;
    if (c.gm != hi) continue;
    c.lm[group_of[lo]] = lo;
    c.gm = lo;
    ++moved;
  }
  // LMs inside hi's group, to its least blamed other member.
  const int g = group_of[hi];
  int peer = -1;
  for (int u : plan.groups[g]) {
    if (u != hi && (peer < 0 || blame[u] < blame[peer])) peer = u;
  }
  for (auto& c : chunks) {
    if (moved == moves || peer < 0) break;
    if (c.lm[g] != hi || c.gm == hi) continue;
    c.lm[g] = peer;
    ++moved;
  }
  if (moved == 0) return std::optional<Plan>();
  PLEXUS_ASSIGN_OR_RETURN(Plan next, BuildTwoLevelPlanFromMasters(plan.groups, std::move(chunks)));
  return std::optional<Plan>(std::move(next));
}

Autotuner::Autotuner(Plan plan, Matrix bandwidth, double element_bytes, double threshold)
    : plan_(std::move(plan)),
      built_for_(std::move(bandwidth)),
      element_bytes_(element_bytes),
      threshold_(threshold) {}

absl::StatusOr<Plan> Autotuner::Observe(const Matrix& bandwidth, const Matrix& rtt) {
  PLEXUS_RETURN_IF_ERROR(CheckMeasurements(plan_, rtt, bandwidth));
  PLEXUS_ASSIGN_OR_RETURN(std::vector<double> now, QuicktuneWeights(bandwidth));
  PLEXUS_RETURN_IF_ERROR(CheckMeasurements(plan_, rtt, built_for_));  // the constructor's matrix
  // A link whose rate moved by more than the threshold (the seed re-plans on a sudden change);
  // a node's total can only move that much when one of its links does.
  bool changed = false;
  for (size_t i = 0; i < bandwidth.size(); ++i) {
    for (size_t j = 0; j < bandwidth.size(); ++j) {
      const double b = built_for_[i][j];
      if (i != j && std::abs(bandwidth[i][j] - b) > threshold_ * b) changed = true;
    }
  }
  if (changed) {
    const int64_t elements = plan_.chunks.back().offset + plan_.chunks.back().elements;
    TwoLevelOptions options;
    options.chunk_elements = plan_.chunks.front().elements;
    options.node_weight = now;
    PLEXUS_ASSIGN_OR_RETURN(plan_, BuildTwoLevelPlan(plan_.groups, elements, options));
    built_for_ = bandwidth;
    last_action_ = "quicktune";
    last_bottleneck_ = -1;
    repeats_ = 0;
    return plan_;
  }
  const std::vector<double> blame = Blame(plan_, rtt, bandwidth, element_bytes_, {});
  const int hi = static_cast<int>(std::max_element(blame.begin(), blame.end()) - blame.begin());
  repeats_ = hi == last_bottleneck_ ? std::min(repeats_ + 1, 20) : 0;
  last_bottleneck_ = hi;
  PLEXUS_ASSIGN_OR_RETURN(std::optional<Plan> next,
                          FinetuneStep(plan_, rtt, bandwidth, element_bytes_, 1 << repeats_));
  if (next.has_value()) {
    plan_ = std::move(*next);
    last_action_ = "finetune";
  } else {
    last_action_ = "none";
  }
  return plan_;
}

}  // namespace plexus::aggregation
