// plexus-bench-aggregation: the parameter server's figures as JSON lines (--json) or a table.
//   kernels   aggregation and optimizer kernels in GB/s against STREAM's add in the same run,
//             1 and 2 threads (informational), and against STREAM-style kernels with the
//             optimizer's own streams (Nesterov 3 in + 3 out, Adam 4 + 4)
//   engines   tall vs wide aggregation, 8 workers, ResNet-50 key sizes (PHub Table 6.1), 1 and 2
//             cores
//   pushpull  (--compare) PushPull of every ResNet-50 key through a Service with 2 and 4 local
//             worker processes over tcp and shm, against Plexus ring allreduce and Gloo ring
//             allreduce of the same bytes (the collectives bench's worker and Gloo peer programs),
//             like with like: the same congestion control, statistic (the slowest rank's mean
//             round), checked values and a balanced launch order
//   table41   the dissertation's Table 4.1 counted on the flow simulator's schedules, printed next
//             to the seed's formulas (the same table as `plexus-agg-sim table`)
// Every figure is the median of --runs runs.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "order.hpp"
#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/hierarchy.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/status.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "ps/buffers.hpp"
#include "ps/engine.hpp"
#include "ps/kernels.hpp"
#include "raw_tcp.hpp"  // plexus::bench::PinToCpu

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
  bool pin = false;        // kernels: pin benchmark thread i to the i-th usable CPU
  size_t kernel_mib = 64;  // per array
  double scale = 1.0;      // of ResNet-50's key sizes
  int workers = 8;         // engines
  int iters = 5;           // pushpull rounds per run
  std::vector<int> nprocs = {2, 4};
  std::vector<std::string> transports = {"tcp", "shm"};
  int table_n = 4;  // Table 4.1: nodes per rack (N) and racks (C); S = 1
  int table_c = 2;
  double timeout_s = 600;
  // The loopback congestion control of every Plexus side of pushpull ("system": the system's,
  // as Gloo's).
  std::string loopback_cc = "system";
  // Worker mode (started by the driver).
  bool worker = false;
  int rank = 0;
  int nworkers = 1;
  std::string addresses, transport = "tcp";
  uint32_t ns = 0;
  uint64_t nonce = 0;
};

// ---- kernels ------------------------------------------------------------------------------

