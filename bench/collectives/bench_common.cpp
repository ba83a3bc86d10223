#include "bench_common.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "plexus/tooling/cli.hpp"

namespace plexus::bench {
namespace {

std::optional<size_t> ParseOneSize(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || text[0] == '-') return std::nullopt;
  unsigned shift = 0;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    return std::nullopt;
  }
  if (value > (uint64_t{1} << 40) >> shift) return std::nullopt;  // 1 TiB is plenty
  return static_cast<size_t>(value << shift);
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

WorkerOptions ParseWorkerOptions(int argc, char** argv, const char* program) {
  WorkerOptions o;
  std::string sizes = "8,1K..64M";
  tooling::Tool tool(program, "One rank of plexus-bench-collectives (started by the driver).");
  CLI::App& app = tool.app();
  app.add_option("--sizes", sizes, "bytes: 8,1K..64M; A..B doubles, A..BxF multiplies by F")
      ->capture_default_str();
  tooling::AddNumber(&app, "--iters", &o.iters, "timed calls per size (0: ~256 MiB per size)", 1,
                     1000000);
  tooling::AddNumber(&app, "--warmup", &o.warmup, "untimed calls first (-1: iters/10, >= 2)", 0,
                     1000000);
  app.add_option("--algorithm", o.algorithm, "implementation specific algorithm");
  app.add_option("--transport", o.transport, "the transport named in the JSON lines");
  tooling::AddNumber(&app, "--channels", &o.channels, "CommunicatorOptions::channels", 0, 1000000);
  tooling::AddNumber(&app, "--sockets", &o.sockets,
                     "CommunicatorOptions::device.sockets_per_connection", 0, 1000000);
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
  app.add_option("--progress", o.progress, "CommunicatorOptions::device.progress")
      ->check(CLI::IsMember({"caller", "thread"}));
  app.add_flag("--trace", o.trace, "CommunicatorOptions::trace.enabled (Plexus only)");
  if (auto code = tool.Parse(argc, argv)) std::exit(*code);
  std::string error;
  auto parsed = ParseSizes(sizes, sizeof(float), &error);
  if (!parsed) std::exit(tool.Usage("--sizes: " + error));
  o.sizes = std::move(*parsed);
  return o;
}

void MeasureAllreduce(AllreduceUnderTest& impl, const WorkerOptions& options,
                      const std::string& impl_name) {
  using Clock = std::chrono::steady_clock;
  for (size_t bytes : options.sizes) {
    const size_t count = bytes / sizeof(float);
    const int iters = IterationsFor(bytes, options.iters);
    const int warmup = WarmupFor(iters, options.warmup);
    impl.Prepare(count);
    for (int i = 0; i < warmup; ++i) impl.Run();
    impl.Barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) impl.Run();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double time_us = impl.Max(seconds * 1e6 / iters);
    const double wrong = impl.Sum(static_cast<double>(impl.RunAndCheck()));
    if (impl.rank() != 0) continue;
    nlohmann::json j;
    j["impl"] = impl_name;
    j["transport"] = options.transport;
    j["nprocs"] = impl.world_size();
    j["op"] = "allreduce";
    j["bytes"] = bytes;
    j["count"] = count;
    j["dtype"] = "float";
    j["redop"] = "sum";
    j["iters"] = iters;
    j["time_us"] = time_us;
    j["wrong"] = static_cast<uint64_t>(wrong);
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

}  // namespace plexus::bench
