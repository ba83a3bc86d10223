// Communicators on a device the caller made: 2 ranks as threads over inproc and tcp (127.0.0.1),
// both progress modes, through a Device subclass defined here (outside the transport library)
// that counts the calls it forwards to a real device, as a multipath adapter would.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "ranks.hpp"
#include "support/loopback.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

namespace {

// Forwards every call to `inner` and counts Listen and Connect.
class CountingDevice : public pt::Device {
 public:
  explicit CountingDevice(std::shared_ptr<pt::Device> inner)
      : pt::Device(inner->options()), inner_(std::move(inner)) {}

  pt::Backend backend() const override { return inner_->backend(); }
  absl::StatusOr<std::unique_ptr<pt::MemoryRegion>> Register(void* data, size_t bytes,
                                                             pt::MemoryKind kind) override {
    return inner_->Register(data, bytes, kind);
  }
  absl::StatusOr<std::unique_ptr<pt::Listener>> Listen(std::string_view address) override {
    listens_.fetch_add(1);
    return inner_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<pt::Connection>> Connect(std::string_view address,
                                                          pt::CompletionQueue* cq) override {
    connects_.fetch_add(1);
    return inner_->Connect(address, cq);
  }
  void Wake() override { inner_->Wake(); }

  int listens() const { return listens_.load(); }
  int connects() const { return connects_.load(); }

 protected:
  // Caller-mode progress (Device::Progress calls this only in kCaller mode).
  void DriveProgress(absl::Duration max_block) override { inner_->Progress(max_block); }

 private:
  std::shared_ptr<pt::Device> inner_;
  std::atomic<int> listens_{0};
  std::atomic<int> connects_{0};
};

struct Case {
  pt::Backend backend;
  pt::ProgressMode progress;
};

// What one rank saw; checked in the main thread.
struct RankResult {
  std::string error;
  int listens_after_create = 0;
  int connects_after_create = 0;
  int listens_after_split = 0;
  int connects_after_split = 0;
  long uses_while_alive = 0;  // device use_count with parent and child alive
  long uses_after = 0;        // after both were destroyed
  pt::Backend reported_backend = pt::Backend::kVerbs;
  pt::ProgressMode reported_progress = pt::ProgressMode::kThread;
};

RankResult RunRank(int rank, const std::shared_ptr<pt::Store>& store, Case c) {
  RankResult out;
  auto rdv = pt::Rendezvous::Create(rank, 2, store);
  if (!rdv.ok()) {
    out.error = "rendezvous: " + std::string(rdv.status().message());
    return out;
  }
  pt::DeviceOptions device_options;
  device_options.backend = c.backend;
  device_options.progress = c.progress;
  if (c.backend == pt::Backend::kTcp) device_options.local_address = "127.0.0.1";
  device_options.op_timeout = absl::Seconds(20);
  auto inner = pt::Device::Create(device_options);
  if (!inner.ok()) {
    out.error = "device: " + std::string(inner.status().message());
    return out;
  }
  auto device = std::make_shared<CountingDevice>(*inner);
  pc::CommunicatorOptions options;
  // Ignored with an explicit device (the device's backend and progress mode apply).
  options.device.backend = pt::Backend::kShm;
  options.device.progress = c.progress == pt::ProgressMode::kCaller ? pt::ProgressMode::kThread
                                                                    : pt::ProgressMode::kCaller;
  options.timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(20);
  {
    auto comm = pc::Communicator::Create(*rdv, device, options);
    if (!comm.ok()) {
      out.error = "create: " + std::string(comm.status().message());
      return out;
    }
    out.listens_after_create = device->listens();
    out.connects_after_create = device->connects();
    out.reported_backend = (*comm)->options().device.backend;
    out.reported_progress = (*comm)->options().device.progress;
    // A vector large enough for several chunks and both the mailbox and plan paths.
    for (size_t count : {size_t{3}, size_t{100000}}) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i) * (rank + 1);
      absl::Status s =
          (*comm)->AllReduce(v.data(), v.data(), count, pc::DataType::kI32, pc::ReduceOp::kSum);
      if (!s.ok()) {
        out.error = "allreduce: " + std::string(s.message());
        return out;
      }
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != static_cast<int32_t>(i) * 3) {
          out.error = "allreduce: element " + std::to_string(i) + " is " + std::to_string(v[i]);
          return out;
        }
      }
    }
    auto child = (*comm)->Split(0, -rank);  // reversed ranks
    if (!child.ok() || *child == nullptr) {
      out.error = "split: " + std::string(child.status().message());
      return out;
    }
    out.listens_after_split = device->listens();
    out.connects_after_split = device->connects();
    int64_t mine = 10 + (*child)->rank();
    int64_t sum = 0;
    absl::Status s = (*child)->AllReduce(&mine, &sum, 1, pc::DataType::kI64, pc::ReduceOp::kSum);
    if (!s.ok() || sum != 21) {
      out.error = "child allreduce: " + std::string(s.message()) + " sum " + std::to_string(sum);
      return out;
    }
    if ((*child)->rank() != 1 - rank) {
      out.error = "child rank " + std::to_string((*child)->rank());
      return out;
    }
    out.uses_while_alive = device.use_count();
  }
  out.uses_after = device.use_count();
  return out;
}

}  // namespace