// Runs body over [0, n) split into `threads` contiguous parts, one per thread (the caller's
// thread takes part 0); with `cpus` non-empty, thread i runs pinned to cpus[i % size] (the
// caller's thread is unpinned again afterwards).
template <typename F>
double TimeThreads(int threads, size_t n, const std::vector<int>& cpus, F body) {
  auto pin = [&](int i) {
    if (!cpus.empty()) plexus::bench::PinToCpu(cpus[static_cast<size_t>(i) % cpus.size()]);
  };
  std::vector<std::thread> t;
  pin(0);
  const double start = Seconds();
  for (int i = 1; i < threads; ++i) {
    t.emplace_back([&, i] {
      pin(i);
      body(n * i / threads, n * (i + 1) / threads);
    });
  }
  body(0, n / threads);
  for (auto& th : t) th.join();
  const double seconds = Seconds() - start;
  if (!cpus.empty()) plexus::bench::PinToCpu(-1);
  return seconds;
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
  pa::UpdateRule nag;
  nag.kind = pa::OptimizerKind::kNesterov;
  const auto step = pai::PrepareStep(nag, 1);
  const bool nt = false;  // the cached variants; each *_nt variant streams its write-only output
  float* const nesterov_arrays[2] = {fc, fd};  // w, m
  float* const adam_arrays[3] = {fc, fd, fb};  // w, m, v
  struct Kernel {
    const char* name;
    double bytes_per_element;  // the bytes the kernel names (loads + stores), not write-allocates
    bool non_temporal;
    int yardstick;  // index of the STREAM-style kernel with the same streams, -1: none
    // (Every kernel is also compared with STREAM add of the same store policy: kernel 0 or 1.)
    std::function<void(size_t, size_t)> body;
  };
  const std::vector<Kernel> kernels = {
      {"stream_add", 12, nt, -1,
       [&](size_t lo, size_t hi) { pai::StreamAdd(fc + lo, fa + lo, fb + lo, hi - lo, nt); }},
      {"stream_add_nt", 12, true, -1,
       [&](size_t lo, size_t hi) { pai::StreamAdd(fc + lo, fa + lo, fb + lo, hi - lo, true); }},
      {"accumulate_f32", 12, false, 12,
       [&](size_t lo, size_t hi) {
         pai::Accumulate(fc + lo, fa + lo, DataType::kF32, hi - lo, false);
       }},
      {"accumulate_bf16", 10, false, -1,
       [&](size_t lo, size_t hi) {
         pai::Accumulate(fc + lo, reinterpret_cast<const uint8_t*>(fa) + 2 * lo, DataType::kBF16,
                         hi - lo, false);
       }},
      // Nesterov loads w, g, m and stores w, m and the f32 values to send: 3 + 3 streams. Its
      // yardstick moves the same streams with one add each (x += g).
      {"stream_3r3w", 24, nt, -1,
       [&](size_t lo, size_t hi) {
         float* const p[2] = {nesterov_arrays[0] + lo, nesterov_arrays[1] + lo};
         pai::StreamUpdate(p, 2, fa + lo, fe + lo, hi - lo, nt);
       }},
      {"nesterov_f32", 24, nt, 4,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(nag.kind, step, fc + lo, fa + lo, fd + lo, nullptr, fe + lo,
                             DataType::kF32, hi - lo, nt);
       }},
      {"stream_3r3w_nt", 24, true, -1,
       [&](size_t lo, size_t hi) {
         float* const p[2] = {nesterov_arrays[0] + lo, nesterov_arrays[1] + lo};
         pai::StreamUpdate(p, 2, fa + lo, fe + lo, hi - lo, true);
       }},
      {"nesterov_f32_nt", 24, true, 6,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(nag.kind, step, fc + lo, fa + lo, fd + lo, nullptr, fe + lo,
                             DataType::kF32, hi - lo, true);
       }},
      // Adam loads w, g, m, v and stores w, m, v and the values: 4 + 4 streams.
      {"stream_4r4w", 32, nt, -1,
       [&](size_t lo, size_t hi) {
         float* const p[3] = {adam_arrays[0] + lo, adam_arrays[1] + lo, adam_arrays[2] + lo};
         pai::StreamUpdate(p, 3, fa + lo, fe + lo, hi - lo, nt);
       }},
      {"adam_f32", 32, nt, 8,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(pa::OptimizerKind::kAdam, step, fc + lo, fa + lo, fd + lo, fb + lo,
                             fe + lo, DataType::kF32, hi - lo, nt);
       }},
      {"stream_4r4w_nt", 32, true, -1,
       [&](size_t lo, size_t hi) {
         float* const p[3] = {adam_arrays[0] + lo, adam_arrays[1] + lo, adam_arrays[2] + lo};
         pai::StreamUpdate(p, 3, fa + lo, fe + lo, hi - lo, true);
       }},
      {"adam_f32_nt", 32, true, 10,
       [&](size_t lo, size_t hi) {
         pai::ApplyOptimizer(pa::OptimizerKind::kAdam, step, fc + lo, fa + lo, fd + lo, fb + lo,
                             fe + lo, DataType::kF32, hi - lo, true);
       }},
      // Accumulation's yardstick: STREAM add in place (c += a), the same 2 loads and 1 store, and
      // no write-allocate (the stored line was just loaded), so both are credited 12 bytes.
      {"stream_add_inplace", 12, false, -1,
       [&](size_t lo, size_t hi) { pai::StreamAdd(fc + lo, fc + lo, fa + lo, hi - lo, false); }},
  };
  const std::vector<int> cpus = o.pin ? plexus::base::UsableCpus() : std::vector<int>{};
  for (int threads : {1, 2}) {
    std::vector<std::vector<double>> gbps(kernels.size());
    // Kernels interleaved within each run, so that a burst of load from other processes hits all
    // of them rather than one.
    for (int r = 0; r < o.runs; ++r) {
      for (size_t k = 0; k < kernels.size(); ++k) {
        kernels[k].body(0, n / 4);  // warm the page tables of a part
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep)
          best = std::min(best, TimeThreads(threads, n, cpus, kernels[k].body));
        gbps[k].push_back(kernels[k].bytes_per_element * static_cast<double>(n) / best / 1e9);
      }
    }
    const double stream[2] = {Median(gbps[0]), Median(gbps[1])};  // cached, non-temporal
    for (size_t k = 0; k < kernels.size(); ++k) {
      pt::Figure f;
      f.figure = absl::StrCat(kernels[k].name, "_gbps");
      f.value = Median(gbps[k]);
      f.unit = "GB/s";
      f.extra = {{"threads", threads}, {"array_mib", o.kernel_mib},
                 {"runs", o.runs},     {"non_temporal", kernels[k].non_temporal},
                 {"pinned", o.pin},    {"avx2", pai::KernelsUseAvx2()}};
      out.Add(f);
      if (absl::StartsWith(kernels[k].name, "stream_")) continue;
      // Against STREAM add (informational): add is credited the 12 bytes it names, but a cached
      // store first reads its line (write-allocate), so it moves 16 and this ratio reads up to
      // 1.33x high. Only the same-streams ratio below compares like with like.
      pt::Figure ratio;
      ratio.figure = absl::StrCat(kernels[k].name, "_vs_stream");
      ratio.value = f.value / stream[kernels[k].non_temporal ? 1 : 0];
      ratio.unit = "ratio";
      ratio.extra = {{"threads", threads},
                     {"yardstick", kernels[k].non_temporal ? "stream_add_nt" : "stream_add"}};
      out.Add(ratio);
      if (kernels[k].yardstick < 0) continue;
      // Against the yardstick with the same loads and stores: what the arithmetic costs, the
      // figure the target is judged on.
      pt::Figure same;
      same.figure = absl::StrCat(kernels[k].name, "_vs_same_streams");
      same.value = f.value / Median(gbps[static_cast<size_t>(kernels[k].yardstick)]);
      same.unit = "ratio";
      same.target = 0.85;
      same.met = same.value >= 0.85;
      same.extra = {{"threads", threads}, {"yardstick", kernels[kernels[k].yardstick].name}};
      out.Add(same);
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

// The tcp settings of every Plexus side of the comparison: the loopback congestion control the
// peers (Gloo) run under, unless --loopback-cc names another.
plexus::transport::TcpOptions TcpSettings(const Options& o) {
  plexus::transport::TcpOptions tcp;
  tcp.loopback_congestion_control = o.loopback_cc == "system" ? std::string() : o.loopback_cc;
  return tcp;
}

// The weights every worker must hold after `rounds` PushPulls of the constant gradient `g` from
// each of `workers` workers, starting from 0: the documented Nesterov update (optimizer.hpp)
// computed here in double, independently of the service's kernels.
double ExpectedNesterovWeight(const pa::UpdateRule& rule, double g, int workers, int rounds) {
  const double gp = rule.rescale * (g * workers);
  double w = 0, m = 0;
  for (int r = 0; r < rounds; ++r) {
    m = rule.momentum * m + gp;
    w -= rule.learning_rate * (gp + rule.momentum * m);
  }
  return w;
}

pa::UpdateRule BenchRule(int workers) {
  pa::UpdateRule rule;
  rule.kind = pa::OptimizerKind::kNesterov;
  rule.rescale = 1.0f / static_cast<float>(workers);
  return rule;
}

constexpr float kGradient = 1e-3f;

// One worker of the PushPull comparison: --iters timed rounds after one warm-up; prints the mean
// time per round (the statistic the allreduce workers print) and the number of weights that
// differ from the expected update.
int WorkerMain(const Options& o) {
  auto backend = Backend(o.transport);
  if (!backend.ok()) return 2;
  pa::ClientOptions co;
  co.backend = *backend;
  co.addresses = absl::StrSplit(o.addresses, ',');
  co.ns = {o.ns, o.nonce};
  co.worker = o.rank;
  co.timeout = absl::Seconds(120);
  co.tcp = TcpSettings(o);
  auto client = pa::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(client.status().message()).c_str());
    return 1;
  }
  const auto keys = ResNet50Keys(o.scale);
  std::vector<std::vector<float>> grad(keys.size()), val(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    grad[k].assign(keys[k], kGradient);
    val[k].assign(keys[k], 0.0f);
    absl::Status s = (*client)->Init(k, DataType::kF32, val[k].data(), keys[k]);
    if (!s.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", o.rank, std::string(s.message()).c_str());
      return 1;
    }
  }
  double start = 0;
  for (int it = 0; it < o.iters + 1; ++it) {
    if (it == 1) start = Seconds();  // the first round warms up
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
  }
  const double ms = (Seconds() - start) * 1e3 / o.iters;
  const double expected =
      ExpectedNesterovWeight(BenchRule(o.nworkers), kGradient, o.nworkers, o.iters + 1);
  uint64_t wrong = 0;
  for (const auto& v : val) {
    for (float x : v) wrong += !(std::fabs(x - expected) <= 1e-6 + 1e-4 * std::fabs(expected));
  }
  std::printf("{\"iteration_ms\": %.6f, \"wrong\": %llu}\n", ms,
              static_cast<unsigned long long>(wrong));
  return 0;
}

