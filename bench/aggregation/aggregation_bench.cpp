// plexus-bench-aggregation: the parameter server's figures as JSON lines (--json) or a table.
//   kernels   aggregation and optimizer kernels in GB/s against STREAM's add in the same run,
//             1 and 2 threads (target >= 0.85x)
//   engines   tall vs wide aggregation, 8 workers, ResNet-50 key sizes (PHub Table 6.1), 1 and 2
//             cores
//   pushpull  (--compare) PushPull of every ResNet-50 key through a Service with 2 and 4 local
//             worker processes over tcp and shm, against Plexus ring allreduce and Gloo ring
//             allreduce of the same bytes (the collectives bench's worker and Gloo peer programs)
// Every figure is the median of --runs runs.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/base/status.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "ps/buffers.hpp"
#include "ps/engine.hpp"
#include "ps/kernels.hpp"

namespace pa = plexus::aggregation;
namespace pai = plexus::aggregation::internal;
namespace pt = plexus::tooling;
using plexus::collectives::DataType;

namespace {

constexpr char kProgram[] = "plexus-bench-aggregation";

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ResNet-50's parameter tensors (f32 elements), in forward order: conv weights, batch-norm scale
// and shift, the classifier. 25.6 M parameters, 97.5 MB (PHub Table 6.1: 97 MB).
std::vector<size_t> ResNet50Keys(double scale) {
  std::vector<size_t> k;
  auto conv = [&](size_t in, size_t out, size_t kk) {
    k.push_back(in * out * kk * kk);
    k.push_back(out);
    k.push_back(out);
  };
  conv(3, 64, 7);
  size_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s) {
    const size_t width = size_t{64} << s;
    for (int b = 0; b < blocks[s]; ++b) {
      conv(in, width, 1);
      conv(width, width, 3);
      conv(width, width * 4, 1);
      if (b == 0) conv(in, width * 4, 1);  // projection shortcut
      in = width * 4;
    }
  }
  k.push_back(2048 * 1000);
  k.push_back(1000);
  for (auto& n : k) n = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(n) * scale));
  return k;
}

struct Options {
  bool json = false;
  bool compare = false;
  int runs = 3;
  std::string mode = "all";
  size_t kernel_mib = 64;  // per array
  double scale = 1.0;      // of ResNet-50's key sizes
  int workers = 8;         // engines
  int iters = 5;           // pushpull rounds per run
  std::vector<int> nprocs = {2, 4};
  std::vector<std::string> transports = {"tcp", "shm"};
  double timeout_s = 600;
  // Worker mode (started by the driver).
  bool worker = false;
  int rank = 0;
  std::string addresses, transport = "tcp";
  uint32_t ns = 0;
  uint64_t nonce = 0;
};

// ---- kernels ------------------------------------------------------------------------------

template <typename F>
double TimeThreads(int threads, size_t n, F body) {
  std::vector<std::thread> t;
  const double start = Seconds();
  for (int i = 1; i < threads; ++i) {
    t.emplace_back([&, i] { body(n * i / threads, n * (i + 1) / threads); });
  }
  body(0, n / threads);
  for (auto& th : t) th.join();
  return Seconds() - start;
}

