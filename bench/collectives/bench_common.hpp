// What every rank program of plexus-bench-collectives shares, whichever library it measures
// (Plexus, Gloo, Open MPI): the worker's command line, the sizes and iteration counts, the
// operations and their buffer shapes, the input pattern and the expected results, and the
// measurement loop. A worker's rank 0 prints one
// JSON object per measured point on stdout; the driver (plexus-bench-collectives) collects them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "order.hpp"

namespace plexus::bench {

// "8,64K,256K,1M": comma-separated sizes in bytes with K/M/G suffixes (powers of 1024); A..B
// expands to A, 2A, 4A, ... up to B, and A..BxF multiplies by F instead. Sizes are rounded down to
// a multiple of `element_bytes`; an error names the offending item. Result: sorted, unique.
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

// The measured operations (f32; sum where there is a reduction). Sizes follow nccl-tests: the
// size of a point is the whole buffer of one rank that the operation is about (allreduce,
// broadcast: the buffer; allgather: the gathered output; reduce-scatter: the input of every
// rank's blocks; alltoall: the send buffer), and busbw = algbw * BusFactor(op, n).
enum class Op { kAllreduce, kReduce, kBroadcast, kAllgather, kReduceScatter, kAlltoall };
const std::vector<Op>& AllOps();
std::string_view OpName(
    Op op);  // "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall"
// "allreduce", "allgather,alltoall" or "all"; an error names the offending item.
std::optional<std::vector<Op>> ParseOps(const std::string& text, std::string* error);
// nccl-tests' bus bandwidth factors: allreduce 2(n-1)/n, broadcast 1, allgather,
// reduce-scatter and alltoall (n-1)/n; 1 for a single process.
double BusFactor(Op op, int nprocs);

// The buffers of one call for a requested size: `count` is the call's count argument (allgather,
// reduce-scatter, alltoall: per rank, at least 1), `bytes` the size actually measured.
struct OpShape {
  size_t count = 0;
  size_t send_count = 0;  // elements of the send buffer
  size_t recv_count = 0;  // elements of the receive buffer
  size_t bytes = 0;
};
OpShape ShapeFor(Op op, size_t bytes, int world_size);

// The send and receive buffers of one rank for one operation and size, with the input pattern
// and the check of the result. Broadcast runs in place in `recv` from root 0 (MPI_Bcast and
// Gloo have no other form), so its root's recv holds the pattern before each call.
class OpBuffers {
 public:
  void Prepare(Op op, size_t bytes, int rank, int world_size);
  // The input pattern into send (broadcast: root's recv), -1 into the other receive buffers.
  void Refill();
  // Elements of recv that differ from the operation's exact result on this rank.
  size_t CountWrong() const;

  Op op() const { return op_; }
  const OpShape& shape() const { return shape_; }
  float* send() { return send_.data(); }
  float* recv() { return recv_.data(); }

 private:
  Op op_ = Op::kAllreduce;
  OpShape shape_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<float> send_;
  std::vector<float> recv_;
};

// The command line of a worker (a rank program), shared by every implementation.
struct WorkerOptions {
  std::vector<size_t> sizes;
  std::vector<Op> ops = {Op::kAllreduce};
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
  // DeviceOptions::tcp.loopback_congestion_control: a name, "system" (the system's) or empty
  // (library default).
  std::string loopback_cc;
  bool trace = false;  // CommunicatorOptions::trace.enabled (in memory, nothing written)
  // --reconfig: what each round changes, "ring_order" (reversed / identity), "transport"
  // (the other of tcp and shm / back) or "channels" (twice the created count / back).
  std::string reconfig_change = "ring_order";
};
// Parses --sizes, --ops, --iters, --warmup, --algorithm, --transport, --channels,
// --chunk-bytes, --sockets and --progress with the plexus::tooling conventions (strict numbers,
// --help); exits with code 2 and a message naming `program` on bad input, 0 after --help.
WorkerOptions ParseWorkerOptions(int argc, char** argv, const char* program);

// One implementation of the operations as seen by the measurement loop.
class CollectiveUnderTest {
 public:
  virtual ~CollectiveUnderTest() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether this implementation has `op` (the loop skips the others).
  virtual bool Supports(Op op) const = 0;
  // Sets up calls of buffers.op() on `buffers` (prepared and filled; they outlive the calls).
  virtual void Prepare(OpBuffers& buffers) = 0;
  // One call of the prepared operation, complete on return.
  virtual void Run() = 0;
  // Refills the buffers, runs one call and returns CountWrong of the result (override when the
  // implementation needs more, e.g. Gloo's in-place allreduce).
  virtual size_t RunAndCheck(OpBuffers& buffers);
  virtual void Barrier() = 0;
  // Across ranks: the maximum and the sum of one double.
  virtual double Max(double value) = 0;
  virtual double Sum(double value) = 0;
};

// Measures every operation of `options` that `impl` supports at every size and, on rank 0,
// prints one JSON line per point: impl (impl_name(op)), transport, nprocs, op, bytes, count,
// dtype, iters, time_us (slowest rank's mean time per call), wrong (mismatches summed over
// ranks, from a checked call after the timed ones).
void MeasureOps(CollectiveUnderTest& impl, const WorkerOptions& options,
                const std::function<std::string(Op)>& impl_name);

}  // namespace plexus::bench
