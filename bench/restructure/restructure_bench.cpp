// plexus-bench-restructure: the restructuring engine's fast executor, one thread, against the
// bandwidth of memcpy moving as many bytes, against the reference interpreter, and (--compare)
// against the same stages written as numpy and torch CPU operations (python_peers.py).
//
//   ops        element-wise and cast chains, pooling, concat, flatten and transposes
//   pipelines  the five restructuring stages of Fianchetto's Table 3.1 at the table's shapes
//   motion     those stages fused with a send to another process (tcp, shm), against copying,
//              restructuring, then sending (motion_bench.hpp)
//   device     those stages on a CUDA device into page-locked host memory, against staging and
//              (--compare) torch on the GPU (device_bench.hpp)
//
// A program's bandwidth counts the bytes it reads and writes once (inputs + outputs); memcpy's
// counts both directions too, copying half that many bytes, so the ratio compares passes over
// memory. Every figure is the median of --runs runs, the systems alternating run by run; every
// fast-path output is checked against the interpreter's once per program (bit for bit, or
// within the documented bounds where Pow and Log10 run).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench_pipelines.hpp"
#include "device_bench.hpp"
#include "motion_bench.hpp"
#include "nlohmann/json.hpp"
#include "plexus/restructure/builder.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace pt = plexus::tooling;
namespace pbr = plexus::bench::restructure;
using plexus::kernels::DataType;

namespace {

constexpr char kProgram[] = "plexus-bench-restructure";

struct Args {
  bool json = false;
  bool compare = false;
  int runs = 5;
  std::string only = "all";
  double scale = 1.0;                        // of the ops' sizes
  double shape_scale = 1.0;                  // of the pipelines' outermost dimension
  std::string transport;                     // motion: "tcp", "shm" or "" (both)
  bool pin = true;                           // motion: sender and receiver on CPUs of their own
  std::string python = pbr::kDefaultPython;  // --compare: runs python_peers.py
};

// A program with its inputs filled and its outputs allocated.
struct Case {
  std::string name;
  std::string kind;  // what the target is: "elementwise", "layout" (pool/concat/flatten),
                     // "transpose", "pipeline"
  pr::Program program;
  std::vector<std::vector<uint8_t>> inputs, outputs, reference;
  size_t bytes = 0;   // inputs + outputs
  bool exact = true;  // false: Pow/Log10 run; the check allows their bounds
};

Case Make(std::string name, std::string kind, absl::StatusOr<pr::Program> p, bool exact = true) {
  if (!p.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", kProgram, name.c_str(), p.status().ToString().c_str());
    std::exit(1);
  }
  Case c{std::move(name), std::move(kind), *std::move(p), {}, {}, {}, 0, exact};
  std::mt19937 rng(1);
  for (const pr::BufferDecl& b : c.program.buffers) {
    const size_t bytes = static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype);
    if (b.role == pr::Role::kScratch) continue;
    c.bytes += bytes;
    if (b.role == pr::Role::kOutput) {
      c.outputs.emplace_back(bytes, 0);
      c.reference.emplace_back(bytes, 0);
      continue;
    }
    c.inputs.push_back(pbr::RandomInput(b, rng));
  }
  return c;
}

std::vector<pr::ConstBytes> In(const Case& c) {
  std::vector<pr::ConstBytes> in;
  for (const auto& v : c.inputs) in.emplace_back(v.data(), v.size());
  return in;
}
std::vector<pr::MutableBytes> Out(std::vector<std::vector<uint8_t>>& v) {
  std::vector<pr::MutableBytes> out;
  for (auto& x : v) out.emplace_back(x.data(), x.size());
  return out;
}

// Elements of the fast path's outputs that differ from the interpreter's (beyond one unit of the
// output type where Pow/Log10 run).
size_t Wrong(const Case& c) {
  size_t wrong = 0;
  size_t k = 0;
  for (const pr::BufferDecl& b : c.program.buffers) {
    if (b.role != pr::Role::kOutput) continue;
    const size_t size = plexus::kernels::DataTypeSize(b.dtype);
    const auto& r = c.reference[k];
    const auto& f = c.outputs[k];
    for (size_t i = 0; i < r.size(); i += size) {
      if (std::memcmp(r.data() + i, f.data() + i, size) == 0) continue;
      if (c.exact) {
        ++wrong;
        continue;
      }
      int64_t a = 0, b2 = 0;
      std::memcpy(&a, r.data() + i, size);
      std::memcpy(&b2, f.data() + i, size);
      wrong += std::llabs(a - b2) > (size == 4 ? 2 * pr::kLog10MaxUlp : 1);
    }
    ++k;
  }
  return wrong;
}

