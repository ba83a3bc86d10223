// Fianchetto's placement study as an analytic model (seed 003 §3.3 and §3.7.2): where a data
// restructuring accelerator (DRX) sits on a PCIe fabric, and what that does to the end-to-end
// latency of cross-domain pipelines (kernel 1 on one accelerator, data motion, kernel 2 on the
// next) when several run at once, against the CPU restructuring between accelerators
// ("Multi-Axl"). Also the seed's one-to-many and many-to-one study (broadcast and all-reduce
// across 4-32 accelerators).
//
// The fabric: accelerators hang off PCIe switches (`accelerators_per_switch` each), switches off
// the CPU's root complex by one upstream link each. Every application uses two accelerators under
// one switch; applications fill switches in order. All applications run one request at once, so
// a resource that k of them use gives each 1/k of its capacity (bandwidth, restructuring
// throughput, CPU cores) for the whole motion phase. Data moves store-and-forward between
// stages (a DMA completes, an interrupt reaches the driver, the next stage starts), as the seed's
// flow does; every DMA and every restructuring pays `stage_overhead_s` of software and every
// switch it crosses `switch_hop_s`.
//
// The data paths (A1 the producer, A2 the consumer, under switch S):
//   Multi-Axl        A1 -> S -> root -> host memory; CPU restructures; host -> root -> S -> A2
//   Integrated       the same path, restructured by one DRX on the CPU die (all applications)
//   Standalone       A1 -> S -> root -> a DRX card at a root port; card -> root -> S -> A2
//                    (one card per `apps_per_standalone_card` applications, each on its own link)
//   Bump-in-the-Wire A1 -> its DRX through the card's multiplexer (no switch); DRX -> S -> A2
//   PCIe-Integrated  A1 -> S, restructured in S at line rate; S -> A2 (saves the mux round trip)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace plexus::netmodel {

enum class DrxPlacement { kMultiAxl, kIntegrated, kStandalone, kBumpInTheWire, kPcieIntegrated };
inline constexpr DrxPlacement kDrxPlacements[] = {
    DrxPlacement::kMultiAxl, DrxPlacement::kIntegrated, DrxPlacement::kStandalone,
    DrxPlacement::kBumpInTheWire, DrxPlacement::kPcieIntegrated};
// "multi-axl", "integrated", "standalone", "bump-in-the-wire", "pcie-integrated".
std::string_view DrxPlacementName(DrxPlacement placement);

// Bytes per second of one direction of a PCIe link: 8 GT/s per lane at gen 3, doubling per
// generation; 128b/130b encoding through gen 5, FLIT mode (242/256) from gen 6.
double PcieBytesPerSecond(int generation, int lanes);

struct DrxFabric {
  int pcie_generation = 4;
  int accelerator_lanes = 16;  // accelerator (or BitW card) <-> switch
  int upstream_lanes = 8;      // switch <-> root complex, shared by the switch's accelerators
  int standalone_lanes = 16;   // a standalone DRX card <-> its root port
  int accelerators_per_switch = 8;
  double switch_hop_s = 110e-9;  // port to port, the seed's "110 ns or more"
  double mux_hop_s = 50e-9;      // BitW's internal multiplexer
  // Interrupt, driver and DMA set-up per stage: the seed's software overheads (not given as a
  // figure; 5 us is a typical interrupt-to-DMA-start time).
  double stage_overhead_s = 5e-6;
  // The host: cores that restructure (the seed's Xeon Platinum 8260L has 24) and the memory
  // bandwidth they share (six DDR4-2933 channels, ~140 GB/s).
  int cpu_cores = 24;
  double cpu_memory_bytes_per_s = 140e9;
  // Cores one application's restructuring keeps busy (a choice: streaming kernels stop scaling
  // at a few cores of one socket); applications beyond cpu_cores / this share the cores.
  int cpu_parallelism_per_app = 4;
  // A host copy into a destination's DMA buffer (one core's memcpy), per destination of a
  // broadcast or all-reduce through the host.
  double cpu_copy_bytes_per_s = 5e9;
  // One DRX: 128 lanes at 1 GHz behind one DDR4-3200 channel (25.6 GB/s), which bounds it: a
  // restructuring reads and writes each byte once.
  double drx_memory_bytes_per_s = 25.6e9;
  // The integrated DRX shares the CPU's power budget; this scales its throughput (a choice: the
  // seed reports it 3 % behind one standalone card at one application without the figure).
  double integrated_drx_scale = 0.9;
  int apps_per_standalone_card = 4;
};

// One cross-domain pipeline (seed Table 3.1): the bytes kernel 1 produces and kernel 2 takes,
// what restructuring costs on one CPU core, and the kernels' times on their accelerators.
struct DrxWorkload {
  std::string name;
  double input_bytes = 0;   // kernel 1's output
  double output_bytes = 0;  // kernel 2's input
  // Seconds per byte of input restructured by one CPU core (memory traffic is counted apart,
  // against the shared memory bandwidth).
  double cpu_seconds_per_byte = 0;
  double kernel1_s = 0;
  double kernel2_s = 0;
};

// The five pipelines at the table's input shapes; restructuring costs per core from the
// element-wise operations each one runs, and kernel times set so that restructuring is the share
// of the one-application Multi-Axl latency the seed reports on average (docs/netmodel.md says
// which figures are inputs and which are the model's outputs).
std::vector<DrxWorkload> FianchettoWorkloads();

struct DrxBreakdown {
  double kernels_s = 0;
  double restructuring_s = 0;
  double movement_s = 0;  // DMA transfers, hops and software overheads
  double total_s() const { return kernels_s + restructuring_s + movement_s; }
  double restructuring_share() const { return restructuring_s / total_s(); }
};

// The latency of one request of `workload` when `apps` applications (each its own pair of
// accelerators) run it at once under `placement`. InvalidArgument names a field out of range.
absl::StatusOr<DrxBreakdown> DrxLatency(const DrxFabric& fabric, const DrxWorkload& workload,
                                        DrxPlacement placement, int apps);

// One-to-many and many-to-one across `accelerators` (seed §3.7.3): the time of a broadcast of a
// restructured `bytes` buffer from one accelerator to all others, and of an all-reduce of
// `bytes` per accelerator; Multi-Axl through the host (restructure and reduce on the CPU, one DMA
// after another), Fianchetto with a DRX per accelerator (the source DRX sends back to back; the
// all-reduce is a ring reduce-scatter and all-gather between DRXs, whose ring crosses the root
// complex once the accelerators span more than one switch).
struct DrxCollectiveTimes {
  double multi_axl_s = 0;
  double fianchetto_s = 0;
  double speedup() const { return multi_axl_s / fianchetto_s; }
};
absl::StatusOr<DrxCollectiveTimes> DrxBroadcast(const DrxFabric& fabric,
                                                const DrxWorkload& workload, int accelerators);
absl::StatusOr<DrxCollectiveTimes> DrxAllReduce(const DrxFabric& fabric,
                                                const DrxWorkload& workload, int accelerators);

}  // namespace plexus::netmodel