// Starts `ranks` copies of argv and returns the largest number the ranks print under `field`
// (the slowest rank's; the allreduce workers print it on rank 0 only). A run whose ranks report
// wrong elements (`wrong` > 0) fails.
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
  uint64_t wrong = 0;
  lo.on_line = [&](pt::Launcher&, int rank, pt::Stream stream, std::string_view text) {
    const std::string line(text);
    if (stream == pt::Stream::kStdout && !line.empty() && line[0] == '{') {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains(field) && j[field].is_number()) {
        value = std::max(value, j[field].get<double>());
        if (j.contains("wrong") && j["wrong"].is_number()) wrong += j["wrong"].get<uint64_t>();
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
  if (value < 0) return absl::InternalError(absl::StrCat("no rank printed ", field));
  if (wrong > 0) return absl::InternalError(absl::StrCat(wrong, " wrong elements"));
  return value;
}

// One PushPull run: a service here (2 cores) and np worker processes; the slowest worker's mean
// time per round, in ms.
absl::StatusOr<double> RunParameterServer(const Options& o, plexus::transport::Backend backend,
                                          const std::string& transport, int np) {
  pa::ServiceOptions so;
  so.backend = backend;
  so.cores = 2;
  so.memory_budget_bytes = size_t{4} << 30;
  so.tcp = TcpSettings(o);
  PLEXUS_ASSIGN_OR_RETURN(auto service, pa::Service::Create(so));
  pa::NamespaceOptions no;
  no.name = "bench";
  no.workers = np;
  no.optimizer = BenchRule(np);
  PLEXUS_ASSIGN_OR_RETURN(auto ns, service->CreateNamespace(no));
  const std::string addrs = absl::StrJoin(service->addresses(), ",");
  return LaunchAndRead({}, np, false, "iteration_ms", o.timeout_s, [&](int rank) {
    return std::vector<std::string>{pt::SelfPath(kProgram),
                                    "--worker",
                                    "--rank",
                                    std::to_string(rank),
                                    "--nworkers",
                                    std::to_string(np),
                                    "--addresses",
                                    addrs,
                                    "--ns",
                                    std::to_string(ns.id),
                                    "--nonce",
                                    std::to_string(ns.nonce),
                                    "--transport",
                                    transport,
                                    "--loopback-cc",
                                    o.loopback_cc,
                                    "--scale",
                                    fmt::format("{}", o.scale),
                                    "--iters",
                                    std::to_string(o.iters)};
  });
}

// PushPull through the parameter server against Plexus's and Gloo's ring allreduce of the same
// bytes. Like with like: every side runs under the same loopback congestion control, reports
// the slowest rank's mean time per round over the same --iters rounds after one warm-up, checks
// its values (a run with a wrong one fails), and the sides launch in a balanced order, run after
// run. A failed run enters no median; the figure then says how many runs were dropped, and the
// result is false.
bool RunPushPull(const Options& o, pt::FigureWriter& out) {
  const auto keys = ResNet50Keys(o.scale);
  size_t total = 0;
  for (size_t k : keys) total += k;
  const std::string dir = pt::SelfPath(kProgram).substr(0, pt::SelfPath(kProgram).rfind('/'));
  const std::string coll = dir + "/plexus-bench-collectives";
  const std::string gloo = dir + "/plexus-bench-collectives-gloo";
  bool all_ok = true;
  for (const std::string& transport : o.transports) {
    auto backend = Backend(transport);
    if (!backend.ok()) continue;
    for (int np : o.nprocs) {
      const std::string bytes = std::to_string(total * 4);
      auto allreduce = [&](const std::vector<std::string>& argv) -> absl::StatusOr<double> {
        PLEXUS_ASSIGN_OR_RETURN(double us, LaunchAndRead(argv, np, true, "time_us", o.timeout_s));
        return us / 1e3;
      };
      struct Side {
        std::string impl;
        std::function<absl::StatusOr<double>()> run;
        std::vector<double> ms;
        int dropped = 0;
        std::string error;
      };
      std::vector<Side> sides;
      auto add = [&](std::string impl, std::function<absl::StatusOr<double>()> run) {
        sides.push_back(Side{std::move(impl), std::move(run), {}, 0, {}});
      };
      add("ps_pushpull", [&] { return RunParameterServer(o, *backend, transport, np); });
      add("plexus_ring_allreduce", [&] {
        return allreduce({coll, "--worker", "--sizes", bytes, "--transport", transport,
                          "--algorithm", "ring", "--loopback-cc", o.loopback_cc, "--iters",
                          std::to_string(o.iters), "--warmup", "1"});
      });
      // Gloo runs over tcp only; under the system's congestion control, which --loopback-cc
      // gives the Plexus sides by default.
      if (transport == "tcp" && access(gloo.c_str(), X_OK) == 0) {
        add("gloo_ring_allreduce", [&] {
          return allreduce({gloo, "--algorithm", "ring", "--sizes", bytes, "--transport", "tcp",
                            "--iters", std::to_string(o.iters), "--warmup", "1"});
        });
      }
      for (int r = 0; r < o.runs; ++r) {
        for (size_t i : plexus::bench::BalancedOrder(sides.size(), static_cast<size_t>(r))) {
          auto ms = sides[i].run();
          if (ms.ok()) {
            sides[i].ms.push_back(*ms);
          } else {
            ++sides[i].dropped;
            all_ok = false;
            sides[i].error = std::string(ms.status().message());
            std::fprintf(stderr, "%s: %s np %d %s run %d: %s\n", kProgram, sides[i].impl.c_str(),
                         np, transport.c_str(), r, sides[i].error.c_str());
          }
        }
      }
      std::vector<double> medians;
      for (const Side& side : sides) {
        pt::Figure f;
        f.figure = absl::StrCat(side.impl, "_iteration_ms");
        f.unit = "ms";
        f.value = side.ms.empty() ? NAN : Median(side.ms);
        f.extra = {{"np", np},
                   {"transport", transport},
                   {"model_mb", total * 4 / 1e6},
                   {"keys", keys.size()},
                   {"runs", side.ms.size()},
                   {"iters", o.iters},
                   {"loopback_cc", o.loopback_cc}};
        if (side.dropped > 0) {
          f.extra["dropped_runs"] = side.dropped;
          f.extra["error"] = side.error;
        }
        out.Add(f);
        medians.push_back(f.value);
      }
      for (size_t i = 1; i < sides.size(); ++i) {
        pt::Figure ratio;
        ratio.figure = i == 1 ? "ps_over_ring_time" : "ps_over_gloo_time";
        ratio.value = medians[0] / medians[i];
        ratio.unit = "ratio";
        ratio.extra = {{"np", np}, {"transport", transport}};
        out.Add(ratio);
      }
    }
  }
  return all_ok;
}

// ---- table 4.1 ----------------------------------------------------------------------------

// One figure per row and column: the count, with the seed's formula and value beside it (no
// target: where a count differs from the seed's "~" formula, the row's note says why).
void RunTable41(const Options& o, pt::FigureWriter& out) {
  auto rows = pa::ReproduceTable41(o.table_n, o.table_c, 1.0);
  if (!rows.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(rows.status().message()).c_str());
    return;
  }
  if (!out.json()) std::printf("%s\n", pa::FormatTable41(*rows, o.table_n, o.table_c, 1.0).c_str());
  for (const auto& r : *rows) {
    if (!r.available) continue;
    std::string slug;
    for (char ch : r.name) {
      if (std::isalnum(static_cast<unsigned char>(ch))) {
        slug += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      } else if (!slug.empty() && slug.back() != '_') {
        slug += '_';
      }
    }
    while (!slug.empty() && slug.back() == '_') slug.pop_back();
    const struct {
      const char* column;
      const std::string& formula;
      double seed, counted;
      const char* unit;
    } cols[] = {{"rounds", r.rounds_formula, r.seed_rounds, static_cast<double>(r.measured.rounds),
                 "count"},
                {"wire_bytes", r.bytes_formula, r.seed_bytes, r.measured.wire_bytes, "S"},
                {"cross_rack_bytes", r.cross_rack_formula, r.seed_cross_rack_bytes,
                 r.measured.cross_rack_bytes, "S"}};
    for (const auto& col : cols) {
      pt::Figure f;
      f.figure = absl::StrCat("table41_", slug, "_", col.column);
      f.value = col.counted;
      f.unit = col.unit;
      f.extra = {{"N", o.table_n},
                 {"C", o.table_c},
                 {"seed_formula", col.formula},
                 {"seed_value", col.seed},
                 {"equals_seed", std::fabs(col.counted - col.seed) < 1e-9}};
      if (col.column == std::string_view("wire_bytes") &&
          r.measured.logical_bytes != r.measured.wire_bytes) {
        f.extra["logical_bytes"] = r.measured.logical_bytes;  // the tree's count of every edge
      }
      out.Add(f);
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
  app.add_option("--mode", o.mode, "all, kernels, engines, pushpull or table41")
      ->check(CLI::IsMember({"all", "kernels", "engines", "pushpull", "table41"}));
  app.add_flag("--pin", o.pin, "kernels: pin thread i to the i-th usable CPU");
  pt::AddNumber(&app, "--kernel-mib", &o.kernel_mib, "MiB per kernel array", size_t{1},
                size_t{4096});
  pt::AddNumber(&app, "--scale", &o.scale, "scale of ResNet-50's key sizes", 0.0001, 4.0);
  pt::AddNumber(&app, "--workers", &o.workers, "workers of the engine comparison", 1, 64);
  pt::AddNumber(&app, "--iters", &o.iters, "PushPull rounds per run", 1, 1000);
  app.add_option("--nprocs", o.nprocs, "worker processes of the PushPull comparison");
  app.add_option("--transports", o.transports, "tcp and/or shm");
  pt::AddNumber(&app, "--timeout", &o.timeout_s, "seconds per launched job", 1.0, 86400.0);
  app.add_option("--loopback-cc", o.loopback_cc,
                 "pushpull: the tcp congestion control of the Plexus sides' loopback connections "
                 "(default system: the system's, as Gloo's; reno is the library default)")
      ->capture_default_str();
  pt::AddNumber(&app, "--table-n", &o.table_n, "Table 4.1: nodes per rack (N)", 1, 64);
  pt::AddNumber(&app, "--table-c", &o.table_c, "Table 4.1: racks (C)", 2, 64);
  auto* w = app.add_flag("--worker", o.worker, "internal: one PushPull worker")->group("");
  app.add_option("--rank", o.rank)->group("")->needs(w);
  app.add_option("--nworkers", o.nworkers)->group("")->needs(w);
  app.add_option("--addresses", o.addresses)->group("")->needs(w);
  app.add_option("--ns", o.ns)->group("")->needs(w);
  app.add_option("--nonce", o.nonce)->group("")->needs(w);
  app.add_option("--transport", o.transport)->group("")->needs(w);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (o.worker) return WorkerMain(o);

  pt::FigureWriter out("aggregation", o.json);
  if (o.mode == "all" || o.mode == "kernels") RunKernels(o, out);
  if (o.mode == "all" || o.mode == "engines") RunEngines(o, out);
  bool ok = true;
  if ((o.mode == "all" && o.compare) || o.mode == "pushpull") ok = RunPushPull(o, out);
  if (o.mode == "all" || o.mode == "table41") RunTable41(o, out);
  if (!o.json) out.PrintTable();
  return ok ? 0 : 1;
}