std::vector<Case> OpCases(double scale) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(16e6 * scale));  // 64 MB of f32
  std::vector<Case> cases;
  {
    pr::ProgramBuilder b;  // y = f16(x * 0.5 + 1): the element-wise chain of a normalisation
    auto x = b.Input("x", DataType::kF32, n);
    auto t = b.Scratch("t", DataType::kF32, n);
    auto y = b.Output("y", DataType::kF16, n);
    b.Mul(t, x, 0.5f);
    b.Add(t, t, 1.0f);
    b.Cast(y, t);
    cases.push_back(Make("chain_mul_add_cast_f16", "elementwise", b.Build()));
  }
  {
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, n);
    auto y = b.Output("y", DataType::kBF16, n);
    b.Cast(y, x);
    cases.push_back(Make("cast_f32_bf16", "elementwise", b.Build()));
  }
  {
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kU8, n);
    auto y = b.Output("y", DataType::kF32, n);
    b.Mul(y, x, 1.0f / 255);
    cases.push_back(Make("scale_u8_f32", "elementwise", b.Build()));
  }
  {
    const int64_t side =
        std::max<int64_t>(4, static_cast<int64_t>(std::sqrt(n / 3.0)) & ~int64_t{1});
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, side * side * 3);
    pr::Pool2D s{side, side, 3, 2, 2, 2, 2};
    auto y = b.Output("y", DataType::kF32, s.out_h() * s.out_w() * 3);
    b.MaxPool2D(y, x, s);
    cases.push_back(Make("maxpool_2x2_f32", "layout", b.Build()));
  }
  {
    pr::ProgramBuilder b;
    std::vector<pr::BufferRef> parts;
    for (int i = 0; i < 4; ++i)
      parts.push_back(b.Input(absl::StrCat("p", i), DataType::kF32, n / 4));
    auto y = b.Output("y", DataType::kF32, n / 4 * 4);
    b.Concat(y, parts);
    cases.push_back(Make("concat_4_f32", "layout", b.Build()));
  }
  {
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, n);
    auto y = b.Output("y", DataType::kF32, n);
    b.Flatten(y, x);
    cases.push_back(Make("flatten_f32", "layout", b.Build()));
  }
  {
    const int64_t side =
        std::max<int64_t>(8, static_cast<int64_t>(std::sqrt(static_cast<double>(n))));
    pr::ProgramBuilder b;
    auto x = b.Input("x", DataType::kF32, side * side);
    auto y = b.Output("y", DataType::kF32, side * side);
    b.Transpose2D(y, x, side, side);
    cases.push_back(Make("transpose_f32", "transpose", b.Build()));
  }
  return cases;
}

std::vector<Case> PipelineCases(double shape_scale, bool f16_brain) {
  std::vector<Case> cases;
  for (pbr::PipelineProgram& p : pbr::PipelinePrograms(shape_scale, f16_brain)) {
    cases.push_back(Make(p.name, "pipeline", std::move(p.program), p.exact));
  }
  return cases;
}

