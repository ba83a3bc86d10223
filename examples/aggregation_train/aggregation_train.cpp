// Data-parallel logistic regression trained three ways on the same global batches: through the
// parameter server (N worker processes push the gradient of their share of every global batch and
// get the new weights back: the service runs SGD on the mean gradient), through Plexus ring
// allreduce (N worker processes sum their gradients with a collectives Communicator, then each
// takes the same SGD step), and in one process. Prints the three loss curves and the time per
// iteration side by side, and fails (exit 1) unless both distributed runs stay within 1e-4
// (relative, at least 1e-4 absolute) of the one-process loss at every point of the curve: only the
// order of the float sums differs between them.
//
//   logreg_ps [--workers 3] [--steps 200] [--batch 256] [--every 20] [--transport tcp|shm]
//
// The workers are this program again (/proc/self/exe with the hidden --worker options), started
// and waited for by the driver itself; the ring workers meet at a store the driver serves.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"

namespace pa = plexus::aggregation;
namespace pc = plexus::collectives;
namespace pt = plexus::transport;

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
  int every = 20;
  std::string transport = "tcp";
  bool worker = false;
  std::string via = "ps";  // a worker's aggregation: "ps" or "ring"
  int rank = 0;
  std::string addresses;  // ps: the service's addresses
  std::string store;      // ring: the driver's store, "127.0.0.1:port"
  uint32_t ns = 0;
  uint64_t nonce = 0;
};

// Only the order of float sums differs between the runs (the server sums the workers' gradients
// in arrival order, the ring in ring order, one process in sample order): with 17 parameters and a
// convex loss, the curves agree to about 1e-8; 1e-4 leaves room and still catches a systematic
// error (a wrong batch share, a worker's gradient lost or doubled every step), which shifts the
// loss by far more.
constexpr double kTolerance = 1e-4;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A worker's training: `aggregate` turns this worker's gradient sum into the new weights (through
// the server, or an allreduce and the SGD step). Rank 0 prints "curve <steps> <loss>" every
// `every` steps and at the end, then "iteration_us <median time of a step>" (the loss evaluation
// is not timed).
template <typename Aggregate>
absl::Status Train(const Options& o, Aggregate aggregate) {
  const Data d;
  std::vector<float> w(kParams, 0.0f), grad(kParams);
  std::vector<double> step_us;
  for (int step = 0; step < o.steps; ++step) {
    const double start = Now();
    std::fill(grad.begin(), grad.end(), 0.0f);
    auto [begin, end] = Share(step, o.batch, o.rank, o.workers);
    AddGradient(d, w, begin, end, grad);
    PLEXUS_RETURN_IF_ERROR(aggregate(grad, w));
    step_us.push_back((Now() - start) * 1e6);
    if (o.rank == 0 && ((step + 1) % o.every == 0 || step + 1 == o.steps)) {
      std::printf("curve %d %.9g\n", step + 1, Loss(d, w));
    }
  }
  if (o.rank == 0) std::printf("iteration_us %.3f\n", Median(step_us));
  return absl::OkStatus();
}

// One SGD step on the mean gradient of the global batch, as the service's SGD computes it
// (rescale = 1 / batch, no weight decay; exact for a power-of-two batch).
void SgdStep(const std::vector<float>& grad, int batch, std::vector<float>& w) {
  for (int p = 0; p < kParams; ++p) w[p] -= kLearningRate * (grad[p] / static_cast<float>(batch));
}

absl::Status PsWorker(const Options& o) {
  pa::ClientOptions co;
  co.backend = *pt::ParseBackend(o.transport);
  co.addresses = absl::StrSplit(o.addresses, ',');
  co.ns = {o.ns, o.nonce};
  co.worker = o.rank;
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pa::Client> client, pa::Client::Connect(co));
  const std::vector<float> zeros(kParams, 0.0f);
  PLEXUS_RETURN_IF_ERROR(client->Init(0, pc::DataType::kF32, zeros.data(), kParams));
  return Train(o, [&](const std::vector<float>& grad, std::vector<float>& w) {
    return client->PushPull(0, grad.data(), w.data(), kParams);  // w: the server's new weights
  });
}

