// The two workloads of Aurelia's evaluation (seed 003, ch. 4.4) as transfers for the CXL
// simulator (plexus/netmodel/cxl_sim.hpp), scaled to run in seconds:
//  - LLM inference (LLaMA2 70B, 4.4.2): 8 accelerators and 8 memory expanders; a run is a weight
//    load, an all-reduce, a weight load and an all-reduce, each phase 3 ms of compute after the
//    previous one;
//  - YCSB A, B, C and F (4.4.3): 4 CPUs and 12 memory expanders, Zipf-distributed keys, reads,
//    updates (with the memory expander's invalidations of the other CPUs' copies) and
//    read-modify-writes.
// Scaling: bytes and compute gaps are divided by one factor, so that communication and compute
// keep the seed's proportion (one all-reduce is 810 x 8 MB, ~25 M flits, unscaled).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/cxl_fabric.hpp"
#include "plexus/netmodel/cxl_sim.hpp"

namespace plexus::netmodel::cxl {

struct LlmSpec {
  int runs = 4;                  // the seed's 1,000
  double scale = 16384;          // divides every byte count and the compute gap
  int64_t unit_bytes = 8 << 20;  // the seed's "810 x 8 MB" all-reduce
  int units = 810;
  double partition_bytes = 8.125e9;  // the weights an accelerator loads per weight load
  double compute_gap_ns = 3e6;       // between phases
  // How "spaced 3 ms apart" is read. false: each phase starts compute_gap_ns after the previous
  // one ends (a barrier). true: the phases of a run start compute_gap_ns apart whether or not the
  // previous one ended, so weight loads and all-reduces overlap (a phase of the seed's sizes
  // lasts far longer than 3 ms); a run still starts when the previous one ended.
  bool overlap_phases = false;
};

// Accelerators at x:y:2, memory expanders at x:y:3 (one of each per edge switch; the seed does
// not give the placement). A weight load: every accelerator reads its partition striped over
// the 8 expanders (M2S reads, data back as DRS). An all-reduce: a ring over the accelerators in
// FAN-ID order, 2 x (8 - 1) steps of bytes / 8 each as unordered-I/O writes to the next
// accelerator, step s of accelerator i waiting for its own step s - 1 and its predecessor's.
struct LlmWorkload {
  std::vector<Transfer> transfers;
  std::vector<int> run_end;  // per run: one past its last transfer
};
absl::StatusOr<LlmWorkload> LlmInference(const Fabric& fabric, const LlmSpec& spec);
// Per run: the time from the previous run's end (0 for the first) to its last transfer's end.
std::vector<double> LlmRunTimes(const LlmWorkload& w, const SimResult& r);

enum class Ycsb : uint8_t { kA, kB, kC, kF };
std::string_view YcsbName(Ycsb w);
absl::StatusOr<Ycsb> ParseYcsb(std::string_view name);

struct YcsbSpec {
  Ycsb workload = Ycsb::kA;
  int ops_per_cpu = 2000;
  int keys = 10000;
  double zipf_theta = 0.99;          // YCSB's default
  int64_t record_bytes = 1024;       // YCSB's default record: 10 fields of 100 B
  double mean_interarrival_ns = 40;  // per CPU, exponential (open loop)
  double memory_bytes_per_s = 64e9;  // an expander's DRAM (SimOptions::device_rates)
  uint64_t seed = 1;
};

// CPUs at p:0:2 (one per pod), memory expanders on the other 12 devices; key k lives on
// expander k mod 12. A: 50% reads, 50% updates; B: 95% / 5%; C: reads only; F: 50% reads, 50%
// read-modify-writes (a read, then the write). An update (or the write of a read-modify-write)
// makes the expander invalidate the record in the other 3 CPUs: a 64 B write to each, after
// the update.
struct YcsbWorkload {
  std::vector<Transfer> transfers;
  struct OpRecord {
    double start_ns = 0;
    int last = 0;  // the transfer whose end ends the operation
    bool write = false;
  };
  std::vector<OpRecord> ops;
  std::vector<std::pair<FanId, double>> device_rates;  // the expanders' processing rate
  int invalidations = 0;
};
absl::StatusOr<YcsbWorkload> YcsbWorkloadFor(const Fabric& fabric, const YcsbSpec& spec);
// Per operation: the end of its last transfer minus its start.
std::vector<double> YcsbLatencies(const YcsbWorkload& w, const SimResult& r);

}  // namespace plexus::netmodel::cxl