// Times the fast path, memcpy of as many bytes and (fewer runs: it is slow) the interpreter,
// alternating; checks the fast path against the interpreter. Returns false on a wrong output.
bool Measure(Case& c, const Args& a, pt::FigureWriter& out, std::vector<double>* fast_ms) {
  auto exec = pr::Executor::Compile(c.program);
  if (!exec.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", kProgram, c.name.c_str(),
                 exec.status().ToString().c_str());
    return false;
  }
  const auto in = In(c);
  auto ref_out = Out(c.reference);
  auto fast_out = Out(c.outputs);
  std::vector<uint8_t> src(c.bytes / 2, 1), dst(c.bytes / 2, 2);
  std::vector<double> fast, copy, interp;
  const int interp_runs = std::min(a.runs, 3);
  for (int r = 0; r < a.runs; ++r) {
    for (int which = 0; which < 3; ++which) {
      const int w = (which + r) % 3;  // rotating order
      const double t0 = pbr::Now();
      if (w == 0) {
        if (absl::Status s = exec->Run(in, fast_out); !s.ok()) {
          std::fprintf(stderr, "%s: %s: %s\n", kProgram, c.name.c_str(), s.ToString().c_str());
          return false;
        }
        fast.push_back((pbr::Now() - t0) * 1e3);
      } else if (w == 1) {
        std::memcpy(dst.data(), src.data(), src.size());
        copy.push_back((pbr::Now() - t0) * 1e3);
      } else if (r < interp_runs) {
        (void)pr::Interpret(c.program, in, ref_out);
        interp.push_back((pbr::Now() - t0) * 1e3);
      }
    }
  }
  const size_t wrong = Wrong(c);
  const double ms = pbr::Median(fast), copy_ms = pbr::Median(copy), interp_ms = pbr::Median(interp);
  // Against numpy and torch, which time each stage back to back (caches warm with its own
  // buffers), the fast path runs the same way: --runs calls in a row.
  std::vector<double> warm;
  for (int r = 0; r < a.runs; ++r) {
    const double t0 = pbr::Now();
    (void)exec->Run(in, fast_out);
    warm.push_back((pbr::Now() - t0) * 1e3);
  }
  fast_ms->push_back(pbr::Median(warm));
  auto add = [&](std::string figure, double value, std::string unit, std::optional<double> target) {
    pt::Figure f;
    f.figure = std::move(figure);
    f.value = value;
    f.unit = std::move(unit);
    if (target) {
      f.target = *target;
      f.met = value >= *target;
    }
    f.extra = {{"program", c.name}, {"bytes", c.bytes}, {"runs", a.runs}, {"threads", 1}};
    out.Add(f);
  };
  const double memcpy_target = c.kind == "elementwise" ? 0.8
                               : c.kind == "layout"    ? 0.6
                               : c.kind == "transpose" ? 0.5
                                                       : -1;
  add("fast_ms", ms, "ms", std::nullopt);
  add("fast_gbps", static_cast<double>(c.bytes) / (ms * 1e-3) / 1e9, "GB/s", std::nullopt);
  add("fast_vs_memcpy", copy_ms / ms, "ratio",
      memcpy_target > 0 ? std::optional<double>(memcpy_target) : std::nullopt);
  add("fast_vs_interpreter", interp_ms / ms, "ratio", 5.0);
  add("wrong_elements", static_cast<double>(wrong), "count", std::nullopt);
  if (wrong > 0) {
    std::fprintf(stderr, "%s: %s: %zu output elements differ from the interpreter's\n", kProgram,
                 c.name.c_str(), wrong);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  pt::Tool tool(kProgram,
                "The restructuring engine's fast executor against memcpy, the interpreter and "
                "(--compare) numpy and torch on the CPU, one thread.");
  CLI::App& app = tool.app();
  pt::AddJsonFlag(&app, &a.json);
  app.add_flag("--compare", a.compare, "also numpy and torch (python3) for the pipelines");
  app.add_option("--python", a.python,
                 "the interpreter that runs the numpy and torch peers (--compare): one that "
                 "imports numpy and torch (with --only device, a torch with CUDA)")
      ->capture_default_str();
  pt::AddNumber(&app, "--runs", &a.runs, "runs per figure (median)", 1, 1000);
  app.add_option("--only", a.only,
                 "ops, pipelines, all (ops and pipelines) or motion (the pipelines fused with a "
                 "send between two processes, against copy-restructure-send) or device (on a CUDA "
                 "device into page-locked host memory; --compare: also torch on the GPU)")
      ->check(CLI::IsMember({"ops", "pipelines", "all", "motion", "device"}));
  pt::AddNumber(&app, "--scale", &a.scale, "of the ops' size (1: 16 M elements)", 1e-4, 16.0);
  pt::AddNumber(&app, "--shape-scale", &a.shape_scale,
                "of the pipelines' outermost dimension (1: the table's shapes)", 1e-4, 1.0);
  app.add_option("--transport", a.transport, "motion: tcp or shm (default both)")
      ->check(CLI::IsMember({"tcp", "shm"}));
  app.add_flag("--pin,!--no-pin", a.pin, "motion: sender on CPU 0, receiver on CPU 1 (default)");
  if (auto code = tool.Parse(argc, argv)) return *code;
  pt::FigureWriter out("restructure", a.json);
  bool ok = true;
  std::vector<double> ignored;
  if (a.only == "device") {
    const int code = pbr::RunDevice({a.runs, a.shape_scale, a.compare, a.python}, out);
    if (!a.json && code != 77) out.PrintTable();
    return code;
  }
  if (a.only == "motion") {
    ok = pbr::RunMotion({a.runs, a.shape_scale, a.transport, a.pin}, out);
    if (!a.json) out.PrintTable();
    return ok ? 0 : 1;
  }
  if (a.only != "pipelines") {
    for (Case& c : OpCases(a.scale)) ok = Measure(c, a, out, &ignored) && ok;
  }
  if (a.only != "ops") {
    std::vector<Case> cases = PipelineCases(a.shape_scale, a.compare);
    std::vector<double> ms;
    for (Case& c : cases) ok = Measure(c, a, out, &ms) && ok;
    if (a.compare) {
      bool peers_ok = false;
      const auto peer_ms =
          pbr::PythonPeerTimes(kProgram, a.python, a.runs, a.shape_scale, {}, &peers_ok);
      ok = peers_ok && ok;
      for (size_t i = 0; i < cases.size(); ++i) {
        for (const char* peer : {"numpy", "torch"}) {
          auto it = peer_ms.find({peer, cases[i].name});
          if (it == peer_ms.end()) continue;
          pt::Figure f;
          f.figure = absl::StrCat("speedup_vs_", peer);
          f.value = it->second / ms[i];
          f.unit = "ratio";
          f.target = 2.0;
          f.met = f.value >= 2.0;
          f.extra = {{"program", cases[i].name},
                     {"peer_ms", it->second},
                     {"fast_ms_back_to_back", ms[i]},
                     {"runs", a.runs},
                     {"threads", 1}};
          out.Add(f);
        }
      }
    }
  }
  if (!a.json) out.PrintTable();
  return ok ? 0 : 1;
}