absl::Status RingWorker(const Options& o) {
  // Rank and world size come from the driver's command line, the store from the driver: the
  // rendezvous of a custom launcher (under plexus-run, torchrun or mpirun, Rendezvous::FromEnv()).
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pt::TcpStore> store,
                          pt::TcpStore::Connect(o.store, absl::Seconds(60)));
  PLEXUS_ASSIGN_OR_RETURN(
      pt::Rendezvous rdv,
      pt::Rendezvous::Create(o.rank, o.workers, std::move(store), o.rank, o.workers));
  pc::CommunicatorOptions copt;
  copt.device.backend = *pt::ParseBackend(o.transport);
  // The transport named, for every pair (ranks on one host would otherwise use shm).
  copt.transport_policy = pc::TransportPolicy::kUniform;
  copt.timeout = absl::Seconds(30);
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pc::Communicator> comm,
                          pc::Communicator::Create(rdv, copt));
  pc::CallOptions ring;
  ring.algorithm = pc::Algorithm::kRing;
  return Train(o, [&](std::vector<float>& grad, std::vector<float>& w) -> absl::Status {
    PLEXUS_RETURN_IF_ERROR(comm->AllReduce(grad.data(), grad.data(), kParams, pc::DataType::kF32,
                                           pc::ReduceOp::kSum, ring));
    SgdStep(grad, o.batch, w);
    return absl::OkStatus();
  });
}

// What rank 0 of a run printed.
struct Curve {
  std::vector<int> steps;
  std::vector<double> loss;
  double iteration_us = NAN;
};

absl::StatusOr<Curve> ParseCurve(const std::string& out, std::string_view what) {
  Curve c;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    int step = 0;
    double v = 0;
    const std::string l(line);
    if (std::sscanf(l.c_str(), "curve %d %lf", &step, &v) == 2) {
      c.steps.push_back(step);
      c.loss.push_back(v);
    } else if (std::sscanf(l.c_str(), "iteration_us %lf", &v) == 1) {
      c.iteration_us = v;
    }
  }
  if (c.steps.empty() || std::isnan(c.iteration_us)) {
    return absl::InternalError(absl::StrCat(std::string(what), ": worker 0 printed no loss curve"));
  }
  return c;
}

// Starts o.workers copies of this program with `args` and "--rank <r>" and waits for them all;
// the first that fails stops the others. Returns what worker 0 printed on stdout.
absl::StatusOr<std::string> RunWorkers(const Options& o, const std::vector<std::string>& args) {
  std::FILE* out = std::tmpfile();  // worker 0's stdout
  if (out == nullptr) return absl::InternalError(absl::StrCat("tmpfile: ", std::strerror(errno)));
  fcntl(fileno(out), F_SETFD, FD_CLOEXEC);  // only worker 0 gets it, as its stdout
  const pid_t driver = getpid();
  std::vector<pid_t> pids;
  std::string failure;
  for (int rank = 0; rank < o.workers && failure.empty(); ++rank) {
    std::vector<std::string> words = {"/proc/self/exe"};
    words.insert(words.end(), args.begin(), args.end());
    words.push_back(absl::StrCat("--rank=", rank));
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec: the driver has threads.
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // the workers end with the driver
      if (getppid() != driver) _exit(127);
      if (rank == 0) dup2(fileno(out), STDOUT_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid < 0) {
      failure = absl::StrCat("cannot start worker ", rank, ": fork: ", std::strerror(errno));
    } else {
      pids.push_back(pid);
    }
  }
  std::vector<bool> running(pids.size(), true);
  auto stop_all = [&] {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (running[r]) kill(pids[r], SIGKILL);
    }
  };
  if (!failure.empty()) stop_all();
  for (size_t left = pids.size(); left > 0;) {
    int status = 0;
    const pid_t pid = wait(&status);  // the workers are this program's only children
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const size_t rank = std::find(pids.begin(), pids.end(), pid) - pids.begin();
    if (rank == pids.size()) continue;
    running[rank] = false;
    --left;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (failure.empty()) {
      failure = WIFEXITED(status)
                    ? absl::StrCat("worker ", rank, " exited with code ", WEXITSTATUS(status))
                    : absl::StrCat("worker ", rank, " was killed by signal ", WTERMSIG(status));
      stop_all();
    }
  }
  std::string printed;
  std::rewind(out);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, out)) > 0;) printed.append(buf, n);
  std::fclose(out);
  if (!failure.empty()) return absl::InternalError(failure);
  return printed;
}

