#include "plexus/netmodel/drx_placement.hpp"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace plexus::netmodel {

std::string_view DrxPlacementName(DrxPlacement placement) {
  switch (placement) {
    case DrxPlacement::kMultiAxl:
      return "multi-axl";
    case DrxPlacement::kIntegrated:
      return "integrated";
    case DrxPlacement::kStandalone:
      return "standalone";
    case DrxPlacement::kBumpInTheWire:
      return "bump-in-the-wire";
    case DrxPlacement::kPcieIntegrated:
      return "pcie-integrated";
  }
  return "?";
}

double PcieBytesPerSecond(int generation, int lanes) {
  const double gt_per_s = 8e9 * std::pow(2.0, generation - 3);
  const double efficiency = generation >= 6 ? 242.0 / 256.0 : 128.0 / 130.0;
  return gt_per_s * efficiency * lanes / 8;
}

namespace {

absl::Status Validate(const DrxFabric& f, const DrxWorkload& w, int count, const char* what) {
  auto bad = [](const char* field, auto value, const char* want) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, ": ", want));
  };
  if (f.pcie_generation < 1 || f.pcie_generation > 7) {
    return bad("DrxFabric.pcie_generation", f.pcie_generation, "want 1..7");
  }
  for (auto [name, lanes] : {std::pair{"DrxFabric.accelerator_lanes", f.accelerator_lanes},
                             std::pair{"DrxFabric.upstream_lanes", f.upstream_lanes},
                             std::pair{"DrxFabric.standalone_lanes", f.standalone_lanes}}) {
    if (lanes < 1 || lanes > 32) return bad(name, lanes, "want 1..32 lanes");
  }
  if (f.accelerators_per_switch < 2) {
    return bad("DrxFabric.accelerators_per_switch", f.accelerators_per_switch, "want >= 2");
  }
  if (f.cpu_cores < 1) return bad("DrxFabric.cpu_cores", f.cpu_cores, "want >= 1");
  if (f.cpu_parallelism_per_app < 1) {
    return bad("DrxFabric.cpu_parallelism_per_app", f.cpu_parallelism_per_app, "want >= 1");
  }
  if (f.apps_per_standalone_card < 1) {
    return bad("DrxFabric.apps_per_standalone_card", f.apps_per_standalone_card, "want >= 1");
  }
  for (auto [name, v] : {std::pair{"DrxFabric.switch_hop_s", f.switch_hop_s},
                         std::pair{"DrxFabric.mux_hop_s", f.mux_hop_s},
                         std::pair{"DrxFabric.stage_overhead_s", f.stage_overhead_s}}) {
    if (!(v >= 0) || !std::isfinite(v)) return bad(name, v, "want a finite time >= 0");
  }
  for (auto [name, v] : {std::pair{"DrxFabric.cpu_memory_bytes_per_s", f.cpu_memory_bytes_per_s},
                         std::pair{"DrxFabric.cpu_copy_bytes_per_s", f.cpu_copy_bytes_per_s},
                         std::pair{"DrxFabric.drx_memory_bytes_per_s", f.drx_memory_bytes_per_s},
                         std::pair{"DrxFabric.integrated_drx_scale", f.integrated_drx_scale},
                         std::pair{"DrxWorkload.input_bytes", w.input_bytes},
                         std::pair{"DrxWorkload.output_bytes", w.output_bytes},
                         std::pair{"DrxWorkload.cpu_seconds_per_byte", w.cpu_seconds_per_byte}}) {
    if (!(v > 0) || !std::isfinite(v)) return bad(name, v, "want a finite value > 0");
  }
  for (auto [name, v] : {std::pair{"DrxWorkload.kernel1_s", w.kernel1_s},
                         std::pair{"DrxWorkload.kernel2_s", w.kernel2_s}}) {
    if (!(v >= 0) || !std::isfinite(v)) return bad(name, v, "want a finite time >= 0");
  }
  if (count < 1 || count > 4096) return bad(what, count, "want 1..4096");
  return absl::OkStatus();
}

// The host restructures `bytes` of input (producing `out` bytes) for one of `sharers`
// applications that restructure at once: each gets its share of the cores (at most the
// parallelism one application's restructuring has) and of the memory bandwidth.
double HostRestructure(const DrxFabric& f, const DrxWorkload& w, double bytes, double out,
                       int sharers) {
  const double cores =
      std::min<double>(f.cpu_parallelism_per_app, static_cast<double>(f.cpu_cores) / sharers);
  const double compute = bytes * w.cpu_seconds_per_byte / cores;
  const double memory = (bytes + out) / (f.cpu_memory_bytes_per_s / sharers);
  return std::max(compute, memory) + f.stage_overhead_s;
}

}  // namespace

