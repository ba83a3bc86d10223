#include "device_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench_pipelines.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/restructure/device.hpp"
#include "plexus/restructure/executor.hpp"

namespace plexus::bench::restructure {
namespace {

namespace pr = plexus::restructure;
namespace cuda = plexus::base::cuda;
namespace pt = plexus::tooling;

constexpr char kWho[] = "plexus-bench-restructure --only device";

struct Pinned {
  void* p = nullptr;
  ~Pinned() { cuda::FreePinned(p); }
};

// Output elements that differ from the CPU executor's beyond the documented bounds.
size_t Wrong(const std::vector<uint8_t>& want, const uint8_t* got, size_t element, bool exact) {
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); i += element) {
    if (std::memcmp(want.data() + i, got + i, element) == 0) continue;
    if (exact) {
      ++wrong;
      continue;
    }
    int64_t a = 0, b = 0;
    std::memcpy(&a, want.data() + i, element);
    std::memcpy(&b, got + i, element);
    wrong += std::llabs(a - b) > (element == 4 ? 2 * pr::kDeviceLog10MaxUlp : 1);
  }
  return wrong;
}

}  // namespace

int RunDevice(const DeviceArgs& a, pt::FigureWriter& out) {
  std::string why;
  if (!pr::DeviceAvailable(&why)) {
    std::fprintf(stderr, "%s: skipped: %s\n", kWho, why.c_str());
    return 77;
  }
  // The torch-on-GPU stage times (ms), by (peer, stage).
  bool peers_ok = true;
  const auto torch_ms = a.compare ? PythonPeerTimes(kWho, a.python, a.runs, a.shape_scale,
                                                    {"--device", "cuda"}, &peers_ok)
                                  : std::map<std::pair<std::string, std::string>, double>();
  int status = 0;
  for (PipelineProgram& p : PipelinePrograms(a.shape_scale, a.compare)) {
    auto fail = [&](const absl::Status& s) {
      std::fprintf(stderr, "%s: %s: %s\n", kWho, p.name.c_str(), s.ToString().c_str());
      status = 1;
    };
    if (!p.program.ok()) {
      fail(p.program.status());
      continue;
    }
    auto host = pr::Executor::Compile(*p.program);
    auto device = pr::DeviceExecutor::Compile(*p.program);
    if (!host.ok() || !device.ok()) {
      fail(host.ok() ? device.status() : host.status());
      continue;
    }
    // Inputs on the host and the device; the output's reference from the CPU executor.
    std::mt19937 rng(1);
    std::vector<std::vector<uint8_t>> inputs;
    std::vector<cuda::DeviceBuffer> dev_inputs;
    std::vector<pr::ConstBytes> in, dev_in;
    size_t out_bytes = 0, element = 0, in_bytes = 0;
    bool ok = true;
    for (const pr::BufferDecl& b : p.program->buffers) {
      if (b.role == pr::Role::kOutput) {
        element = kernels::DataTypeSize(b.dtype);
        out_bytes = static_cast<size_t>(b.count) * element;
      }
      if (b.role != pr::Role::kInput) continue;
      inputs.push_back(RandomInput(b, rng));
      auto d = cuda::DeviceBuffer::Allocate(inputs.back().size());
      if (!d.ok()) {
        fail(d.status());
        ok = false;
        break;
      }
      if (absl::Status s =
              cuda::Copy(d->data(), inputs.back().data(), inputs.back().size(), "bench input");
          !s.ok()) {
        fail(s);
        ok = false;
        break;
      }
      in.emplace_back(inputs.back().data(), inputs.back().size());
      dev_in.emplace_back(static_cast<const uint8_t*>(d->data()), inputs.back().size());
      in_bytes += inputs.back().size();
      dev_inputs.push_back(std::move(*d));
    }
    if (!ok) continue;
    std::vector<uint8_t> reference(out_bytes);
    const pr::MutableBytes ref_span(reference.data(), reference.size());
    if (absl::Status s = host->Run(in, {&ref_span, 1}); !s.ok()) {
      fail(s);
      continue;
    }
    auto dev_out = cuda::DeviceBuffer::Allocate(out_bytes);
    auto pinned = cuda::AllocPinned(out_bytes);
    if (!dev_out.ok() || !pinned.ok()) {
      fail(dev_out.ok() ? pinned.status() : dev_out.status());
      continue;
    }
    Pinned keep{*pinned};
    const pr::MutableBytes to_host(static_cast<uint8_t*>(keep.p), out_bytes);
    const pr::MutableBytes to_device(static_cast<uint8_t*>(dev_out->data()), out_bytes);
    std::vector<double> fused, staged, alone;
    for (int r = 0; r <= a.runs && ok; ++r) {  // run 0 warms up (module load, first touch)
      for (int k = 0; k < 3 && ok; ++k) {
        const int w = (k + r) % 3;
        const double t0 = Now();
        absl::Status s;
        if (w == 0) {
          s = device->Run(dev_in, {&to_host, 1});
        } else {
          s = device->Run(dev_in, {&to_device, 1});
          if (s.ok() && w == 1) s = cuda::Copy(keep.p, dev_out->data(), out_bytes, "staging");
        }
        const double ms = (Now() - t0) * 1e3;
        if (!s.ok()) {
          fail(s);
          ok = false;
          break;
        }
        if (r == 0) continue;
        (w == 0 ? fused : w == 1 ? staged : alone).push_back(ms);
      }
    }
    if (!ok) continue;
    if (absl::Status s = device->Run(dev_in, {&to_host, 1}); !s.ok()) {
      fail(s);
      continue;
    }
    const size_t wrong = Wrong(reference, to_host.data(), element, p.exact);
    const nlohmann::json extra = {{"program", p.name},
                                  {"input_bytes", in_bytes},
                                  {"output_bytes", out_bytes},
                                  {"runs", a.runs}};
    auto add = [&](std::string figure, double value, std::string unit, nlohmann::json target,
                   std::optional<bool> met, nlohmann::json more = nlohmann::json::object()) {
      pt::Figure f;
      f.figure = std::move(figure);
      f.value = value;
      f.unit = std::move(unit);
      f.target = std::move(target);
      f.met = met;
      f.extra = extra;
      f.extra.update(more);
      out.Add(f);
    };
    const double fused_ms = Median(fused), staged_ms = Median(staged);
    add("device_fused_ms", fused_ms, "ms", nullptr, std::nullopt);
    add("device_staged_ms", staged_ms, "ms", nullptr, std::nullopt);
    add("device_kernels_ms", Median(alone), "ms", nullptr, std::nullopt);
    add("device_fused_speedup_vs_staged", staged_ms / fused_ms, "ratio", nullptr, std::nullopt);
    add("device_wrong_elements", static_cast<double>(wrong), "count", 0, wrong == 0);
    if (auto it = torch_ms.find({"torch_cuda", p.name}); it != torch_ms.end()) {
      add("device_speedup_vs_torch_cuda", it->second / fused_ms, "ratio",
          "faster than torch ops on the GPU followed by .cpu()", it->second > fused_ms,
          {{"peer_ms", it->second}});
    }
    if (wrong > 0) {
      std::fprintf(stderr, "%s: %s: %zu output elements differ from the CPU executor's\n", kWho,
                   p.name.c_str(), wrong);
      status = 1;
    }
  }
  return status;
}

}  // namespace plexus::bench::restructure