// The arguments every worker of a run gets (RunWorkers adds its rank).
std::vector<std::string> WorkerArgs(const Options& o, const std::string& via) {
  return {"--worker",
          "--via=" + via,
          "--transport=" + o.transport,
          absl::StrCat("--workers=", o.workers),
          absl::StrCat("--steps=", o.steps),
          absl::StrCat("--batch=", o.batch),
          absl::StrCat("--every=", o.every)};
}

// The parameter-server run: the service runs here, the workers push to its addresses.
absl::StatusOr<Curve> RunPs(const Options& o) {
  pa::ServiceOptions so;
  so.backend = *pt::ParseBackend(o.transport);
  so.cores = 2;
  so.round_timeout = absl::Seconds(30);
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pa::Service> service, pa::Service::Create(so));
  // SGD on the mean gradient of the global batch (the workers push sums).
  pa::NamespaceOptions no;
  no.name = "logreg";
  no.workers = o.workers;
  no.optimizer.kind = pa::OptimizerKind::kSgd;
  no.optimizer.learning_rate = kLearningRate;
  no.optimizer.rescale = 1.0f / static_cast<float>(o.batch);
  PLEXUS_ASSIGN_OR_RETURN(pa::NamespaceInfo ns, service->CreateNamespace(no));
  std::vector<std::string> args = WorkerArgs(o, "ps");
  args.insert(args.end(), {"--addresses=" + absl::StrJoin(service->addresses(), ","),
                           absl::StrCat("--ns=", ns.id), absl::StrCat("--nonce=", ns.nonce)});
  absl::StatusOr<std::string> printed = RunWorkers(o, args);
  service->Shutdown();
  if (!printed.ok()) return plexus::base::Annotate(printed.status(), "ps");
  return ParseCurve(*printed, "ps");
}

// The ring-allreduce run: the workers meet at a store served here.
absl::StatusOr<Curve> RunRing(const Options& o) {
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pt::TcpStoreServer> store,
                          pt::TcpStoreServer::Start("127.0.0.1:0"));
  std::vector<std::string> args = WorkerArgs(o, "ring");
  args.push_back(absl::StrCat("--store=127.0.0.1:", store->port()));
  absl::StatusOr<std::string> printed = RunWorkers(o, args);
  if (!printed.ok()) return plexus::base::Annotate(printed.status(), "ring");
  return ParseCurve(*printed, "ring");
}

// The same SGD in one process on the whole global batch, with the curve at the same steps.
Curve SingleProcess(const Options& o) {
  const Data d;
  Curve c;
  std::vector<float> w(kParams, 0.0f), grad(kParams);
  std::vector<double> step_us;
  for (int step = 0; step < o.steps; ++step) {
    const double start = Now();
    std::fill(grad.begin(), grad.end(), 0.0f);
    auto [begin, end] = Share(step, o.batch, 0, 1);
    AddGradient(d, w, begin, end, grad);
    SgdStep(grad, o.batch, w);
    step_us.push_back((Now() - start) * 1e6);
    if ((step + 1) % o.every == 0 || step + 1 == o.steps) {
      c.steps.push_back(step + 1);
      c.loss.push_back(Loss(d, w));
    }
  }
  c.iteration_us = Median(step_us);
  return c;
}