std::vector<DrxWorkload> FianchettoWorkloads() {
  // Input shapes of Table 3.1; the restructuring's cost per core from its operations (the
  // transcendental ones, Pow and Log10, cost the most, layout copies the least); the share of
  // the one-application Multi-Axl latency restructuring takes (the seed's range, 57.7-73.2 %,
  // mean 66.8 %), which sets the kernels' time.
  struct Row {
    const char* name;
    double input_bytes, output_bytes, core_bytes_per_s, restructure_share;
  };
  const Row rows[] = {
      // u8 frame; x scale, 2x2 max-pool, reshape, cast to f16: a quarter of the pixels, 2 B each.
      {"video-surveillance", 960.0 * 540 * 3, 960.0 * 540 * 3 / 4 * 2, 0.3e9, 0.577},
      // f32 FFT bins; spectrogram (pow), mel (mul, add, div), log10, cast to f16.
      {"sound-detection", 8192.0 * 768 * 4, 8192.0 * 768 * 2, 0.1e9, 0.68},
      // f32 FFT bins; pow, div, mul, cast to f16.
      {"brain-stimulation", 256.0 * 1024 * 8 * 4, 256.0 * 1024 * 8 * 2, 0.2e9, 0.66},
      // u8 text blocks; concat, flatten.
      {"pii-redaction", 4.0 * 2048 * 768, 4.0 * 2048 * 768, 0.3e9, 0.69},
      // i32 decompressed columns; concat, reshape, cast to i64 keys.
      {"db-hash-join", 4.0 * 1024 * 512 * 4, 4.0 * 1024 * 512 * 8, 0.2e9, 0.732},
  };
  std::vector<DrxWorkload> out;
  const DrxFabric fabric;
  for (const Row& r : rows) {
    DrxWorkload w;
    w.name = r.name;
    w.input_bytes = r.input_bytes;
    w.output_bytes = r.output_bytes;
    w.cpu_seconds_per_byte = 1.0 / r.core_bytes_per_s;
    // Kernels with no time first, to read the motion's; then the kernels take what makes
    // restructuring `restructure_share` of the whole.
    auto base = DrxLatency(fabric, w, DrxPlacement::kMultiAxl, 1);
    const double total = base->restructuring_s / r.restructure_share;
    const double kernels = std::max(0.0, total - base->restructuring_s - base->movement_s);
    w.kernel1_s = kernels / 2;
    w.kernel2_s = kernels / 2;
    out.push_back(w);
  }
  return out;
}

absl::StatusOr<DrxBreakdown> DrxLatency(const DrxFabric& f, const DrxWorkload& w,
                                        DrxPlacement placement, int apps) {
  if (absl::Status s = Validate(f, w, apps, "apps"); !s.ok()) return s;
  const double link = PcieBytesPerSecond(f.pcie_generation, f.accelerator_lanes);
  const double upstream = PcieBytesPerSecond(f.pcie_generation, f.upstream_lanes);
  const double card_link = PcieBytesPerSecond(f.pcie_generation, f.standalone_lanes);
  // Applications fill switches in order: the first switch carries the most.
  const int per_switch = std::min(apps, f.accelerators_per_switch / 2);
  const double in = w.input_bytes, out = w.output_bytes;
  const double oh = f.stage_overhead_s, hop = f.switch_hop_s, mux = f.mux_hop_s;
  DrxBreakdown b;
  b.kernels_s = w.kernel1_s + w.kernel2_s;
  // A DMA through the root complex: the accelerator's link, the switch's upstream link shared by
  // the switch's applications, and the host's memory shared by all.
  const double via_root = std::min({link, upstream / per_switch, f.cpu_memory_bytes_per_s / apps});
  switch (placement) {
    case DrxPlacement::kMultiAxl:
      b.movement_s = in / via_root + out / via_root + 2 * (2 * hop + oh);
      b.restructuring_s = HostRestructure(f, w, in, out, apps);
      break;
    case DrxPlacement::kIntegrated:
      b.movement_s = in / via_root + out / via_root + 2 * (2 * hop + oh);
      b.restructuring_s =
          (in + out) / (f.drx_memory_bytes_per_s * f.integrated_drx_scale / apps) + oh;
      break;
    case DrxPlacement::kStandalone: {
      const int per_card = std::min(apps, f.apps_per_standalone_card);
      const double rate = std::min({link, upstream / per_switch, card_link / per_card});
      b.movement_s = in / rate + out / rate + 2 * (3 * hop + oh);
      b.restructuring_s = (in + out) / (f.drx_memory_bytes_per_s / per_card) + oh;
      break;
    }
    case DrxPlacement::kBumpInTheWire:
      // Into the DRX through the card's multiplexer; out through it, the switch and the
      // consumer's multiplexer.
      b.movement_s = (in / link + mux + oh) + (out / link + 2 * mux + hop + oh);
      b.restructuring_s = (in + out) / f.drx_memory_bytes_per_s + oh;
      break;
    case DrxPlacement::kPcieIntegrated:
      // One DMA from producer to consumer, restructured in the switch as it passes (the switch's
      // DRX runs at the rate of its ports): the slower of the two links' transfers, one stage.
      b.movement_s = std::max(in, out) / link + hop + oh;
      b.restructuring_s = (in + out) / f.drx_memory_bytes_per_s - std::max(in, out) / link;
      b.restructuring_s = std::max(0.0, b.restructuring_s);  // what the wire does not hide
      break;
  }
  return b;
}