void RunKernels(const Options& o, pt::FigureWriter& out) {
  const size_t n = o.kernel_mib * (size_t{1} << 20) / 4;
  auto a = pai::AllocAligned(n * 4), b = pai::AllocAligned(n * 4), c = pai::AllocAligned(n * 4);
  auto d = pai::AllocAligned(n * 4), e = pai::AllocAligned(n * 4);
  auto* fa = reinterpret_cast<float*>(a.get());
  auto* fb = reinterpret_cast<float*>(b.get());
  auto* fc = reinterpret_cast<float*>(c.get());
  auto* fd = reinterpret_cast<float*>(d.get());
  auto* fe = reinterpret_cast<float*>(e.get());
  for (size_t i = 0; i < n; ++i) fa[i] = fb[i] = fc[i] = fd[i] = fe[i] = 1e-3f;
  pa::OptimizerConfig nag;
  nag.kind = pa::OptimizerKind::kNesterov;
  const auto step = pai::PrepareStep(nag, 1);
  const bool nt = pai::UseNonTemporal(pa::StorePolicy::kAuto, n * 4);
  struct Kernel {
    const char* name;
    double bytes_per_element;
    std::function<void(size_t, size_t)> body;
  };
  const std::vector<Kernel> kernels = {
      {"stream_add", 12,
       [&](size_t lo, size_t hi) { pai::StreamAdd(fc + lo, fa + lo, fb + lo, hi - lo, nt); }},
      {"accumulate_f32", 12,
       [&](size_t lo, size_t hi) {
         pai::Accumulate(fc + lo, fa + lo, DataType::kF32, hi - lo, false);
       }},
      {"accumulate_bf16", 10,
       [&](size_t lo, size_t hi) {
         pai::Accumulate(fc + lo, reinterpret_cast<const uint8_t*>(fa) + 2 * lo, DataType::kBF16,
                         hi - lo, false);
       }},
      // Nesterov: loads w, g, m; stores w, m and the f32 values to send. Once with the store
      // policy kAuto picks for this size, once forced non-temporal.
      {"nesterov_f32", 24,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(nag.kind, step, fc + lo, fa + lo, fd + lo, nullptr, fe + lo,
                             DataType::kF32, hi - lo, nt);
       }},
      {"nesterov_f32_nt", 24,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(nag.kind, step, fc + lo, fa + lo, fd + lo, nullptr, fe + lo,
                             DataType::kF32, hi - lo, true);
       }},
      {"adam_f32", 32,  // loads w, g, m, v; stores w, m, v, values
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(pa::OptimizerKind::kAdam, step, fc + lo, fa + lo, fd + lo, fb + lo,
                             fe + lo, DataType::kF32, hi - lo, nt);
       }},
  };
  for (int threads : {1, 2}) {
    std::vector<std::vector<double>> gbps(kernels.size());
    for (int r = 0; r < o.runs; ++r) {
      for (size_t k = 0; k < kernels.size(); ++k) {
        kernels[k].body(0, n / 4);  // warm the page tables of a part
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep)
          best = std::min(best, TimeThreads(threads, n, kernels[k].body));
        gbps[k].push_back(kernels[k].bytes_per_element * static_cast<double>(n) / best / 1e9);
      }
    }
    const double stream = Median(gbps[0]);
    for (size_t k = 0; k < kernels.size(); ++k) {
      pt::Figure f;
      f.figure = absl::StrCat(kernels[k].name, "_gbps");
      f.value = Median(gbps[k]);
      f.unit = "GB/s";
      f.extra = {{"threads", threads},
                 {"array_mib", o.kernel_mib},
                 {"runs", o.runs},
                 {"non_temporal", k == 4 ? true : (k == 1 || k == 2 ? false : nt)},
                 {"avx2", pai::KernelsUseAvx2()}};
      out.Add(f);
      if (k == 0) continue;
      pt::Figure ratio;
      ratio.figure = absl::StrCat(kernels[k].name, "_vs_stream");
      ratio.value = f.value / stream;
      ratio.unit = "ratio";
      ratio.target = 0.85;
      ratio.met = ratio.value >= 0.85;
      ratio.extra = {{"threads", threads}};
      out.Add(ratio);
    }
  }
}

// ---- engines ------------------------------------------------------------------------------