// "logreg_ps: <message>" on stderr; the exit code of a failed run.
int Fail(const std::string& message) {
  std::fprintf(stderr, "logreg_ps: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Logistic regression through the parameter server and through ring allreduce",
               "logreg_ps");
  app.add_option("--workers", o.workers, "worker processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "SGD steps")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "global batch")
      ->check(CLI::Range(1, kSamples))
      ->capture_default_str();
  app.add_option("--every", o.every, "steps between points of the loss curve")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--transport", o.transport, "tcp or shm")
      ->check(CLI::IsMember({"tcp", "shm"}))
      ->capture_default_str();
  // What the driver passes to its workers (not shown in --help).
  auto* worker_flag = app.add_flag("--worker", o.worker, "internal")->group("");
  app.add_option("--via", o.via)
      ->group("")
      ->needs(worker_flag)
      ->check(CLI::IsMember({"ps", "ring"}));
  app.add_option("--rank", o.rank)->group("")->needs(worker_flag);
  app.add_option("--addresses", o.addresses)->group("")->needs(worker_flag);
  app.add_option("--store", o.store)->group("")->needs(worker_flag);
  app.add_option("--ns", o.ns)->group("")->needs(worker_flag);
  app.add_option("--nonce", o.nonce)->group("")->needs(worker_flag);
  CLI11_PARSE(app, argc, argv);
  if (o.worker) {
    const absl::Status s = o.via == "ps" ? PsWorker(o) : RingWorker(o);
    if (!s.ok()) {
      std::fprintf(stderr, "%s worker %d: %s\n", o.via.c_str(), o.rank,
                   std::string(s.message()).c_str());
      return 1;
    }
    return 0;
  }

  auto ps = RunPs(o);
  if (!ps.ok()) return Fail(std::string(ps.status().message()));
  auto ring = RunRing(o);
  if (!ring.ok()) return Fail(std::string(ring.status().message()));
  const Curve one = SingleProcess(o);

  const Data d;
  const double initial = Loss(d, std::vector<float>(kParams, 0.0f));
  std::printf(
      "logistic regression, %d features, global batch %d, %d SGD steps (lr %g); %d worker "
      "processes over %s\n",
      kFeatures, o.batch, o.steps, kLearningRate, o.workers, o.transport.c_str());
  std::printf("%6s  %16s  %16s  %12s\n", "step", "parameter server", "ring allreduce",
              "one process");
  std::printf("%6d  %16.6f  %16.6f  %12.6f\n", 0, initial, initial, initial);
  bool same = ps->steps == one.steps && ring->steps == one.steps;
  double worst = 0;
  for (size_t i = 0; same && i < one.steps.size(); ++i) {
    std::printf("%6d  %16.6f  %16.6f  %12.6f\n", one.steps[i], ps->loss[i], ring->loss[i],
                one.loss[i]);
    const double bound = kTolerance * std::max(1.0, one.loss[i]);
    const double diff =
        std::max(std::fabs(ps->loss[i] - one.loss[i]), std::fabs(ring->loss[i] - one.loss[i]));
    worst = std::max(worst, diff);
    if (!(diff <= bound)) same = false;  // NaN fails too
  }
  std::printf(
      "time per iteration (median of %d steps, worker 0): parameter server %.1f us, ring "
      "allreduce %.1f us (one process: %.1f us)\n",
      o.steps, ps->iteration_us, ring->iteration_us, one.iteration_us);
  std::printf("largest difference from one process: %.3g (tolerance %g)\n", worst, kTolerance);
  const bool learned = one.loss.back() < 0.6 * initial;
  if (!same || !learned) {
    return Fail(absl::StrCat(same ? "" : "a distributed run left the one-process curve; ",
                             learned ? "" : "did not learn"));
  }
  return 0;
}