absl::StatusOr<DrxCollectiveTimes> DrxBroadcast(const DrxFabric& f, const DrxWorkload& w,
                                                int accelerators) {
  if (absl::Status s = Validate(f, w, accelerators, "accelerators"); !s.ok()) return s;
  if (accelerators < 2) return absl::InvalidArgumentError("a broadcast needs >= 2 accelerators");
  const double link = PcieBytesPerSecond(f.pcie_generation, f.accelerator_lanes);
  const double upstream = PcieBytesPerSecond(f.pcie_generation, f.upstream_lanes);
  const double in = w.input_bytes, out = w.output_bytes;
  const double oh = f.stage_overhead_s, hop = f.switch_hop_s, mux = f.mux_hop_s;
  const double via_root = std::min(link, upstream);
  DrxCollectiveTimes t;
  // Multi-Axl: to the host, restructured there, then per destination a host copy into the DMA
  // buffer and a DMA, one after another.
  t.multi_axl_s = in / via_root + 2 * hop + oh + HostRestructure(f, w, in, out, 1);
  for (int d = 1; d < accelerators; ++d) {
    t.multi_axl_s += out / f.cpu_copy_bytes_per_s + out / via_root + 2 * hop + oh;
  }
  // Fianchetto: the source's DRX restructures once and sends back to back, restructuring and
  // sending in parallel (the seed's words): the longer of the two, once the first tile is out. A
  // destination under another switch is reached through the root complex.
  double sends = 0;
  for (int d = 1; d < accelerators; ++d) {
    const bool same_switch = d < f.accelerators_per_switch;
    sends += same_switch ? out / link + 2 * mux + hop + oh
                         : out / std::min(link, upstream) + 2 * mux + 3 * hop + oh;
  }
  t.fianchetto_s =
      in / link + mux + oh + std::max((in + out) / f.drx_memory_bytes_per_s + oh, sends);
  return t;
}

absl::StatusOr<DrxCollectiveTimes> DrxAllReduce(const DrxFabric& f, const DrxWorkload& w,
                                                int accelerators) {
  if (absl::Status s = Validate(f, w, accelerators, "accelerators"); !s.ok()) return s;
  if (accelerators < 2) return absl::InvalidArgumentError("an all-reduce needs >= 2 accelerators");
  const int n = accelerators;
  const double link = PcieBytesPerSecond(f.pcie_generation, f.accelerator_lanes);
  const double upstream = PcieBytesPerSecond(f.pcie_generation, f.upstream_lanes);
  const double in = w.input_bytes, out = w.output_bytes;
  const double oh = f.stage_overhead_s, hop = f.switch_hop_s, mux = f.mux_hop_s;
  const int per_switch = std::min(n, f.accelerators_per_switch);
  DrxCollectiveTimes t;
  // Multi-Axl: every input to the host at once (a switch's inputs share its upstream link), the
  // host sums them at its memory bandwidth and restructures the sum, then one DMA per
  // destination, one after another.
  t.multi_axl_s = in / std::min(link, upstream / per_switch) + 2 * hop + oh +
                  (n + 1) * in / f.cpu_memory_bytes_per_s + HostRestructure(f, w, in, out, 1);
  for (int d = 0; d < n; ++d) {
    t.multi_axl_s += out / f.cpu_copy_bytes_per_s + out / std::min(link, upstream) + 2 * hop + oh;
  }
  // Fianchetto: each DRX restructures its own input, then a ring reduce-scatter and all-gather
  // of 2(n-1) steps of out/n bytes between DRXs; every step waits for the ring's slowest edge,
  // which crosses the root complex (two upstream links, three hops) once the ring spans switches.
  const bool spans = n > f.accelerators_per_switch;
  const double edge_rate = spans ? std::min(link, upstream) : link;
  const double edge_latency = 2 * mux + (spans ? 3 : 1) * hop;
  const double block = out / n;
  const double reduce = 3 * block / f.drx_memory_bytes_per_s;  // two blocks read, one written
  t.fianchetto_s = in / link + mux + oh + (in + out) / f.drx_memory_bytes_per_s + oh;
  t.fianchetto_s += (n - 1) * (block / edge_rate + edge_latency + oh + reduce);  // reduce-scatter
  t.fianchetto_s += (n - 1) * (block / edge_rate + edge_latency + oh);           // all-gather
  return t;
}

}  // namespace plexus::netmodel
