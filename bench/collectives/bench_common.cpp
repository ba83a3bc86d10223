#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "plexus/base/env.hpp"
#include "plexus/tooling/cli.hpp"

namespace plexus::bench {
namespace {

// A byte count in base::ParseBytes's forms (8, 64K, 1MiB), at most 1 TiB (plenty for a buffer).
std::optional<size_t> ParseOneSize(const std::string& text) {
  const absl::StatusOr<uint64_t> value = base::ParseBytes(text, "size");
  if (!value.ok() || *value > (uint64_t{1} << 40)) return std::nullopt;
  return static_cast<size_t>(*value);
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

std::optional<std::vector<size_t>> ParseSizes(const std::string& text, size_t element_bytes,
                                              std::string* error) {
  std::set<size_t> sizes;
  for (const std::string& item : Split(text, ',')) {
    const size_t dots = item.find("..");
    std::vector<size_t> expanded;
    if (dots == std::string::npos) {
      const auto size = ParseOneSize(item);
      if (!size) {
        *error = fmt::format("bad size '{}' (expected e.g. 8, 64K, 1M or 1K..64M)", item);
        return std::nullopt;
      }
      expanded.push_back(*size);
    } else {
      std::string upper = item.substr(dots + 2);
      size_t factor = 2;
      const size_t x = upper.find('x');
      if (x != std::string::npos) {
        const auto f = ParseOneSize(upper.substr(x + 1));
        if (!f || *f < 2) {
          *error = fmt::format("bad factor in '{}' (expected A..BxF with F >= 2)", item);
          return std::nullopt;
        }
        factor = *f;
        upper = upper.substr(0, x);
      }
      const auto lo = ParseOneSize(item.substr(0, dots));
      const auto hi = ParseOneSize(upper);
      if (!lo || !hi || *lo == 0 || *lo > *hi) {
        *error = fmt::format("bad size range '{}' (expected A..B with 0 < A <= B)", item);
        return std::nullopt;
      }
      for (size_t s = *lo; s <= *hi; s *= factor) expanded.push_back(s);
    }
    for (size_t s : expanded) {
      const size_t rounded = s / element_bytes * element_bytes;
      if (rounded == 0) {
        *error = fmt::format("size {} is smaller than one element ({} bytes)", s, element_bytes);
        return std::nullopt;
      }
      sizes.insert(rounded);
    }
  }
  return std::vector<size_t>(sizes.begin(), sizes.end());
}

std::string FormatBytes(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) {
    return fmt::format("{}G", bytes >> 30);
  }
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    return fmt::format("{}M", bytes >> 20);
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{}K", bytes >> 10);
  return std::to_string(bytes);
}

int IterationsFor(size_t bytes, int fixed) {
  if (fixed > 0) return fixed;
  const size_t budget = size_t{256} << 20;
  return static_cast<int>(std::clamp<size_t>(budget / std::max<size_t>(bytes, 1), 5, 1000));
}

int WarmupFor(int iterations, int fixed_warmup) {
  if (fixed_warmup >= 0) return fixed_warmup;
  return std::max(2, iterations / 10);
}

float InputValue(int rank, size_t i) { return static_cast<float>((i * 7 + rank * 3) % 17); }

float ExpectedSum(int world_size, size_t i) {
  uint64_t sum = 0;
  for (int r = 0; r < world_size; ++r) sum += (i * 7 + r * 3) % 17;
  return static_cast<float>(sum);
}

void FillInput(float* data, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) data[i] = InputValue(rank, i);
}

size_t CountWrong(const float* result, size_t count, int world_size) {
  // The expected sum depends on i only through i % 17.
  float expected[17];
  for (size_t k = 0; k < 17; ++k) expected[k] = ExpectedSum(world_size, k);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += result[i] != expected[i % 17];
  return wrong;
}

const std::vector<Op>& AllOps() {
  static const std::vector<Op> ops = {Op::kAllreduce, Op::kReduce,        Op::kBroadcast,
                                      Op::kAllgather, Op::kReduceScatter, Op::kAlltoall};
  return ops;
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kAllreduce:
      return "allreduce";
    case Op::kReduce:
      return "reduce";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllgather:
      return "allgather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAlltoall:
      return "alltoall";
  }
  return "?";
}