void RunEngines(const Options& o, pt::FigureWriter& out) {
  const auto keys = ResNet50Keys(o.scale);
  size_t total = 0;
  for (size_t k : keys) total += k;
  std::vector<pai::AlignedBytes> grads;
  std::vector<const float*> ptrs;
  for (int w = 0; w < o.workers; ++w) {
    grads.push_back(pai::AllocAligned(total * 4));
    auto* g = reinterpret_cast<float*>(grads.back().get());
    for (size_t i = 0; i < total; ++i) g[i] = 1e-4f * static_cast<float>((i + w) % 7);
    ptrs.push_back(g);
  }
  for (int cores : {1, 2}) {
    double ms[2] = {0, 0};
    for (auto kind : {pai::EngineKind::kTall, pai::EngineKind::kWide}) {
      pai::EngineOptions eo;
      eo.kind = kind;
      eo.cores = cores;
      eo.workers = o.workers;
      eo.optimizer.kind = pa::OptimizerKind::kNesterov;
      auto engine = pai::Engine::Create(eo, keys);
      if (!engine.ok()) {
        std::fprintf(stderr, "%s: %s\n", kProgram, std::string(engine.status().message()).c_str());
        return;
      }
      (*engine)->RunRound(ptrs);  // first touch
      std::vector<double> t;
      for (int r = 0; r < o.runs; ++r) {
        const double start = Seconds();
        (*engine)->RunRound(ptrs);
        t.push_back((Seconds() - start) * 1e3);
      }
      const int i = kind == pai::EngineKind::kTall ? 0 : 1;
      ms[i] = Median(t);
      pt::Figure f;
      f.figure = i == 0 ? "tall_round_ms" : "wide_round_ms";
      f.value = ms[i];
      f.unit = "ms";
      f.extra = {{"cores", cores},      {"workers", o.workers},
                 {"keys", keys.size()}, {"model_mb", static_cast<double>(total) * 4 / 1e6},
                 {"runs", o.runs},      {"optimizer", "nesterov"}};
      out.Add(f);
    }
    pt::Figure r;
    r.figure = "tall_speedup_over_wide";
    r.value = ms[1] / ms[0];
    r.unit = "ratio";
    r.extra = {{"cores", cores}, {"workers", o.workers}};
    out.Add(r);
  }
}

// ---- pushpull -----------------------------------------------------------------------------

absl::StatusOr<plexus::transport::Backend> Backend(const std::string& name) {
  return plexus::transport::ParseBackend(name);
}

int WorkerMain(const Options& o) {
  auto backend = Backend(o.transport);
  if (!backend.ok()) return 2;
  pa::ClientOptions co;
  co.backend = *backend;
  co.addresses = absl::StrSplit(o.addresses, ',');
  co.ns = {o.ns, o.nonce};
  co.worker = o.rank;
  co.timeout = absl::Seconds(120);
  auto client = pa::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(client.status().message()).c_str());
    return 1;
  }
  const auto keys = ResNet50Keys(o.scale);
  std::vector<std::vector<float>> grad(keys.size()), val(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    grad[k].assign(keys[k], 1e-3f);
    val[k].assign(keys[k], 0.0f);
    absl::Status s = (*client)->Init(k, DataType::kF32, val[k].data(), keys[k]);
    if (!s.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(s.message()).c_str());
      return 1;
    }
  }
  std::vector<double> times;
  for (int it = 0; it < o.iters + 1; ++it) {
    const double start = Seconds();
    std::vector<pa::Client::Handle> handles;
    for (size_t k = keys.size(); k-- > 0;) {  // backprop order
      auto h = (*client)->PushPullAsync(k, grad[k].data(), val[k].data(), keys[k]);
      if (!h.ok()) return 1;
      handles.push_back(*h);
    }
    for (auto h : handles) {
      absl::Status s = (*client)->Wait(h);
      if (!s.ok()) {
        std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(s.message()).c_str());
        return 1;
      }
    }
    if (it > 0) times.push_back((Seconds() - start) * 1e3);  // the first round warms up
  }
  if (o.rank == 0) std::printf("{\"iteration_ms\": %.6f}\n", Median(times));
  return 0;
}

std::string SelfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n <= 0 ? kProgram : std::string(path, static_cast<size_t>(n));
}

