// plexus-drx: the data-restructuring engine from the command line.
//   run        a named pipeline (Fianchetto's Table 3.1) or a program file on generated data:
//              the fast executor's time and passes (or, --device, the CUDA executor's time),
//              checked against the interpreter
//   export     a named pipeline's program to a file (the binary format of format.hpp)
//   placement  Fianchetto's placement study on netmodel's DRX model, next to the seed's figures
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "drx_placement.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/base/file.hpp"
#include "plexus/restructure/device.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/format.hpp"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/pipelines.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"

namespace pr = plexus::restructure;
namespace pp = plexus::restructure::pipelines;
namespace tooling = plexus::tooling;

namespace {

absl::StatusOr<pr::Program> Named(const std::string& name) {
  if (name == "video-surveillance") return pp::VideoSurveillance();
  if (name == "sound-detection") return pp::SoundDetection();
  if (name == "brain-stimulation") return pp::BrainStimulation();
  if (name == "pii-redaction") return pp::PiiRedaction();
  if (name == "db-hash-join") return pp::DbHashJoin();
  return absl::InvalidArgumentError("unknown pipeline '" + name +
                                    "' (video-surveillance, sound-detection, brain-stimulation, "
                                    "pii-redaction, db-hash-join)");
}

struct RunArgs {
  std::string pipeline, program_file;
  int runs = 5;
  bool json = false;
  bool device = false;
  uint32_t seed = 1;
};

// Exit status of `run --device` where no device is usable (the tests' skip code).
constexpr int kExitNoDevice = 77;

// Runs `p` --runs times on the CUDA device with the inputs and outputs in device memory; the
// outputs copied back into `out`. The median time of a run (launches and synchronisation).
absl::StatusOr<double> RunOnDevice(const pr::Program& p, int runs,
                                   const std::vector<std::vector<uint8_t>>& in,
                                   std::vector<std::vector<uint8_t>>& out) {
  namespace cuda = plexus::base::cuda;
  auto exec = pr::DeviceExecutor::Compile(p);
  if (!exec.ok()) return exec.status();
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<pr::ConstBytes> ins;
  std::vector<pr::MutableBytes> outs;
  for (const auto& v : in) {
    auto b = cuda::DeviceBuffer::Allocate(v.size());
    if (!b.ok()) return b.status();
    if (absl::Status s = cuda::Copy(b->data(), v.data(), v.size(), "an input"); !s.ok()) return s;
    ins.emplace_back(static_cast<const uint8_t*>(b->data()), v.size());
    buffers.push_back(std::move(*b));
  }
  for (const auto& v : out) {
    auto b = cuda::DeviceBuffer::Allocate(v.size());
    if (!b.ok()) return b.status();
    outs.emplace_back(static_cast<uint8_t*>(b->data()), v.size());
    buffers.push_back(std::move(*b));
  }
  std::vector<double> ms;
  for (int r = 0; r <= runs; ++r) {  // run 0 loads the kernels: not timed
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = exec->Run(ins, outs); !s.ok()) return s;
    if (r > 0) {
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (absl::Status s = cuda::Copy(out[k].data(), outs[k].data(), out[k].size(), "an output");
        !s.ok()) {
      return s;
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Run(const RunArgs& a, const tooling::Tool& tool) {
  absl::StatusOr<pr::Program> p;
  std::string name = a.pipeline;
  if (!a.program_file.empty()) {
    auto bytes = plexus::base::ReadFile(a.program_file);
    if (!bytes.ok()) return tool.Fail(bytes.status());
    // The binary form starts with its magic; anything else is read as the JSON form.
    const size_t first = bytes->find_first_not_of(" \t\r\n");
    p = first != std::string::npos && (*bytes)[first] == '{' ? pr::ProgramFromJson(*bytes)
                                                             : pr::Decode(*bytes);
    if (!p.ok())
      return tool.Fail(absl::Status(p.status().code(),
                                    a.program_file + ": " + std::string(p.status().message())));
    name = a.program_file;
  } else {
    p = Named(a.pipeline);
    if (!p.ok()) return tool.Fail(p.status());
  }
  auto exec = pr::Executor::Compile(*p);
  if (!exec.ok()) return tool.Fail(exec.status());
  std::string why;
  if (a.device && !pr::DeviceAvailable(&why)) {
    std::fprintf(stderr, "plexus-drx: run --device: %s\n", why.c_str());
    return kExitNoDevice;
  }
  // Inputs: positive values (log10 stays finite), small integers; outputs zeroed.
  std::mt19937 rng(a.seed);
  std::vector<std::vector<uint8_t>> in, fast, ref;
  size_t bytes = 0;
  for (const pr::BufferDecl& b : p->buffers) {
    const size_t n = static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype);
    if (b.role == pr::Role::kScratch) continue;
    bytes += n;
    if (b.role == pr::Role::kOutput) {
      fast.emplace_back(n, 0);
      ref.emplace_back(n, 0);
      continue;
    }
    std::vector<uint8_t> v(n);
    if (b.dtype == plexus::kernels::DataType::kF32) {
      std::uniform_real_distribution<float> d(0.001f, 4.0f);
      for (size_t i = 0; i < n / 4; ++i) {
        const float x = d(rng);
        std::memcpy(v.data() + 4 * i, &x, 4);
      }
    } else {
      for (auto& x : v) x = static_cast<uint8_t>(rng() & 0x3f);
    }
    in.push_back(std::move(v));
  }
  std::vector<pr::ConstBytes> ins(in.begin(), in.end());
  auto spans = [](std::vector<std::vector<uint8_t>>& v) {
    std::vector<pr::MutableBytes> s;
    for (auto& x : v) s.emplace_back(x.data(), x.size());
    return s;
  };
  std::vector<double> ms;
  if (a.device) {
    absl::StatusOr<double> t = RunOnDevice(*p, a.runs, in, fast);
    if (!t.ok()) return tool.Fail(t.status());
    ms.push_back(*t);
  }
  for (int r = 0; r < a.runs && !a.device; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = exec->Run(ins, spans(fast)); !s.ok()) return tool.Fail(s);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (absl::Status s = pr::Interpret(*p, ins, spans(ref)); !s.ok()) return tool.Fail(s);
  size_t differing = 0;
  for (size_t k = 0; k < ref.size(); ++k) {
    for (size_t i = 0; i < ref[k].size(); ++i) differing += ref[k][i] != fast[k][i];
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  tooling::FigureWriter out("drx_run", a.json);
  out.SetCommon({{"program", name},
                 {"runs", a.runs},
                 {"executor", a.device ? "cuda" : "cpu"},
                 {"threads", a.device ? 0 : 1}});
  const std::string prefix = a.device ? "device" : "fast";
  out.Add({prefix + "_ms", median, "ms", nullptr, std::nullopt, {}});
  out.Add({prefix + "_gbps",
           static_cast<double>(bytes) / (median * 1e-3) / 1e9,
           "GB/s",
           nullptr,
           std::nullopt,
           {{"bytes", bytes}}});
  out.Add({"passes", static_cast<double>(exec->passes()), "count", nullptr, std::nullopt, {}});
  // Bytes of the outputs that differ from the interpreter's: 0 unless Pow/Log10 run (their
  // documented bounds, the device's wider than the CPU's; `plexus-bench-restructure` checks them
  // per element).
  out.Add({"bytes_differing_from_interpreter",
           static_cast<double>(differing),
           "count",
           nullptr,
           std::nullopt,
           {}});
  if (!a.json) {
    if (!a.device) std::printf("%s\n\n", exec->Describe().c_str());
    out.PrintTable();
  }
  return tooling::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-drx",
                     "The data-restructuring engine: run pipelines and programs, export them, and "
                     "Fianchetto's placement model.");
  tool.app().require_subcommand(1);

  RunArgs run;
  CLI::App* run_cmd = tool.Subcommand(
      "run",
      "run a named pipeline or a program file on generated data, checked against the "
      "interpreter");
  run_cmd->add_option("pipeline", run.pipeline,
                      "video-surveillance, sound-detection, brain-stimulation, pii-redaction or "
                      "db-hash-join");
  run_cmd->add_option("--program", run.program_file,
                      "a program file (plexus-drx export): the binary form or the JSON form");
  tooling::AddNumber(run_cmd, "--runs", &run.runs, "timed runs (median)", 1, 10000);
  tooling::AddNumber(run_cmd, "--seed", &run.seed, "seed of the generated inputs", 0u, ~0u);
  tooling::AddJsonFlag(run_cmd, &run.json);
  run_cmd->add_flag("--device", run.device,
                    "run on the CUDA device (inputs and outputs in device memory); exit 77 with "
                    "the reason where none is usable");

  std::string export_name, export_out, export_format = "binary";
  CLI::App* export_cmd = tool.Subcommand("export", "write a named pipeline's program to a file");
  export_cmd->add_option("pipeline", export_name, "the pipeline")->required();
  export_cmd->add_option("-o,--output", export_out, "the file to write")->required();
  export_cmd
      ->add_option("--format", export_format,
                   "binary (what a peer decodes) or json (to read and edit; run takes both)")
      ->check(CLI::IsMember({"binary", "json"}))
      ->capture_default_str();

  plexus::drxtool::PlacementArgs placement;
  CLI::App* placement_cmd =
      tool.Subcommand("placement",
                      "Fianchetto's DRX placements (Multi-Axl, Integrated, Standalone, "
                      "Bump-in-the-Wire, PCIe-Integrated): speedups and restructuring shares at "
                      "1-15 applications, broadcast and all-reduce at 4-32 accelerators");
  placement_cmd->add_option("--apps", placement.apps, "concurrent applications")
      ->delimiter(',')
      ->capture_default_str();
  placement_cmd
      ->add_option("--accelerators", placement.accelerators,
                   "accelerators of the broadcast and all-reduce")
      ->delimiter(',')
      ->capture_default_str();
  auto& f = placement.fabric;
  tooling::AddNumber(placement_cmd, "--pcie-gen", &f.pcie_generation, "PCIe generation", 1, 7);
  tooling::AddNumber(placement_cmd, "--upstream-lanes", &f.upstream_lanes,
                     "lanes of each switch's upstream link", 1, 32);
  tooling::AddNumber(placement_cmd, "--accelerators-per-switch", &f.accelerators_per_switch,
                     "accelerators under one PCIe switch", 2, 256);
  tooling::AddNumber(placement_cmd, "--cpu-cores", &f.cpu_cores, "host cores", 1, 4096);
  double hop_ns = f.switch_hop_s * 1e9;
  tooling::AddNumber(placement_cmd, "--switch-hop-ns", &hop_ns, "PCIe switch port-to-port latency",
                     0.0, 1e6);
  tooling::AddJsonFlag(placement_cmd, &placement.json);

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (run_cmd->parsed()) {
    if (run.pipeline.empty() == run.program_file.empty()) {
      return tool.Usage("run: name a pipeline or give --program, not both");
    }
    return Run(run, tool);
  }
  if (export_cmd->parsed()) {
    auto p = Named(export_name);
    if (!p.ok()) return tool.Fail(p.status());
    const std::string body =
        export_format == "json" ? pr::ProgramToJson(*p) + "\n" : pr::Serialize(*p);
    if (absl::Status s = plexus::base::WriteFileAtomic(export_out, body); !s.ok()) {
      return tool.Fail(s);
    }
    return tooling::kExitOk;
  }
  f.switch_hop_s = hop_ns * 1e-9;
  return plexus::drxtool::RunPlacement(placement);
}