std::optional<std::vector<Op>> ParseOps(const std::string& text, std::string* error) {
  std::vector<Op> ops;
  for (const std::string& item : Split(text, ',')) {
    if (item == "all") {
      ops = AllOps();
      continue;
    }
    const auto it =
        std::find_if(AllOps().begin(), AllOps().end(), [&](Op op) { return OpName(op) == item; });
    if (it == AllOps().end()) {
      *error = fmt::format(
          "unknown operation '{}' (expected allreduce, reduce, broadcast, allgather, "
          "reduce_scatter, alltoall or all)",
          item);
      return std::nullopt;
    }
    if (std::find(ops.begin(), ops.end(), *it) == ops.end()) ops.push_back(*it);
  }
  // In AllOps' order, whatever the order given.
  std::vector<Op> ordered;
  for (Op op : AllOps()) {
    if (std::find(ops.begin(), ops.end(), op) != ops.end()) ordered.push_back(op);
  }
  return ordered;
}

double BusFactor(Op op, int nprocs) {
  if (nprocs <= 1) return 1.0;
  const double n = nprocs;
  switch (op) {
    case Op::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Op::kReduce:
    case Op::kBroadcast:
      return 1.0;
    case Op::kAllgather:
    case Op::kReduceScatter:
    case Op::kAlltoall:
      return (n - 1) / n;
  }
  return 1.0;
}

OpShape ShapeFor(Op op, size_t bytes, int world_size) {
  const size_t elements = bytes / sizeof(float);
  const size_t n = static_cast<size_t>(std::max(world_size, 1));
  OpShape shape;
  switch (op) {
    case Op::kAllreduce:
    case Op::kReduce:
    case Op::kBroadcast:
      shape.count = shape.send_count = shape.recv_count = std::max<size_t>(elements, 1);
      shape.bytes = shape.count * sizeof(float);
      return shape;
    case Op::kAllgather:
      shape.count = std::max<size_t>(elements / n, 1);
      shape.send_count = shape.count;
      shape.recv_count = shape.count * n;
      break;
    case Op::kReduceScatter:
      shape.count = std::max<size_t>(elements / n, 1);
      shape.send_count = shape.count * n;
      shape.recv_count = shape.count;
      break;
    case Op::kAlltoall:
      shape.count = std::max<size_t>(elements / n, 1);
      shape.send_count = shape.recv_count = shape.count * n;
      break;
  }
  shape.bytes = shape.count * n * sizeof(float);
  return shape;
}

void OpBuffers::Prepare(Op op, size_t bytes, int rank, int world_size) {
  op_ = op;
  shape_ = ShapeFor(op, bytes, world_size);
  rank_ = rank;
  world_size_ = world_size;
  send_.assign(shape_.send_count, 0.0f);
  recv_.assign(shape_.recv_count, 0.0f);
  Refill();
}

void OpBuffers::Refill() {
  FillInput(send_.data(), send_.size(), rank_);
  if (op_ == Op::kBroadcast && rank_ == 0) {
    FillInput(recv_.data(), recv_.size(), rank_);
  } else {
    std::fill(recv_.begin(), recv_.end(), -1.0f);
  }
}

size_t OpBuffers::CountWrong() const {
  const size_t c = shape_.count;
  size_t wrong = 0;
  switch (op_) {
    case Op::kAllreduce:
      return plexus::bench::CountWrong(recv_.data(), recv_.size(), world_size_);
    case Op::kReduce:  // the sum at the root; the others' output is not defined
      return rank_ != 0 ? 0 : plexus::bench::CountWrong(recv_.data(), recv_.size(), world_size_);
    case Op::kBroadcast:
      for (size_t i = 0; i < recv_.size(); ++i) wrong += recv_[i] != InputValue(0, i);
      return wrong;
    case Op::kAllgather:
      for (size_t i = 0; i < recv_.size(); ++i) {
        wrong += recv_[i] != InputValue(static_cast<int>(i / c), i % c);
      }
      return wrong;
    case Op::kReduceScatter:
      for (size_t i = 0; i < c; ++i) {
        wrong += recv_[i] != ExpectedSum(world_size_, static_cast<size_t>(rank_) * c + i);
      }
      return wrong;
    case Op::kAlltoall:
      // Block r came from rank r's block for this rank.
      for (size_t i = 0; i < recv_.size(); ++i) {
        wrong +=
            recv_[i] != InputValue(static_cast<int>(i / c), static_cast<size_t>(rank_) * c + i % c);
      }
      return wrong;
  }
  return recv_.size();
}

size_t CollectiveUnderTest::RunAndCheck(OpBuffers& buffers) {
  buffers.Refill();
  Run();
  return buffers.CountWrong();
}

