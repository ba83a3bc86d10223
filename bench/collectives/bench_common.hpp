// What every rank program of plexus-bench-collectives shares, whichever library it measures
// (Plexus, Gloo, Open MPI): the worker's command line, the sizes and iteration counts, the
// input pattern and its expected sum, and the measurement loop. A worker's rank 0 prints one
// JSON object per measured point on stdout; the driver (plexus-bench-collectives) collects them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace plexus::bench {

// "8,1K..64M": comma-separated sizes in bytes with K/M/G suffixes (powers of 1024); A..B expands
// to A, 2A, 4A, ... up to B, and A..BxF multiplies by F instead. Sizes are rounded down to a
// multiple of `element_bytes`; an error names the offending item. Result: sorted, unique.
std::optional<std::vector<size_t>> ParseSizes(const std::string& text, size_t element_bytes,
                                              std::string* error);
// "1K" for 1024, "64M" for 64 << 20, else the plain number.
std::string FormatBytes(size_t bytes);

// The measured iterations for one size: `fixed` when > 0, else enough iterations to move about
// 256 MiB per rank (between 5 and 1000), so that small sizes average over many calls and large
// sizes stay quick. Every rank computes the same value without communicating.
int IterationsFor(size_t bytes, int fixed);
int WarmupFor(int iterations, int fixed_warmup);

// Input of element i on `rank`: small integers, so that sums over any world size are exact in
// f32 whatever the summation order.
float InputValue(int rank, size_t i);
float ExpectedSum(int world_size, size_t i);
void FillInput(float* data, size_t count, int rank);
// Elements of `result` that differ from the sum over `world_size` ranks.
size_t CountWrong(const float* result, size_t count, int world_size);

// The command line of a worker (a rank program), shared by every implementation.
struct WorkerOptions {
  std::vector<size_t> sizes;
  int iters = 0;          // 0: IterationsFor's default
  int warmup = -1;        // -1: WarmupFor's default
  std::string algorithm;  // implementation specific ("ring", "ring_chunked", ...); may be empty
  std::string transport;  // as reported in the JSON ("tcp", "shm", ...)
  // Plexus tuning knobs passed through to CommunicatorOptions (0: library default); the peers
  // ignore them.
  int channels = 0;
  size_t chunk_bytes = 0;
  int sockets = 0;
  std::string progress;  // "caller", "thread" or empty (library default)
  bool trace = false;    // CommunicatorOptions::trace.enabled (in memory, nothing written)
};
// Parses --sizes, --iters, --warmup, --algorithm, --transport, --channels, --chunk-bytes,
// --sockets and --progress with the plexus::tooling conventions (strict numbers, --help); exits
// with code 2 and a message naming `program` on bad input, 0 after --help.
WorkerOptions ParseWorkerOptions(int argc, char** argv, const char* program);

// One implementation of allreduce (f32, sum) as seen by the measurement loop.
class AllreduceUnderTest {
 public:
  virtual ~AllreduceUnderTest() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Allocates and fills the buffers for `count` elements (collective: every rank calls it).
  virtual void Prepare(size_t count) = 0;
  // One allreduce of the prepared buffers, complete on return.
  virtual void Run() = 0;
  // Refills the input with FillInput, runs one allreduce and returns CountWrong of the result.
  virtual size_t RunAndCheck() = 0;
  virtual void Barrier() = 0;
  // Across ranks: the maximum and the sum of one double.
  virtual double Max(double value) = 0;
  virtual double Sum(double value) = 0;
};

// Measures every size of `options` with `impl` and, on rank 0, prints one JSON line per size:
// impl, transport, nprocs, op, bytes, count, dtype, iters, time_us (slowest rank's mean time per
// call), wrong (mismatches summed over ranks, from a checked call after the timed ones).
void MeasureAllreduce(AllreduceUnderTest& impl, const WorkerOptions& options,
                      const std::string& impl_name);

}  // namespace plexus::bench
