// Data-parallel logistic regression through the parameter server: N worker processes each take
// their share of every global batch, push the summed gradient, and get the new weights back from
// the service (SGD on the mean gradient of the global batch). The same training in one process,
// without the server, must reach the same loss: the example fails (exit 1) when it does not.
//
//   logreg_ps [--workers 3] [--steps 200] [--batch 256] [--transport tcp|shm]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/launch.hpp"

namespace pa = plexus::aggregation;
namespace pt = plexus::tooling;

namespace {

constexpr int kFeatures = 16;
constexpr int kSamples = 4096;
constexpr float kLearningRate = 0.5f;

// A fixed synthetic data set: x ~ N(0, 1), y = [x . w* + noise > 0]. Identical in every process.
struct Data {
  std::vector<float> x;  // kSamples x kFeatures
  std::vector<float> y;
  Data() : x(kSamples * kFeatures), y(kSamples) {
    std::mt19937 rng(2024);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> truth(kFeatures);
    for (auto& t : truth) t = n(rng);
    for (int s = 0; s < kSamples; ++s) {
      float dot = 0.5f;
      for (int f = 0; f < kFeatures; ++f) {
        x[s * kFeatures + f] = n(rng);
        dot += x[s * kFeatures + f] * truth[f];
      }
      y[s] = dot + 0.5f * n(rng) > 0 ? 1.0f : 0.0f;
    }
  }
};

// Parameters: kFeatures weights and a bias.
constexpr int kParams = kFeatures + 1;

float Predict(const Data& d, const std::vector<float>& w, int s) {
  float z = w[kFeatures];
  for (int f = 0; f < kFeatures; ++f) z += w[f] * d.x[s * kFeatures + f];
  return 1.0f / (1.0f + std::exp(-z));
}

// Adds the logistic loss gradient of samples [begin, end) to grad.
void AddGradient(const Data& d, const std::vector<float>& w, int begin, int end,
                 std::vector<float>& grad) {
  for (int s = begin; s < end; ++s) {
    const float e = Predict(d, w, s) - d.y[s];
    for (int f = 0; f < kFeatures; ++f) grad[f] += e * d.x[s * kFeatures + f];
    grad[kFeatures] += e;
  }
}

double Loss(const Data& d, const std::vector<float>& w) {
  double sum = 0;
  for (int s = 0; s < kSamples; ++s) {
    const double p = std::clamp(static_cast<double>(Predict(d, w, s)), 1e-7, 1 - 1e-7);
    sum -= d.y[s] * std::log(p) + (1 - d.y[s]) * std::log(1 - p);
  }
  return sum / kSamples;
}

// The samples of step t's global batch that worker r of n takes.
std::pair<int, int> Share(int step, int batch, int r, int n) {
  const int start = (step * batch) % kSamples;
  return {start + batch * r / n, start + batch * (r + 1) / n};
}

struct Options {
  int workers = 3;
  int steps = 200;
  int batch = 256;
  std::string transport = "tcp";
  bool worker = false;
  int rank = 0;
  std::string addresses;
  uint32_t ns = 0;
  uint64_t nonce = 0;
};

int Worker(const Options& o) {
  const Data d;
  pa::ClientOptions co;
  co.backend = *plexus::transport::ParseBackend(o.transport);
  co.addresses = absl::StrSplit(o.addresses, ',');
  co.ns = {o.ns, o.nonce};
  co.worker = o.rank;
  auto client = pa::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(client.status().message()).c_str());
    return 1;
  }
  std::vector<float> w(kParams, 0.0f), grad(kParams);
  absl::Status s = (*client)->Init(0, plexus::collectives::DataType::kF32, w.data(), kParams);
  for (int step = 0; s.ok() && step < o.steps; ++step) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    auto [begin, end] = Share(step, o.batch, o.rank, o.workers);
    AddGradient(d, w, begin, end, grad);
    s = (*client)->PushPull(0, grad.data(), w.data(), kParams);  // w: the server's new weights
  }
  if (!s.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(s.message()).c_str());
    return 1;
  }
  if (o.rank == 0) std::printf("loss %.9g\n", Loss(d, w));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  pt::Tool tool("logreg_ps", "Logistic regression through the parameter server");
  CLI::App& app = tool.app();
  pt::AddNumber(&app, "--workers", &o.workers, "worker processes", 1, 64);
  pt::AddNumber(&app, "--steps", &o.steps, "SGD steps", 1, 100000);
  pt::AddNumber(&app, "--batch", &o.batch, "global batch", 1, kSamples);
  app.add_option("--transport", o.transport, "tcp or shm")->check(CLI::IsMember({"tcp", "shm"}));
  auto* worker_flag = app.add_flag("--worker", o.worker, "internal")->group("");
  app.add_option("--rank", o.rank)->group("")->needs(worker_flag);
  app.add_option("--addresses", o.addresses)->group("")->needs(worker_flag);
  app.add_option("--ns", o.ns)->group("")->needs(worker_flag);
  app.add_option("--nonce", o.nonce)->group("")->needs(worker_flag);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (o.worker) return Worker(o);

  // The service: SGD on the mean gradient of the global batch (the workers push sums).
  pa::ServiceOptions so;
  so.backend = *plexus::transport::ParseBackend(o.transport);
  so.cores = 2;
  so.round_timeout = absl::Seconds(30);
  auto service = pa::Service::Create(so);
  if (!service.ok()) return tool.Fail(service.status());
  pa::NamespaceOptions no;
  no.name = "logreg";
  no.workers = o.workers;
  no.optimizer.kind = pa::OptimizerKind::kSgd;
  no.optimizer.learning_rate = kLearningRate;
  no.optimizer.rescale = 1.0f / static_cast<float>(o.batch);
  auto ns = (*service)->CreateNamespace(no);
  if (!ns.ok()) return tool.Fail(ns.status());

  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  const std::string exe = len > 0 ? std::string(self, static_cast<size_t>(len)) : argv[0];
  const std::string addrs = absl::StrJoin((*service)->addresses(), ",");
  pt::LaunchOptions lo;
  lo.ranks = o.workers;
  lo.plexus_env = false;
  lo.output = pt::OutputMode::kCaptured;
  lo.timeout = absl::Seconds(90);
  lo.rank_argv = [&](int rank) {
    return std::vector<std::string>{exe,           "--worker",
                                    "--rank",      std::to_string(rank),
                                    "--addresses", addrs,
                                    "--ns",        std::to_string(ns->id),
                                    "--nonce",     std::to_string(ns->nonce),
                                    "--transport", o.transport,
                                    "--workers",   std::to_string(o.workers),
                                    "--steps",     std::to_string(o.steps),
                                    "--batch",     std::to_string(o.batch)};
  };
  auto run = pt::Launch(std::move(lo));
  if (!run.ok()) return tool.Fail(run.status());
  for (const auto& r : run->ranks) {
    if (!r.ok()) {
      std::fprintf(stderr, "%s", r.err.c_str());
      return tool.Fail(absl::StrCat("worker ", r.rank, " ", r.Describe()));
    }
  }
  double ps_loss = NAN;
  if (std::sscanf(run->ranks[0].out.c_str(), "loss %lf", &ps_loss) != 1) {
    return tool.Fail("worker 0 printed no loss");
  }

  // One process, the same global batches, the same SGD (f32, the mean gradient).
  const Data d;
  std::vector<float> w(kParams, 0.0f), grad(kParams);
  for (int step = 0; step < o.steps; ++step) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    auto [begin, end] = Share(step, o.batch, 0, 1);
    AddGradient(d, w, begin, end, grad);
    for (int p = 0; p < kParams; ++p) w[p] -= kLearningRate * (grad[p] / o.batch);
  }
  const double ref_loss = Loss(d, w);
  const double initial = Loss(d, std::vector<float>(kParams, 0.0f));
  std::printf(
      "initial loss %.6f; %d workers through the parameter server (%s): %.6f; "
      "one process: %.6f\n",
      initial, o.workers, o.transport.c_str(), ps_loss, ref_loss);
  // Only the order of the float sums differs: the losses agree to far better than 1e-4.
  const bool same = std::fabs(ps_loss - ref_loss) <= 1e-4 * std::max(1.0, ref_loss);
  const bool learned = ps_loss < 0.6 * initial;
  if (!same || !learned) {
    return tool.Fail(absl::StrCat(same ? "" : "losses differ; ", learned ? "" : "did not learn"));
  }
  return 0;
}