// Starts `ranks` copies of argv and returns the number rank 0 prints under `field`.
absl::StatusOr<double> LaunchAndRead(std::vector<std::string> argv, int ranks, bool plexus_env,
                                     const char* field, double timeout_s,
                                     std::function<std::vector<std::string>(int)> rank_argv = {}) {
  pt::LaunchOptions lo;
  lo.ranks = ranks;
  lo.argv = std::move(argv);
  if (rank_argv) lo.rank_argv = rank_argv;
  lo.plexus_env = plexus_env;
  lo.output = pt::OutputMode::kCallback;
  lo.timeout = absl::Seconds(timeout_s);
  double value = -1;
  lo.on_line = [&](pt::Launcher&, int rank, pt::Stream stream, std::string_view text) {
    const std::string line(text);
    if (rank == 0 && stream == pt::Stream::kStdout && !line.empty() && line[0] == '{') {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains(field) && j[field].is_number()) {
        value = j[field].get<double>();
        return;
      }
    }
    std::fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
  };
  auto r = pt::Launch(std::move(lo));
  if (!r.ok()) return r.status();
  if (r->timed_out) return absl::DeadlineExceededError("timed out");
  if (r->first_failure >= 0) {
    return absl::InternalError(
        absl::StrCat("rank ", r->first_failure, " ", r->ranks[r->first_failure].Describe()));
  }
  if (value < 0) return absl::InternalError(absl::StrCat("rank 0 printed no ", field));
  return value;
}