TEST_CASE("a communicator runs on the caller's device, Split children too",
          "[collectives][device]") {
  const Case c = GENERATE(Case{pt::Backend::kInproc, pt::ProgressMode::kCaller},
                          Case{pt::Backend::kInproc, pt::ProgressMode::kThread},
                          Case{pt::Backend::kTcp, pt::ProgressMode::kCaller},
                          Case{pt::Backend::kTcp, pt::ProgressMode::kThread});
  INFO("backend " << pt::BackendName(c.backend) << ", progress "
                  << (c.progress == pt::ProgressMode::kCaller ? "caller" : "thread"));
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  std::vector<RankResult> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { results[r] = RunRank(r, loopback.store, c); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const RankResult& res = results[r];
    REQUIRE(res.error == "");
    // The default tcp communicator has 2 channels, others 1: one listener per channel, and the
    // higher rank of the pair connects once per channel.
    const int channels = c.backend == pt::Backend::kTcp ? 2 : 1;
    CHECK(res.listens_after_create == channels);
    CHECK(res.connects_after_create == (r == 1 ? channels : 0));
    // The child connected over the same device (ranks reversed: the other rank connects).
    CHECK(res.listens_after_split == 2 * channels);
    CHECK(res.connects_after_split == channels);
    CHECK(res.reported_backend == c.backend);
    CHECK(res.reported_progress == c.progress);
    // This test's reference, the parent's and the child's.
    CHECK(res.uses_while_alive == 3);
    CHECK(res.uses_after == 1);
  }
}

TEST_CASE("options().device reports the device a communicator made", "[collectives][device]") {
  pc::CommunicatorOptions options;
  options.device.backend = pt::Backend::kInproc;
  options.device.max_held_bytes_per_connection = size_t{3} << 20;
  options.timeout = absl::Seconds(7);
  options.connect_timeout = absl::Seconds(9);
  auto results = pc::testing::RunRanks(2, options, [](int, pc::Communicator& comm) {
    const pt::DeviceOptions& d = comm.options().device;
    if (d.backend != pt::Backend::kInproc) return std::string("backend");
    if (d.progress != pt::ProgressMode::kCaller) return std::string("progress (default kCaller)");
    if (d.max_held_bytes_per_connection != (size_t{3} << 20)) return std::string("held bytes");
    // The communicator's timeouts are the device's.
    if (d.op_timeout != absl::Seconds(7)) return std::string("op_timeout");
    if (d.connect_timeout != absl::Seconds(9)) return std::string("connect_timeout");
    int32_t v = 1, sum = 0;
    absl::Status s = comm.AllReduce(&v, &sum, 1, pc::DataType::kI32, pc::ReduceOp::kSum);
    return s.ok() && sum == 2 ? std::string() : "allreduce " + std::string(s.message());
  });
  for (const std::string& r : results) CHECK(r == "");
}

TEST_CASE("a null device is refused", "[collectives][device]") {
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  auto rdv = pt::Rendezvous::Create(0, 1, loopback.store);
  REQUIRE(rdv.ok());
  auto comm = pc::Communicator::Create(*rdv, std::shared_ptr<pt::Device>(), {});
  REQUIRE(absl::IsInvalidArgument(comm.status()));
  CHECK(std::string(comm.status().message()).find("device is null") != std::string::npos);
}