WorkerOptions ParseWorkerOptions(int argc, char** argv, const char* program) {
  WorkerOptions o;
  std::string sizes = "8,64K,256K,1M,4M,16M,64M";
  tooling::Tool tool(program, "One rank of plexus-bench-collectives (started by the driver).");
  CLI::App& app = tool.app();
  app.add_option("--sizes", sizes, "bytes, e.g. 8,64K,1M; A..B doubles, A..BxF multiplies by F")
      ->capture_default_str();
  std::string ops = "allreduce";
  app.add_option("--ops", ops,
                 "allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, all")
      ->capture_default_str();
  tooling::AddNumber(&app, "--iters", &o.iters, "timed calls per size (0: ~256 MiB per size)", 1,
                     1000000);
  tooling::AddNumber(&app, "--warmup", &o.warmup, "untimed calls first (-1: iters/10, >= 2)", 0,
                     1000000);
  app.add_option("--algorithm", o.algorithm, "implementation specific algorithm");
  app.add_option("--transport", o.transport, "the transport named in the JSON lines");
  tooling::AddNumber(&app, "--channels", &o.channels, "CommunicatorOptions::channels", 0, 1000000);
  tooling::AddNumber(&app, "--sockets", &o.sockets,
                     "CommunicatorOptions::device.tcp.sockets_per_connection", 0, 1000000);
  app.add_option_function<std::string>(
         "--chunk-bytes",
         [&o](const std::string& text) {
           const auto bytes = ParseOneSize(text);
           if (!bytes) {
             throw CLI::ValidationError(
                 fmt::format("--chunk-bytes expects a size such as 512K, got '{}'", text));
           }
           o.chunk_bytes = *bytes;
         },
         "CommunicatorOptions::chunk_bytes (K/M/G suffixes)")
      ->type_name("BYTES");
  app.add_option("--loopback-cc", o.loopback_cc,
                 "CommunicatorOptions::device.tcp.loopback_congestion_control (system: the "
                 "system's)");
  app.add_option("--progress", o.progress, "CommunicatorOptions::device.progress")
      ->check(CLI::IsMember({"caller", "thread"}));
  app.add_flag("--trace", o.trace, "CommunicatorOptions::trace.enabled (Plexus only)");
  app.add_option("--reconfig-change", o.reconfig_change,
                 "--reconfig: ring_order, transport or channels")
      ->check(CLI::IsMember({"ring_order", "transport", "channels"}));
  if (auto code = tool.Parse(argc, argv)) std::exit(*code);
  std::string error;
  auto parsed = ParseSizes(sizes, sizeof(float), &error);
  if (!parsed) std::exit(tool.Usage("--sizes: " + error));
  o.sizes = std::move(*parsed);
  auto parsed_ops = ParseOps(ops, &error);
  if (!parsed_ops) std::exit(tool.Usage("--ops: " + error));
  o.ops = std::move(*parsed_ops);
  return o;
}

void MeasureOps(CollectiveUnderTest& impl, const WorkerOptions& options,
                const std::function<std::string(Op)>& impl_name) {
  using Clock = std::chrono::steady_clock;
  OpBuffers buffers;
  for (Op op : options.ops) {
    if (!impl.Supports(op)) continue;
    for (size_t requested : options.sizes) {
      buffers.Prepare(op, requested, impl.rank(), impl.world_size());
      const OpShape& shape = buffers.shape();
      const int iters = IterationsFor(shape.bytes, options.iters);
      const int warmup = WarmupFor(iters, options.warmup);
      impl.Prepare(buffers);
      for (int i = 0; i < warmup; ++i) impl.Run();
      impl.Barrier();
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) impl.Run();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const double time_us = impl.Max(seconds * 1e6 / iters);
      const double wrong = impl.Sum(static_cast<double>(impl.RunAndCheck(buffers)));
      if (impl.rank() != 0) continue;
      nlohmann::json j;
      j["impl"] = impl_name(op);
      j["transport"] = options.transport;
      j["nprocs"] = impl.world_size();
      j["op"] = OpName(op);
      j["bytes"] = shape.bytes;
      j["count"] = shape.count;
      j["dtype"] = "float";
      j["redop"] =
          op == Op::kAllreduce || op == Op::kReduce || op == Op::kReduceScatter ? "sum" : "none";
      j["iters"] = iters;
      j["time_us"] = time_us;
      j["wrong"] = static_cast<uint64_t>(wrong);
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace plexus::bench