void RunPushPull(const Options& o, pt::FigureWriter& out) {
  const auto keys = ResNet50Keys(o.scale);
  size_t total = 0;
  for (size_t k : keys) total += k;
  const std::string dir = SelfPath().substr(0, SelfPath().rfind('/'));
  const std::string coll = dir + "/plexus-bench-collectives";
  const std::string gloo = dir + "/plexus-bench-collectives-gloo";
  for (const std::string& transport : o.transports) {
    auto backend = Backend(transport);
    if (!backend.ok()) continue;
    for (int np : o.nprocs) {
      auto emit = [&](const std::string& impl, const absl::StatusOr<std::vector<double>>& ms) {
        pt::Figure f;
        f.figure = absl::StrCat(impl, "_iteration_ms");
        f.unit = "ms";
        f.value = ms.ok() ? Median(*ms) : NAN;
        f.extra = {{"np", np},
                   {"transport", transport},
                   {"model_mb", total * 4 / 1e6},
                   {"keys", keys.size()},
                   {"runs", o.runs}};
        if (!ms.ok()) f.extra["error"] = std::string(ms.status().message());
        out.Add(f);
        return f.value;
      };
      // The parameter server: the service here (2 cores), np worker processes.
      std::vector<double> ps;
      absl::Status ps_error;
      for (int r = 0; r < o.runs && ps_error.ok(); ++r) {
        pa::ServiceOptions so;
        so.backend = *backend;
        so.cores = 2;
        so.memory_budget_bytes = size_t{4} << 30;
        auto service = pa::Service::Create(so);
        if (!service.ok()) {
          ps_error = service.status();
          break;
        }
        pa::NamespaceOptions no;
        no.name = "bench";
        no.workers = np;
        no.optimizer.kind = pa::OptimizerKind::kNesterov;
        no.optimizer.rescale = 1.0f / np;
        auto ns = (*service)->CreateNamespace(no);
        const std::string addrs = absl::StrJoin((*service)->addresses(), ",");
        auto v = LaunchAndRead({}, np, false, "iteration_ms", o.timeout_s, [&](int rank) {
          return std::vector<std::string>{SelfPath(),    "--worker",
                                          "--rank",      std::to_string(rank),
                                          "--addresses", addrs,
                                          "--ns",        std::to_string(ns->id),
                                          "--nonce",     std::to_string(ns->nonce),
                                          "--transport", transport,
                                          "--scale",     fmt::format("{}", o.scale),
                                          "--iters",     std::to_string(o.iters)};
        });
        if (!v.ok())
          ps_error = v.status();
        else
          ps.push_back(*v);
      }
      const double ps_ms =
          emit("ps_pushpull", ps_error.ok() ? absl::StatusOr<std::vector<double>>(ps)
                                            : absl::StatusOr<std::vector<double>>(ps_error));
      // Plexus ring allreduce of the same bytes, fused (the collectives bench's worker mode).
      auto allreduce =
          [&](const std::vector<std::string>& argv) -> absl::StatusOr<std::vector<double>> {
        std::vector<double> t;
        for (int r = 0; r < o.runs; ++r) {
          PLEXUS_ASSIGN_OR_RETURN(double us, LaunchAndRead(argv, np, true, "time_us", o.timeout_s));
          t.push_back(us / 1e3);
        }
        return t;
      };
      const std::string bytes = std::to_string(total * 4);
      const double ring_ms = emit(
          "plexus_ring_allreduce",
          allreduce({coll, "--worker", "--sizes", bytes, "--transport", transport, "--algorithm",
                     "ring", "--iters", std::to_string(o.iters), "--warmup", "1"}));
      pt::Figure ratio;
      ratio.figure = "ps_over_ring_time";
      ratio.value = ps_ms / ring_ms;
      ratio.unit = "ratio";
      ratio.extra = {{"np", np}, {"transport", transport}};
      out.Add(ratio);
      if (transport == "tcp" && access(gloo.c_str(), X_OK) == 0) {
        const double gloo_ms =
            emit("gloo_ring_allreduce",
                 allreduce({gloo, "--algorithm", "ring", "--sizes", bytes, "--transport", "tcp",
                            "--iters", std::to_string(o.iters), "--warmup", "1"}));
        pt::Figure g;
        g.figure = "ps_over_gloo_time";
        g.value = ps_ms / gloo_ms;
        g.unit = "ratio";
        g.extra = {{"np", np}, {"transport", transport}};
        out.Add(g);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  pt::Tool tool(kProgram, "Parameter-server kernels, tall vs wide engines, PushPull vs allreduce");
  CLI::App& app = tool.app();
  pt::AddJsonFlag(&app, &o.json);
  app.add_flag("--compare", o.compare, "also PushPull end to end against ring and Gloo allreduce");
  pt::AddNumber(&app, "--runs", &o.runs, "runs per figure (the median is reported)", 1, 100);
  app.add_option("--mode", o.mode, "all, kernels, engines or pushpull")
      ->check(CLI::IsMember({"all", "kernels", "engines", "pushpull"}));
  pt::AddNumber(&app, "--kernel-mib", &o.kernel_mib, "MiB per kernel array", size_t{1},
                size_t{4096});
  pt::AddNumber(&app, "--scale", &o.scale, "scale of ResNet-50's key sizes", 0.0001, 4.0);
  pt::AddNumber(&app, "--workers", &o.workers, "workers of the engine comparison", 1, 64);
  pt::AddNumber(&app, "--iters", &o.iters, "PushPull rounds per run", 1, 1000);
  app.add_option("--nprocs", o.nprocs, "worker processes of the PushPull comparison");
  app.add_option("--transports", o.transports, "tcp and/or shm");
  pt::AddNumber(&app, "--timeout", &o.timeout_s, "seconds per launched job", 1.0, 86400.0);
  auto* w = app.add_flag("--worker", o.worker, "internal: one PushPull worker")->group("");
  app.add_option("--rank", o.rank)->group("")->needs(w);
  app.add_option("--addresses", o.addresses)->group("")->needs(w);
  app.add_option("--ns", o.ns)->group("")->needs(w);
  app.add_option("--nonce", o.nonce)->group("")->needs(w);
  app.add_option("--transport", o.transport)->group("")->needs(w);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (o.worker) return WorkerMain(o);

  pt::FigureWriter out("aggregation", o.json);
  if (o.mode == "all" || o.mode == "kernels") RunKernels(o, out);
  if (o.mode == "all" || o.mode == "engines") RunEngines(o, out);
  if ((o.mode == "all" && o.compare) || o.mode == "pushpull") RunPushPull(o, out);
  if (!o.json) out.PrintTable();
  return 0;
}
